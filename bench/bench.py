#!/usr/bin/env python3
"""dedup-gateway against nginx on the same machine: throughput, latency, CPU per request.

Run through bench/run (it checks the tools and builds the binaries, profile dist).
Contestants (every one in front of the same trivial upstream, an nginx answering 200
"success"):

  direct      wrk -> upstream (the ceiling)
  nginx       nginx as a plain reverse proxy (keepalive pool, 2 workers): the baseline
  hyper-bare  the leanest proxy hyper makes (bench/bare-proxy.rs: the gateway's runtime
              layout, no dedup, bodies streamed): what the HTTP engine alone costs,
              in the all-unique row
  nginx-lua   nginx + Lua + Redis dedup written the way users write it (bench/dedup.lua)
  gw-memory   dedup-gateway, embedded memory store
  gw-redis    dedup-gateway, Redis store (a local redis-server)
  gw-sqlite   dedup-gateway, SQLite store (fsync = "always", a file in the work folder)
  ... (queued) the same gateway's queued route (delivery = "queued"): the sender's ack
              once the message is stored; the run then waits for the queue to drain,
              which gives the delivery throughput
  ... (B)     with --compare BINARY: another build of the gateway, next to this one in
              every row (an A/B of two builds within the same rounds)

Rounds are interleaved (round 1 runs every scenario and contestant, then round 2...),
so drift of the machine hits every contestant alike; ratios are taken within a round
and the median of the rounds is reported. CPU time per request comes from /proc
(utime + stime of the contestant's processes over the run), and for the rows at the
trivial upstream it is also given for every process of the row (the proxy's user and
system time, the upstream, Redis, wrk): on shared cores their sum sets the throughput,
and the run ends with the gateway CPU per request each missed ratio target would need.
At the end, the upstream's log of request bodies is checked: no id sent to a dedup
contestant reached it twice.
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
GATEWAY = os.path.join(ROOT, "target", "dist", "dedup-gateway")
SENDER_COST = os.path.join(ROOT, "target", "dist", "sender-cost")
BARE_PROXY = os.path.join(ROOT, "target", "dist", "bare-proxy")
TICK = os.sysconf("SC_CLK_TCK")
PROCS = []  # every process started, stopped by PID at exit


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, cmd, log):
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.name = name
    PROCS.append(proc)
    return proc


def children(pid):
    """PIDs whose parent is `pid` (nginx workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def cpu_split(proc):
    """(utime, stime) in seconds of a process and its children (nginx master + workers)."""
    user = system = 0
    for pid in [proc.pid] + children(proc.pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return user / TICK, system / TICK


def cpu_seconds(proc):
    """utime + stime of a process and its children."""
    return sum(cpu_split(proc))


def rss_bytes(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def stop_all():
    for proc in reversed(PROCS):
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGQUIT if proc.name.startswith("nginx") else signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + 5
    for proc in PROCS:
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for pid in children(proc.pid) + [proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()


def wait_port(port, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def http_get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


# ------------------------------------------------------------------ servers

NGINX_HEAD = """
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes 2;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  lua_package_path "/usr/share/lua/5.1/?.lua;;";
  keepalive_requests 1000000;
"""


def nginx(name, work, body):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_HEAD.format(dir=d) + body + "\n}\n")
    log = open(os.path.join(d, "stdout.log"), "w")
    return start(f"nginx-{name}", ["nginx", "-c", conf, "-p", d, "-e", os.path.join(d, "error.log")], log)


def upstream_body(p, work):
    # A trivial bot: 200 "success" without reading the body. Each request's id (the
    # X-Msg-Id header wrk sends along) is logged, buffered, so the end can check that
    # no id reached the bot twice; every contestant meets the same upstream.
    log = f"access_log {work}/ids.log ids buffer=1m flush=1s;"
    return f"""
  log_format ids '$http_x_msg_id';
  server {{
    listen 127.0.0.1:{p['up_fast']} reuseport backlog=4096;
    location / {{ {log} return 200 "success"; }}
  }}
  server {{
    listen 127.0.0.1:{p['up_slow']} reuseport backlog=4096;
    location / {{ {log} content_by_lua_block {{ ngx.sleep(0.05) ngx.print("success") }} }}
  }}"""


def proxy_locations(p, dedup):
    """`/hook` to the fast upstream, `/slow-*` to the 50 ms one; with `dedup`, through
    bench/dedup.lua (the capture locations are internal)."""
    out = f"""
  upstream fast {{ server 127.0.0.1:{p['up_fast']}; keepalive 256; }}
  upstream slow {{ server 127.0.0.1:{p['up_slow']}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{{port}} reuseport backlog=4096;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
"""
    for path, pool in (("/hook", "fast"), ("/slow-ack", "slow"), ("/slow-wait", "slow")):
        if dedup:
            out += f"""    location = {path} {{ set $dedup_upstream /_up{path}; set $redis_port {p['redis']};
      content_by_lua_file {BENCH}/dedup.lua; }}
    location = /_up{path} {{ internal; proxy_pass http://{pool}{path}; }}
"""
        else:
            out += f"    location = {path} {{ proxy_pass http://{pool}; }}\n"
    return out + "  }"


def gateway_toml(p, store, port, admin, db=None):
    if store == "redis":
        store_toml = f'backend = "redis"\nurl = "redis://127.0.0.1:{p["redis"]}/0"'
    elif store == "sqlite":
        store_toml = f'backend = "sqlite"\npath = "{db}"\nfsync = "always"'
    else:
        store_toml = 'backend = "memory"\nmax_entries = 1_100_000'
    routes = ""
    for name, path, up, extra in (
        ("hook", "/hook", "up_fast", ""),
        ("slow-ack", "/slow-ack", "up_slow", 'on_in_flight = "ack"'),
        ("slow-wait", "/slow-wait", "up_slow", ""),
    ):
        routes += f"""
[[routes]]
name = "{name}"
path = "{path}"
upstream = "http://127.0.0.1:{p[up]}"
key = ["json:/msgId"]
{extra}
"""
    if store != "memory":
        # The same route, queued: acknowledged once stored, delivered by 32 workers.
        routes += f"""
[[routes]]
name = "hook-q"
path = "/hook-q"
upstream = "http://127.0.0.1:{p['up_fast']}"
key = ["json:/msgId"]
delivery = "queued"
retry_schedule = ["1s"]
delivery_concurrency = 32
"""
    # Signed and encrypted senders (credentials as in bench/sender-cost.rs).
    routes += f"""
[[routes]]
name = "slack"
path = "/slack"
upstream = "http://127.0.0.1:{p['up_fast']}"
preset = "slack"
secret = "bench-signing-secret"

[[routes]]
name = "wechat"
path = "/wechat"
upstream = "http://127.0.0.1:{p['up_fast']}"
preset = "wechat-mp"
secret = "bench-token"
aes_key = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
app_id = "wx0123456789abcdef"
"""
    return f"""[server]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
[store]
{store_toml}
{routes}"""


def gateway(name, work, toml, admin, binary=GATEWAY, wrapper=(), ready_within=20):
    """Starts a gateway (under `wrapper`, e.g. valgrind, if given) and waits for /readyz."""
    path = os.path.join(work, f"{name}.toml")
    with open(path, "w") as f:
        f.write(toml)
    log = open(os.path.join(work, f"{name}.log"), "w")
    proc = start(name, [*wrapper, binary, "--config", path, "--log-level", "warn"], log)
    deadline = time.time() + ready_within
    while time.time() < deadline:
        try:
            if http_get(f"http://127.0.0.1:{admin}/readyz").startswith("ready"):
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"{name} did not get ready; see {work}/{name}.log")


# ------------------------------------------------------------------ load

def wrk(url, conns, seconds, args, script=os.path.join(BENCH, "post.lua"), threads=2):
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", script, url, "--"] + args
    # wrk's own CPU: the only child reaped during the run (the servers run on).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"BENCH (.*)", out)
    if not m:
        sys.exit(f"wrk printed no summary:\n{out}")
    r = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["wrk_us"] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e6 / max(r["requests"], 1)
    return r


def measure(procs, url, conns, seconds, args, script=os.path.join(BENCH, "post.lua"), store=None, upstream=None):
    """One wrk run: its summary, with the CPU per request of `procs` (cpu_us, split
    into user_us and system_us), of the store's `store` process (store_us, if the
    contestant has one), of the `upstream` (upstream_us, if given) and of wrk (wrk_us)."""
    def split():
        return [sum(x) for x in zip(*(cpu_split(p) for p in procs))]

    before = split()
    store_before = cpu_seconds(store) if store else 0.0
    upstream_before = cpu_seconds(upstream) if upstream else 0.0
    r = wrk(url, conns, seconds, args, script)
    per_request = 1e6 / max(r["requests"], 1)
    r["user_us"], r["system_us"] = ((a - b) * per_request for a, b in zip(split(), before))
    r["cpu_us"] = r["user_us"] + r["system_us"]
    r["store_us"] = (cpu_seconds(store) - store_before) * per_request if store else None
    r["upstream_us"] = (cpu_seconds(upstream) - upstream_before) * per_request if upstream else None
    return r


# ------------------------------------------------------------------ main

SCENARIOS = [
    # name, path, connections, duplicate share, contestants
    ("all unique, c=32", "/hook", 32, 0.0, ["direct", "nginx", "hyper-bare", "nginx-lua", "gw-memory", "gw-redis"]),
    ("half duplicates, c=32", "/hook", 32, 0.5, ["nginx", "nginx-lua", "gw-memory", "gw-redis"]),
    ("half duplicates, c=256", "/hook", 256, 0.5, ["nginx", "nginx-lua", "gw-memory", "gw-redis"]),
    (
        "50 ms upstream, half dup, c=256",
        "/slow-ack",
        256,
        0.5,
        ["nginx", "nginx-lua", "gw-memory", "gw-redis", "gw-redis (wait)"],
    ),
    # Each queued row next to the same gateway's sync route, in the same round.
    ("queued, all unique, c=32", "/hook", 32, 0.0,
     ["nginx", "gw-sqlite", "gw-sqlite (queued)", "gw-redis", "gw-redis (queued)"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=3, help="length of each wrk run (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--skip-memory", action="store_true", help="skip the 1,000,000-key memory run")
    ap.add_argument("--only", help="run only scenarios whose name contains this")
    ap.add_argument("--redis-server", default="redis-server", metavar="BINARY",
                    help="the Redis (or Valkey) server for gw-redis and nginx-lua (default: redis-server); "
                         "e.g. a valkey-server >= 8.1 from .ci/server valkey, where the gateway completes with SET IFEQ")
    ap.add_argument("--compare", metavar="BINARY",
                    help="another dedup-gateway build, run as 'gw-memory (B)' and 'gw-redis (B)' next to "
                         "this one in the same rounds: an A/B of two builds")
    opts = ap.parse_args()
    if opts.compare and not os.access(opts.compare, os.X_OK):
        sys.exit(f"--compare {opts.compare}: not an executable dedup-gateway build")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit("interrupted"))
    work = tempfile.mkdtemp(prefix="dedup-bench-")
    p = {k: free_port() for k in ("up_fast", "up_slow", "redis", "nginx", "lua", "gwm", "gwm_admin", "gwr", "gwr_admin", "bare",
                                "gwmb", "gwmb_admin", "gwrb", "gwrb_admin", "gws", "gws_admin")}
    try:
        run(opts, work, p)
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)


def run(opts, work, p):
    cores = os.cpu_count()
    print(f"machine: {cores} cores, {os.uname().machine}, {platform_line()}")
    print(f"wrk -t2, {opts.seconds} s per run, {opts.rounds} interleaved rounds\n", flush=True)

    version = subprocess.run([opts.redis_server, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"store server: {version}\n", flush=True)
    redis = start("redis", [opts.redis_server, "--port", str(p["redis"]), "--save", "", "--appendonly", "no",
                            "--maxmemory-policy", "noeviction", "--loglevel", "warning"],
                  open(os.path.join(work, "redis.log"), "w"))
    wait_port(p["redis"], "redis-server")
    upstream = nginx("upstream", work, upstream_body(p, work))
    plain = nginx("plain", work, proxy_locations(p, dedup=False).replace("{port}", str(p["nginx"])))
    lua = nginx("lua", work, proxy_locations(p, dedup=True).replace("{port}", str(p["lua"])))
    for port in (p["up_fast"], p["up_slow"], p["nginx"], p["lua"]):
        wait_port(port, "nginx")
    bare = start("hyper-bare", [BARE_PROXY, f"127.0.0.1:{p['bare']}", f"127.0.0.1:{p['up_fast']}", "2"],
                 open(os.path.join(work, "hyper-bare.log"), "w"))
    wait_port(p["bare"], "hyper-bare")
    gwm = gateway("gw-memory", work, gateway_toml(p, "memory", p["gwm"], p["gwm_admin"]), p["gwm_admin"])
    gwr = gateway("gw-redis", work, gateway_toml(p, "redis", p["gwr"], p["gwr_admin"]), p["gwr_admin"])
    db = os.path.join(work, "sqlite", "gateway.db")
    gws = gateway("gw-sqlite", work, gateway_toml(p, "sqlite", p["gws"], p["gws_admin"], db), p["gws_admin"])

    contestants = {
        "direct": ([upstream], p["up_fast"]),
        "nginx": ([plain], p["nginx"]),
        "hyper-bare": ([bare], p["bare"]),
        "nginx-lua": ([lua], p["lua"]),
        "gw-memory": ([gwm], p["gwm"]),
        "gw-redis": ([gwr], p["gwr"]),
        "gw-redis (wait)": ([gwr], p["gwr"]),
        "gw-sqlite": ([gws], p["gws"]),
        "gw-sqlite (queued)": ([gws], p["gws"]),
        "gw-redis (queued)": ([gwr], p["gwr"]),
    }
    admins = {"gw-sqlite (queued)": p["gws_admin"], "gw-redis (queued)": p["gwr_admin"]}
    scenarios = [s for s in SCENARIOS if not opts.only or opts.only in s[0]]
    if opts.compare:
        for store, key in (("memory", "gwm"), ("redis", "gwr")):
            toml = gateway_toml(p, store, p[f"{key}b"], p[f"{key}b_admin"])
            proc = gateway(f"gw-{store}-b", work, toml, p[f"{key}b_admin"], os.path.abspath(opts.compare))
            contestants[f"gw-{store} (B)"] = ([proc], p[f"{key}b"])
        scenarios = [(n, path, conns, share, with_b(names, contestants)) for n, path, conns, share, names in scenarios]
    dedup_runs = []  # (prefix, contestant) whose ids must reach the upstream once
    results = {}  # (scenario, contestant) -> [per-round result]
    for rnd in range(1, opts.rounds + 1):
        print(f"round {rnd}/{opts.rounds}", flush=True)
        for si, (name, path, conns, share, names) in enumerate(scenarios):
            for c in swap_pairs(names) if rnd % 2 == 0 else names:
                procs, port = contestants[c]
                store = redis if c.startswith("gw-redis") or c == "nginx-lua" else None
                route = "/slow-wait" if c.endswith("(wait)") else "/hook-q" if c.endswith("(queued)") else path
                if c == "direct" and route == "/hook":
                    route = "/"
                prefix = f"s{si}r{rnd}{re.sub('[^a-z]', '', c.lower())}"
                r = measure(procs, f"http://127.0.0.1:{port}{route}", conns, opts.seconds, [prefix, str(share)],
                            store=store, upstream=None if c == "direct" else upstream)
                if c in admins:
                    drained(r, admins[c])
                results.setdefault((name, c), []).append(r)
                if c.startswith("gw") or c == "nginx-lua":
                    dedup_runs.append((prefix, c))
                print(f"  {name:34} {c:16} {r['rps']:>9.0f} req/s  p99 {r['p99_us'] / 1000:6.2f} ms"
                      f"  {r['cpu_us']:5.1f} us CPU/req  errors {r['status_errors'] + r['socket_errors']}",
                      flush=True)

    senders = sender_rows(opts, gwm, p)
    memory = None if opts.skip_memory else memory_run(opts, work, p)

    # Flush the upstream's id log (graceful stop) and check it.
    upstream.send_signal(signal.SIGQUIT)
    upstream.wait(timeout=10)
    doubled = duplicates_delivered(os.path.join(work, "ids.log"), dedup_runs)

    report(scenarios, results, senders, memory, doubled)


def queue_held(admin):
    """Messages the queued route holds (ready, scheduled, delivering), from GET /queue."""
    routes = json.loads(http_get(f"http://127.0.0.1:{admin}/queue"))["routes"]
    return sum(r["ready"] + r["scheduled"] + r["delivering"] for r in routes if r["route"] == "hook-q")


def drained(r, admin):
    """After a queued run: waits until the queue is empty, and records the delivery
    throughput (every acknowledged message over the run and the drain that followed)."""
    started = time.time()
    while queue_held(admin) > 0:
        if time.time() - started > 300:
            sys.exit("the queue did not drain within 5 minutes")
        time.sleep(0.02)
    r["drain_s"] = time.time() - started
    r["delivery_rps"] = r["requests"] / (r["duration_us"] / 1e6 + r["drain_s"])


def with_b(names, contestants):
    """Each contestant that has a (B) build, followed by it (not the `wait` row)."""
    out = []
    for c in names:
        out += [c, f"{c} (B)"] if f"{c} (B)" in contestants else [c]
    return out


def swap_pairs(names):
    """B before A, for even rounds: neither build always runs first."""
    out = list(names)
    for i, c in enumerate(out[:-1]):
        if out[i + 1] == f"{c} (B)":
            out[i], out[i + 1] = out[i + 1], c
    return out


def platform_line():
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        model = "?"
    return model


DONE_LUA = open(os.path.join(BENCH, "post.lua")).read().split("function done", 1)[1]
SENDER_IDS = 10_000


def sender_script(kind):
    """A wrk script cycling through SENDER_IDS deliveries: signed and encrypted ones
    built by bench/sender-cost (wrk's Lua can compute neither an HMAC nor AES), or
    plain JSON ones."""
    if kind == "json":
        bodies = ",\n".join(
            f'  wrk.format("POST", "/hook", {{["Content-Type"]="application/json"}}, '
            f'\'{{"msgId":"senders-{os.getpid()}-{i}","text":"hello"}}\')'
            for i in range(SENDER_IDS))
        text = f"local reqs = {{\n{bodies}\n}}\nlocal i = 0\nrequest = function()\n  i = i % #reqs + 1\n  return reqs[i]\nend\n"
    else:
        # Generated right before the run: Slack's timestamps must be fresh.
        text = subprocess.run([SENDER_COST, "--wrk", kind, str(SENDER_IDS)], capture_output=True,
                              text=True, check=True).stdout
    path = os.path.join(tempfile.gettempdir(), f"dedup-bench-{kind}-{os.getpid()}.lua")
    with open(path, "w") as f:
        f.write(text + "\nfunction done" + DONE_LUA)
    return path


def sender_rows(opts, gwm, p):
    """The signed Slack route and the WeChat safe-mode route next to the plain JSON
    route, on the memory store: what the check and the decryption cost per request.
    Each route first sees its SENDER_IDS deliveries once (forwarded), then the measured
    run repeats them: every measured request is checked (and decrypted) and answered
    as a duplicate, so the rows differ only by the sender's check."""
    if not os.path.exists(SENDER_COST):
        return None
    rows = {}
    for name, kind in (("plain JSON", "json"), ("slack (HMAC-SHA256)", "slack"),
                       ("wechat-mp safe mode (SHA-1 + AES)", "wechat")):
        script = sender_script(kind)
        url = f"http://127.0.0.1:{p['gwm']}/{'hook' if kind == 'json' else kind}"
        try:
            primed = 0
            while primed < SENDER_IDS:
                primed += wrk(url, 32, 1, [], script)["requests"]
            r = measure([gwm], url, 32, opts.seconds, [], script)
        finally:
            os.unlink(script)
        rows[name] = r
        print(f"  senders: {name:36} {r['rps']:>9.0f} req/s  {r['cpu_us']:5.1f} us CPU/req"
              f"  errors {r['status_errors'] + r['socket_errors']}", flush=True)
    return rows


def memory_run(opts, work, p):
    """Fills a memory-store gateway with 1,000,000 completed keys: idle RSS, RSS per key,
    and new-id throughput full against an empty store's. The empty and the full gateway
    run side by side, measured in alternation (`--rounds` pairs, at least 3; each pair's
    order swapped in turn), and the ratio is the median of the pairs' ratios: a single
    run each, minutes apart, moved the ratio by 0.2 with the host's load alone."""
    port, admin = free_port(), free_port()
    empty = gateway("gw-memory-fresh", work, gateway_toml(p, "memory", port, admin), admin)
    idle = rss_bytes(empty.pid)
    empty_url = f"http://127.0.0.1:{port}/hook"

    port, admin = free_port(), free_port()
    full = gateway("gw-memory-full", work, gateway_toml(p, "memory", port, admin), admin)
    full_url = f"http://127.0.0.1:{port}/hook"
    start_rss = rss_bytes(full.pid)
    fill = subprocess.Popen(["wrk", "-t2", "-c64", "-d120s", "-s", os.path.join(BENCH, "post.lua"),
                             full_url, "--", "fill", "0"],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    PROCS.append(fill)
    fill.name = "wrk-fill"
    entries = 0
    while entries < 1_000_000 and fill.poll() is None:
        time.sleep(0.2)
        entries = store_entries(admin)
    fill.send_signal(signal.SIGTERM)
    fill.wait()
    PROCS.remove(fill)
    time.sleep(0.5)
    entries = store_entries(admin)
    held = rss_bytes(full.pid)

    pairs = []
    for rnd in range(max(opts.rounds, 3)):
        runs = {}
        order = [("empty", empty, empty_url), ("full", full, full_url)]
        for name, proc, url in order if rnd % 2 == 0 else order[::-1]:
            runs[name] = measure([proc], url, 32, opts.seconds, [f"m{name}{rnd}", "0"])["rps"]
        pairs.append((runs["empty"], runs["full"]))
    ratios = sorted(f / e for e, f in pairs)
    out = {"idle_rss": idle, "start_rss": start_rss, "full_rss": held, "entries": entries,
           "per_key": (held - start_rss) / max(entries, 1),
           "empty_rps": statistics.median(e for e, _ in pairs),
           "full_rps": statistics.median(f for _, f in pairs),
           "ratio": statistics.median(ratios), "ratios": ratios}
    print(f"  memory: {entries} keys, RSS {held / 2**20:.1f} MiB ({out['per_key']:.0f} B/key), "
          f"idle {idle / 2**20:.1f} MiB; new ids, full over empty: "
          + ", ".join(f"{f:.0f}/{e:.0f}" for e, f in pairs), flush=True)
    return out


def store_entries(admin):
    text = http_get(f"http://127.0.0.1:{admin}/metrics")
    m = re.search(r"^dedup_store_entries (\d+)", text, re.M)
    return int(m.group(1)) if m else 0


def duplicates_delivered(log, runs):
    counts = {prefix: {} for prefix, _ in runs}
    pattern = re.compile(r'^((s\d+r\d+[a-z]+)-\S*)')
    with open(log, errors="replace") as f:
        for line in f:
            m = pattern.search(line)
            if m and m.group(2) in counts:
                ids = counts[m.group(2)]
                ids[m.group(1)] = ids.get(m.group(1), 0) + 1
    return {c: sum(sum(n - 1 for n in counts[prefix].values() if n > 1) for prefix, cc in runs if cc == c)
            for _, c in runs}


def round_ratios(results, scenario, contestant, base="nginx"):
    """`contestant`'s req/s over `base`'s, round by round."""
    return [r["rps"] / b["rps"] for r, b in zip(results[(scenario, contestant)], results[(scenario, base)])]


# Issue 8's targets, each judged on the median of the rounds, with whether it held in
# every round too: (scenario, contestant, the least ratio to nginx).
RATIO_TARGETS = [
    ("half duplicates, c=32", "gw-redis", 1.0),
    ("half duplicates, c=256", "gw-redis", 1.0),
    ("all unique, c=32", "gw-redis", 0.7),
    ("half duplicates, c=32", "gw-memory", 1.3),
    ("all unique, c=32", "gw-memory", 0.9),
    ("50 ms upstream, half dup, c=256", "gw-memory", 1.9),
    ("50 ms upstream, half dup, c=256", "gw-redis", 1.9),
]


def every_round(ratios, least):
    """Whether a ratio target held in every round, or its lowest round."""
    return "yes" if min(ratios) >= least else f"no (lowest {min(ratios):.3f}x)"


def targets(scenarios, results, memory):
    """The targets of the performance issue, against this run."""
    med = statistics.median
    ran = {name for name, *_ in scenarios}
    rows = []

    def row(what, value, held, every=""):
        rows.append(f"| {what} | {value} | {'yes' if held else 'no'} | {every} |")

    for scenario, c, least in RATIO_TARGETS:
        if scenario in ran and (scenario, c) in results:
            ratios = round_ratios(results, scenario, c)
            # Three decimals: a 1.2997x must not read as the 1.30x it misses.
            row(f"{c}, {scenario}: >= {least}x nginx", f"{med(ratios):.3f}x", med(ratios) >= least,
                every_round(ratios, least))
    for scenario, *_, names in scenarios:
        for c in (n for n in names if n.startswith("gw") and "(B)" not in n):
            # `(wait)` holds in-flight duplicates where the Lua peer acks them: not like
            # for like, so only its p99 is judged.
            if "(wait)" not in c and (scenario, "nginx-lua") in results:
                mine, lua = round_ratios(results, scenario, c), round_ratios(results, scenario, "nginx-lua")
                row(f"{c}, {scenario}: ahead of nginx-lua", f"{med(mine):.2f}x against {med(lua):.2f}x",
                    med(mine) > med(lua), "yes" if all(a > b for a, b in zip(mine, lua)) else "no")
            p99 = [r["p99_us"] / 1000 for r in results[(scenario, c)]]
            base = [r["p99_us"] / 1000 for r in results[(scenario, "nginx")]]
            row(f"{c}, {scenario}: p99 no worse than nginx's", f"{med(p99):.2f} ms against {med(base):.2f} ms",
                med(p99) <= med(base), "yes" if all(a <= b for a, b in zip(p99, base)) else "no")
    if memory:
        row("memory store: <= 200 bytes RSS per key", f"{memory['per_key']:.0f} B", memory["per_key"] <= 200)
        row("memory store: idle RSS <= 20 MiB", f"{memory['idle_rss'] / 2**20:.1f} MiB",
            memory["idle_rss"] <= 20 * 2**20)
        row("memory store: 1,000,000 keys within 10% of empty", f"{memory['ratio']:.3f}x", memory["ratio"] >= 0.9,
            every_round(memory["ratios"], 0.9))
    print("\n## Targets (the performance issue's, on this run's medians; and in every round?)\n")
    print("| target | measured | held | every round |")
    print("| --- | --- | --- | --- |")
    print("\n".join(rows))


def cpu_bound(path):
    """Whether a scenario is bound by CPU: the trivial upstream's rows, not the 50 ms one's."""
    return path == "/hook"


def budget(scenarios, results):
    """Every process's CPU per request in the CPU-bound rows (medians of the rounds):
    with wrk, the upstream, the proxy and Redis sharing the cores, throughput is about
    the cores' time over the sum, so this shows what each part of a row costs."""
    med = statistics.median
    cores = os.cpu_count()
    print("\n## Where the CPU goes (µs per request, every process, median of the rounds)\n")
    print(f"The req/s {cores} busy cores would give at that sum, next to the req/s measured: where they are close, "
          "the row is bound by CPU alone, and a µs saved anywhere is throughput.\n")
    print("| scenario | contestant | proxy user | proxy system | upstream | Redis | wrk | sum | req/s at the sum "
          "| req/s measured |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, path, _, _, names in scenarios:
        if not cpu_bound(path):
            continue
        for c in (n for n in names if n != "direct"):
            rs = results[(name, c)]
            parts = [med(r[k] or 0.0 for r in rs) for k in ("user_us", "system_us", "upstream_us", "store_us", "wrk_us")]
            store = f"{parts[3]:.1f}" if rs[0]["store_us"] is not None else ""
            total = sum(parts)
            print(f"| {name} | {c} | {parts[0]:.1f} | {parts[1]:.1f} | {parts[2]:.1f} | {store} | {parts[4]:.1f} | "
                  f"{total:.1f} | {cores * 1e6 / total:,.0f} | {med(r['rps'] for r in rs):,.0f} |")


def cpu_sum(results, scenario, c):
    """The median over the rounds of every process's CPU per request in a row."""
    keys = ("cpu_us", "upstream_us", "store_us", "wrk_us")
    return statistics.median(sum(r[k] or 0.0 for k in keys) for r in results[(scenario, c)])


def needs(scenarios, results):
    """For each ratio target missed in a CPU-bound row: the proxy CPU per request at
    which the row's CPU sum would be nginx's over the target ratio, every other process
    costing what it cost here."""
    med = statistics.median
    paths = {name: path for name, path, *_ in scenarios}
    lines = []
    for scenario, c, least in RATIO_TARGETS:
        if scenario not in paths or (scenario, c) not in results or not cpu_bound(paths[scenario]):
            continue
        if med(round_ratios(results, scenario, c)) >= least:
            continue
        rs = results[(scenario, c)]
        mine = med(r["cpu_us"] for r in rs)
        allowed = cpu_sum(results, scenario, "nginx") / least - (cpu_sum(results, scenario, c) - mine)
        lines.append(f"- {c}, {scenario}, >= {least}x: the gateway at <= {allowed:.1f} µs per request; it used "
                     f"{mine:.1f}, {med(r['user_us'] for r in rs):.1f} user and {med(r['system_us'] for r in rs):.1f} "
                     f"system (nginx {med(r['cpu_us'] for r in results[(scenario, 'nginx')]):.1f})")
    if lines:
        print("\nWhat each missed ratio target needs, on the CPU sums above (the other processes as measured):\n")
        print("\n".join(lines))


# The queued-delivery issue's targets: acks per second of the queued route over the
# same gateway's sync route, within each round.
QUEUED_TARGETS = [("gw-sqlite", 0.5), ("gw-redis", 0.8)]


def queued(scenarios, results):
    """Queued rows against the same gateway's sync route (same round), with the ack's
    p99 and the delivery throughput."""
    med = statistics.median
    rows = [(name, c) for name, *_, names in scenarios for c in names if c.endswith("(queued)")]
    if not rows:
        return
    print("\n## Queued delivery (acks per second over the same gateway's sync route, within each round)\n")
    print("| scenario | contestant | acks/s | ack p50 | ack p99 | over sync | rounds | target | delivered/s "
          "| drain after the run |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, c in rows:
        sync = c.removesuffix(" (queued)")
        q, s = results[(name, c)], results[(name, sync)]
        ratios = [a["rps"] / b["rps"] for a, b in zip(q, s)]
        target = dict(QUEUED_TARGETS).get(sync)
        held = "" if target is None else f">= {target}x: {'yes' if med(ratios) >= target else 'no'}"
        print(f"| {name} | {c} | {med(r['rps'] for r in q):,.0f} | {med(r['p50_us'] for r in q) / 1000:.2f} ms | "
              f"{med(r['p99_us'] for r in q) / 1000:.2f} ms | {med(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} "
              f"| {held} | {med(r['delivery_rps'] for r in q):,.0f} | {med(r['drain_s'] for r in q):.1f} s |")


def report(scenarios, results, senders, memory, doubled):
    med = statistics.median
    print("\n## Throughput, latency and CPU (median of the rounds; ratio to nginx within each round)\n")
    print("| scenario | contestant | req/s | p50 | p99 | ratio to nginx | rounds' ratios | CPU µs/req "
          "| Redis CPU µs/req |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, _, _, _, names in scenarios:
        for c in names:
            rs = results[(name, c)]
            ratios = round_ratios(results, name, c)
            errs = sum(r["status_errors"] + r["socket_errors"] for r in rs)
            note = f" ({errs} non-2xx/socket errors)" if errs else ""
            store = f"{med(r['store_us'] for r in rs):.1f}" if rs[0]["store_us"] is not None else ""
            print(f"| {name} | {c}{note} | {med(r['rps'] for r in rs):,.0f} | "
                  f"{med(r['p50_us'] for r in rs) / 1000:.2f} ms | {med(r['p99_us'] for r in rs) / 1000:.2f} ms | "
                  f"{med(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} | {med(r['cpu_us'] for r in rs):.1f} "
                  f"| {store} |")
    pairs = [(name, c) for name, *_, names in scenarios for c in names if f"{c} (B)" in names]
    if pairs:
        print("\n## This build against --compare's (req/s of A / B within each round)\n")
        print("| scenario | contestant | median | lowest | highest | CPU µs/req A / B | Redis CPU µs/req A / B |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for name, c in pairs:
            a, b = results[(name, c)], results[(name, f"{c} (B)")]
            ratios = [x["rps"] / y["rps"] for x, y in zip(a, b)]
            cpu = f"{med(x['cpu_us'] for x in a):.1f} / {med(y['cpu_us'] for y in b):.1f}"
            store = ""
            if a[0]["store_us"] is not None:
                store = f"{med(x['store_us'] for x in a):.1f} / {med(y['store_us'] for y in b):.1f}"
            print(f"| {name} | {c} | {med(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | {cpu} | {store} |")
    queued(scenarios, results)
    if senders:
        base = senders["plain JSON"]
        print("\n## Signed and encrypted senders (gw-memory, c=32, every request checked and a duplicate)\n")
        print("| route | req/s | CPU µs/req | check (+ decryption) per request |")
        print("| --- | ---: | ---: | ---: |")
        for name, r in senders.items():
            extra = "" if r is base else f"+{r['cpu_us'] - base['cpu_us']:.1f} µs"
            print(f"| {name} | {r['rps']:,.0f} | {r['cpu_us']:.1f} | {extra} |")
    if memory:
        print("\n## Memory store with 1,000,000 completed keys\n")
        print(f"- idle RSS (fresh gateway): {memory['idle_rss'] / 2**20:.1f} MiB")
        print(f"- {memory['entries']:,} keys: RSS {memory['full_rss'] / 2**20:.1f} MiB, "
              f"{memory['per_key']:.0f} bytes per key")
        print(f"- new ids, c=32, full against empty in alternating runs ({len(memory['ratios'])} pairs): "
              f"{memory['ratio']:.2f}x, median of the pairs' ratios "
              f"({', '.join(f'{r:.2f}' for r in memory['ratios'])}); "
              f"medians {memory['empty_rps']:,.0f} req/s empty, {memory['full_rps']:,.0f} req/s full")
    budget(scenarios, results)
    targets(scenarios, results, memory)
    needs(scenarios, results)
    print("\n## Exactly once\n")
    bad = {c: n for c, n in doubled.items() if n and c != "nginx-lua"}
    for c, n in sorted(doubled.items()):
        print(f"- {c}: {n} id(s) reached the upstream more than once")
    if bad:
        sys.exit(f"FAIL: a dedup-gateway contestant delivered an id twice: {bad}")


if __name__ == "__main__":
    main()
