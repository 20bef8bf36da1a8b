#!/usr/bin/env python3
"""One keep-alive client writing in a loop: where a lone writer's slow writes are.

    http_tail.py URL SECONDS [SLOW_US]

Sends `INSERT INTO kv(v) VALUES (?1)` (a 100-byte value) to URL (a
`/query` endpoint) one after another for SECONDS, then prints the p50,
p99, p99.9 and maximum of the client's time, how many writes took longer
than SLOW_US (default 3,000), and when each of the first 40 of them
started (seconds into the run) with the server's own duration beside it
(`meta.duration`). Slow writes that come at a fixed period point at a
timer in some node (papers/performance.md, lever 56). Used by
http_tail.sh; Python's client adds a steady ~100 us, not a tail.

TAIL_FROM=N counts only the writes started N seconds or more into the
run (the cluster's steady state: once its followers release archived
segments and reuse them, say).
"""
import http.client
import json
import os
import sys
import time
from urllib.parse import urlparse


def main():
    url, seconds = urlparse(sys.argv[1]), float(sys.argv[2])
    slow_us = float(sys.argv[3]) if len(sys.argv) > 3 else 3000.0
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = json.dumps({"sql": "INSERT INTO kv(v) VALUES (?1)", "params": ["x" * 100]})
    headers = {"content-type": "application/json"}
    runs = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s = time.perf_counter()
        conn.request("POST", url.path, body, headers)
        answer = conn.getresponse().read()
        e = time.perf_counter()
        server_ms = json.loads(answer)["result"][0]["meta"]["duration"]
        runs.append((s - t0, (e - s) * 1e6, server_ms * 1000))
    tail_from = float(os.environ.get("TAIL_FROM", "0"))
    runs = [r for r in runs if r[0] >= tail_from]
    lat = sorted(r[1] for r in runs)
    n = len(lat)
    slow = [r for r in runs if r[1] > slow_us]
    counted = f" (from {tail_from:.0f} s)" if tail_from > 0 else ""
    print(
        f"{n} writes in {seconds:.0f} s{counted}: p50 {lat[n // 2]:.0f} us, p99 {lat[int(n * 0.99)]:.0f} us, "
        f"p99.9 {lat[int(n * 0.999)]:.0f} us, max {lat[-1]:.0f} us; {len(slow)} over {slow_us:.0f} us"
    )
    for at, client_us, server_us in slow[:40]:
        print(f"  at {at:7.3f} s: client {client_us:6.0f} us, server {server_us:6.0f} us")


if __name__ == "__main__":
    main()
