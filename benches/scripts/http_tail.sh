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
      --fleet-nodes 0 --seconds $((SECONDS_EACH + 120)) >"$WORK/up.log" 2>&1 &
    PIDS=($!)
    kv_ready "$URL"
    echo "round $round, $bin:"
    python3 benches/scripts/http_tail.py "$URL" "$SECONDS_EACH"
    stop_pids "${PIDS[@]}"
    PIDS=()
  done
done
