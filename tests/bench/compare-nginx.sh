#!/usr/bin/env bash
# Benchmark: dedup-gateway against nginx as a plain reverse proxy, same machine, same
# upstream, same load generator. Not a test: numbers, for the README and issue notes.
#
#   tests/bench/compare-nginx.sh [--redis] [--duration 10s] [--connections 64]
#
# Upstream: nginx answering 200 from memory (so the proxies are what is measured).
# Baseline: nginx proxy_pass to it with upstream keepalive. Gateway: release build,
# memory store (or a local redis-server with --redis), one route keyed on json:/msgId.
# Load: wrk, POST bodies with a fresh msgId per request ("new"), and the same msgId
# every time ("duplicate", gateway only: nginx has no such path).
# Needs nginx, wrk (and redis-server for --redis) from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=10s
CONNECTIONS=64
THREADS=2
STORE=memory
while [ $# -gt 0 ]; do
  case $1 in
    --redis) STORE=redis ;;
    --duration) DURATION=$2; shift ;;
    --connections) CONNECTIONS=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install -y nginx-light wrk" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); NGX=$(free_port); GW=$(free_port); ADMIN=$(free_port)

mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<NGINX
worker_processes auto;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  upstream bot { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$UP;
    location / { return 200 '{"reply":"ok"}'; }
  }
  server {
    listen 127.0.0.1:$NGX;
    location / {
      proxy_pass http://bot;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
  }
}
NGINX
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" & pids+=($!)

store_toml='backend = "memory"'
if [ "$STORE" = redis ]; then
  REDIS=$(free_port)
  redis-server --port "$REDIS" --save "" --appendonly no --daemonize no --loglevel warning & pids+=($!)
  store_toml="backend = \"redis\"
url = \"redis://127.0.0.1:$REDIS/0\""
fi
cat >"$work/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$GW"
admin_listen = "127.0.0.1:$ADMIN"
[store]
$store_toml
[[routes]]
name = "bench"
path = "/hook"
upstream = "http://127.0.0.1:$UP"
key = ["json:/msgId"]
TOML

cargo build --release --locked --quiet
target/release/dedup-gateway --config "$work/gateway.toml" --log-level warn & pids+=($!)
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$ADMIN/readyz" 2>/dev/null && \
    curl -fsS -o /dev/null "http://127.0.0.1:$NGX/" 2>/dev/null && break
  sleep 0.1
done

run() { # name url script
  local out
  out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "tests/bench/$3" "$2")
  local rps p50 p99
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  local errors; errors=$(grep -E "Non-2xx|Socket errors" <<<"$out" || true)
  printf '%-34s %12s %10s %10s  %s\n' "$1" "$rps" "$p50" "$p99" "$errors"
}

echo "cores: $(nproc), wrk -t$THREADS -c$CONNECTIONS -d$DURATION, store: $STORE"
printf '%-34s %12s %10s %10s\n' "proxy / workload" "req/s" "p50" "p99"
run "nginx proxy_pass, new ids" "http://127.0.0.1:$NGX/hook" unique.lua
run "dedup-gateway, new ids" "http://127.0.0.1:$GW/hook" unique.lua
run "dedup-gateway, one id (duplicates)" "http://127.0.0.1:$GW/hook" duplicate.lua
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep -E '^dedup_requests_total\{route="bench",outcome="(forwarded|duplicate)"\}'
