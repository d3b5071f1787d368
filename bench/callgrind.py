#!/usr/bin/env python3
"""Instructions per request of a gateway build, counted by valgrind's callgrind.

Run through `bench/run --callgrind` (it builds the binaries, profile dist). The
wall clock on a shared 2-core VM moves 10-15% between runs of the same build; the
instruction count of the same build and load moves by well under 1% at c=1, so it
judges a change to the request path that bench/run's rounds cannot resolve.

It starts bench.py's trivial upstream (and a redis-server for --store redis), runs the
gateway under callgrind with one worker, zeroes the counters once it is ready, drives
it with wrk (bench/post.lua), dumps, and prints:
  - instructions per request (all of the process's, over the requests wrk counted);
  - the functions that run the most instructions of their own, per request;
  - with --callers REGEX, who calls the functions matching it: instructions (inclusive),
    calls per request and instructions per call, by caller.
Every process it started is stopped by PID at the end; the callgrind file is kept
(its path is printed) for callgrind_annotate or kcachegrind.

  bench/run --callgrind [--store memory|redis] [--conns 1] [--share 0] [--seconds 8]
                        [--top 30] [--callers REGEX] [--binary PATH]
"""

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import bench


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=("memory", "redis"), default="memory")
    ap.add_argument("--conns", type=int, default=1,
                    help="wrk connections (default 1: no two requests share a wake-up, so the count "
                         "does not move with batching)")
    ap.add_argument("--share", type=float, default=0.0, help="share of duplicates (default 0: all new ids)")
    ap.add_argument("--seconds", type=int, default=8, help="length of the wrk run (default 8)")
    ap.add_argument("--top", type=int, default=30, help="how many functions to list (default 30)")
    ap.add_argument("--callers", metavar="REGEX", help="also list the callers of the functions matching REGEX")
    ap.add_argument("--binary", default=bench.GATEWAY, help="the gateway build (default: target/dist's)")
    opts = ap.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            sys.exit(f"{tool} is missing: sudo apt-get install -y valgrind")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit("interrupted"))
    work = tempfile.mkdtemp(prefix="dedup-callgrind-")
    p = {k: bench.free_port() for k in ("up_fast", "up_slow", "redis", "gw", "admin")}
    try:
        requests, profile = run(opts, work, p)
    finally:
        bench.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    costs, callers = read_profile(profile, re.compile(opts.callers) if opts.callers else None)
    report(opts, requests, profile, costs, callers)


def run(opts, work, p):
    """Runs the load under callgrind: the requests wrk counted, and the dump's path."""
    if opts.store == "redis":
        bench.start("redis", ["redis-server", "--port", str(p["redis"]), "--save", "", "--appendonly", "no",
                              "--loglevel", "warning"], open(os.path.join(work, "redis.log"), "w"))
        bench.wait_port(p["redis"], "redis-server")
    bench.nginx("upstream", work, bench.upstream_body(p, work))
    bench.wait_port(p["up_fast"], "nginx")
    # One worker: callgrind runs one thread at a time anyway, and a second would only
    # split the batches.
    toml = bench.gateway_toml(p, opts.store, p["gw"], p["admin"]).replace("[server]\n", "[server]\nworkers = 1\n", 1)
    out = os.path.join(work, "callgrind.out")
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    gw = bench.gateway("gw-callgrind", work, toml, p["admin"], os.path.abspath(opts.binary), wrapper, ready_within=120)
    subprocess.run(["callgrind_control", "-z", str(gw.pid)], check=True, capture_output=True)
    r = bench.wrk(f"http://127.0.0.1:{p['gw']}/hook", opts.conns, opts.seconds, [f"cg{int(time.time())}", str(opts.share)],
                  threads=1)
    subprocess.run(["callgrind_control", "-d", str(gw.pid)], check=True, capture_output=True)
    # The dump is `<out>.1`; the rest of the run goes to `<out>` when the process exits.
    kept = os.path.join(tempfile.gettempdir(), f"callgrind.{opts.store}.c{opts.conns}.{gw.pid}")
    os.replace(out + ".1", kept)
    return r["requests"], kept


def read_profile(path, pattern):
    """Instructions of each function's own, and (for functions matching `pattern`) the
    inclusive instructions and calls by caller, from a callgrind file (names compressed
    as `(id) name` the first time, `(id)` after)."""
    names, own = {}, collections.Counter()
    callers = collections.defaultdict(lambda: [0, 0])  # caller -> [instructions, calls]
    fn = callee = None
    calls = None  # the count of the `calls=` line whose cost line comes next

    def name(text):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?", text)
        if not m:
            return text
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), text)

    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                fn = name(line[3:].strip())
            elif line.startswith("cfn="):
                callee = name(line[4:].strip())
            elif line.startswith("calls="):
                calls = int(line[6:].split()[0])
            elif (line[:1].isdigit() or line[:1] in "+-*") and len(line.split()) > 1:
                cost = int(line.split()[1])
                if calls is None:
                    own[fn] += cost
                else:
                    if pattern and pattern.search(callee):
                        callers[fn][0] += cost
                        callers[fn][1] += calls
                    calls = None
    return own, callers


def report(opts, requests, profile, costs, callers):
    if requests == 0:
        sys.exit(f"wrk counted no requests: see the callgrind file {profile}")
    total = sum(costs.values())
    print(f"{os.path.basename(opts.binary)}, {opts.store} store, wrk c={opts.conns}, share {opts.share}: "
          f"{requests} requests, {total // requests:,} instructions per request")
    print(f"callgrind file: {profile}\n")
    print("instructions per request, own (not counting callees):")
    for fn, cost in costs.most_common(opts.top):
        print(f"{cost / requests:9.0f}  {fn[:140]}")
    if opts.callers:
        print(f"\ncallers of /{opts.callers}/: instructions per request (inclusive), calls per request, per call:")
        ranked = sorted(callers.items(), key=lambda kv: -kv[1][0])
        for fn, (cost, calls) in ranked[:opts.top]:
            print(f"{cost / requests:9.0f} {calls / requests:7.2f} {cost / max(calls, 1):8.0f}  {fn[:120]}")


if __name__ == "__main__":
    main()
