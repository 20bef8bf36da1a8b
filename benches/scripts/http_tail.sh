#!/usr/bin/env bash
# A lone writer's tail over HTTP, and when its slow writes come.
#
#   benches/scripts/http_tail.sh [SECONDS] [ROUNDS]
#
# Starts `walrelay up --writers 0 --insecure --fleet-nodes 0` (the `perf`
# profile's build, or WALRELAY_BIN; with WALRELAY_BIN_B too, the two
# binaries alternate, ROUNDS pairs, a fresh cluster each time) and runs
# http_tail.py against its primary for SECONDS (default 10): one
# keep-alive client writing in a loop, its p50/p99/p99.9, the writes over
# 3 ms and when they started. papers/performance.md (lever 56) shows what
# it printed.
#
# UP_ARGS adds options to `up` (such as `--store DIR` elsewhere than the
# followers' disk).
# TAIL_FROM=N counts only the writes from N seconds into each run (see
# http_tail.py).
# BURST_SECONDS=N first loads the cluster with wrk at 16 connections for N
# seconds (one INSERT of a 100-byte value each), so the lone writer runs
# while the followers upload, snapshot and release what the burst wrote.
# IO_SAMPLE=1 prints, each second of the lone writer's run, the disk's
# bytes and each walrelay thread kind's CPU and I/O (io_by_thread.py).
#
# Not part of CI. Every wait is bounded; `up` is stopped by its PID (it
# stops its children), also on error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/scripts/lib.sh

SECONDS_EACH=${1:-10}
ROUNDS=${2:-1}
PORT=${WALRELAY_PORT:-7700}
WORK=$(mktemp -d /tmp/http_tail.XXXXXX)
PIDS=()
cleanup() { stop_pids "${PIDS[@]}"; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

BINS=("$(walrelay_bin)")
if [ -n "${WALRELAY_BIN_B:-}" ]; then BINS+=("$(realpath "$WALRELAY_BIN_B")"); fi
URL="http://127.0.0.1:$((PORT + 10))/v1/databases/main/query"

for round in $(seq 1 "$ROUNDS"); do
  for bin in "${BINS[@]}"; do
    rm -rf "$WORK/up"
    "$bin" up --dir "$WORK/up" --base-port "$PORT" --writers 0 --insecure \
      --fleet-nodes 0 --seconds $((SECONDS_EACH + ${BURST_SECONDS:-0} + 120)) ${UP_ARGS:-} >"$WORK/up.log" 2>&1 &
    PIDS=($!)
    kv_ready "$URL"
    echo "round $round, $bin:"
    if [ "${BURST_SECONDS:-0}" -gt 0 ]; then
      need_wrk
      wrk_post_script "$WORK/insert.lua" "$(insert_body)"
      wrk -t2 -c16 -d"${BURST_SECONDS}s" -s "$WORK/insert.lua" "$URL" |
        awk '/^Requests\/sec/ { print "burst: " $2 " requests/s" }'
    fi
    SAMPLER=
    if [ -n "${IO_SAMPLE:-}" ]; then
      python3 benches/scripts/io_by_thread.py "$SECONDS_EACH" >"$WORK/io.txt" &
      SAMPLER=$!
    fi
    python3 benches/scripts/http_tail.py "$URL" "$SECONDS_EACH"
    if [ -n "$SAMPLER" ]; then
      wait "$SAMPLER" || true
      cat "$WORK/io.txt"
    fi
    stop_pids "${PIDS[@]}"
    PIDS=()
  done
done
