#!/usr/bin/env bash
# Follower start time on a large log (papers/lifecycle.md; target <= 1 s):
# runs a release `walrelay up` with the demo workload for LOAD_SECONDS
# (default 180) keeping KEEP_BYTES (default 512 MiB) of archived log on
# each follower, so the logs grow past 256 MiB; stops it; then starts
# `walrelay follower` on follower-0's directory RUNS times (default 5),
# timing from the spawn to its "listening" line, and stops it with SIGTERM.
#
#   cargo build --release -p walrelay-engine
#   benches/scripts/follower_start.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$(mktemp -d /tmp/walrelay-start.XXXXXX)}
BIN=${WALRELAY_BIN:-${CARGO_TARGET_DIR:-target}/release/walrelay}
LOAD_SECONDS=${LOAD_SECONDS:-180}
KEEP_BYTES=${KEEP_BYTES:-$((512 << 20))}
RUNS=${RUNS:-5}
BASE_PORT=${BASE_PORT:-7400}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p walrelay-engine" >&2; exit 1; }
mkdir -p "$DIR"
echo "walrelay up for $LOAD_SECONDS s in $DIR (local keep $KEEP_BYTES bytes)" >&2
"$BIN" up --dir "$DIR" --seconds "$LOAD_SECONDS" --base-port "$BASE_PORT" \
  --local-keep-bytes "$KEEP_BYTES" >"$DIR/up.log" 2>&1 || echo "up exited with $?" >&2
F=$DIR/follower-0
echo "follower-0: $(du -sb "$F/log" | cut -f1) bytes of log in $(ls "$F/log" | grep -c '\.seg$') segments" >&2
now() { date +%s.%N; }
for i in $(seq 1 "$RUNS"); do
  out=$DIR/follower-start-$i.log
  t0=$(now)
  "$BIN" follower --listen "127.0.0.1:$((BASE_PORT + 50))" --dir "$F" --insecure-replication \
    --store "$DIR/store" >"$out" 2>&1 &
  pid=$!
  until grep -qs " listening" "$out"; do
    kill -0 $pid 2>/dev/null || { echo "follower exited:" >&2; cat "$out" >&2; exit 1; }
    sleep 0.005
  done
  t1=$(now)
  kill -TERM $pid
  wait $pid || true
  awk -v a="$t0" -v b="$t1" -v i="$i" 'BEGIN { printf "start %d: spawn->listening %.3f s\n", i, b - a }'
  grep " listening" "$out" | head -1
done
