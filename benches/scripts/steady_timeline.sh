#!/usr/bin/env bash
# The quorum bench's steady-state commits against the disk's requests.
#
#   benches/scripts/steady_timeline.sh QUORUM_BIN [MODE] [SLOW_FACTOR]
#
# Runs the quorum bench executable QUORUM_BIN (`cargo bench --profile perf
# -p walrelay-benches --bench quorum --no-run` prints its path) with
# WALRELAY_BENCH_STEADY=MODE (default 1: the uploads on; `quiet` stops
# them) and a timeline of its steady-state commits; records the block
# layer's requests and the scheduler's switches system-wide with `perf record -k CLOCK_MONOTONIC` while
# the commits are timed (the bench waits for it); then prints the bench's
# figures and steady_timeline.py's report: which kinds of disk request were
# in flight during the slow commits (over SLOW_FACTOR, default 2, times the
# median) against all commits, and how much the archive's and the logs'
# background threads were on a CPU meanwhile.
#
# Needs perf with the block tracepoints (root). Not part of CI. One
# bounded run (the bench is bounded; perf records 8 s); everything lives
# in a temporary directory, removed at the end unless KEEP=1.
set -euo pipefail

if [ $# -lt 1 ]; then
  sed -n '2,19p' "$0" >&2
  exit 2
fi
BIN=$(realpath "$1")
MODE=${2:-1}
FACTOR=${3:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/steady_timeline.XXXXXX)
BENCH_PID=
cleanup() {
  [ -n "$BENCH_PID" ] && kill "$BENCH_PID" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

export WALRELAY_BENCH_DIR=${WALRELAY_BENCH_DIR:-$WORK}
WALRELAY_BENCH_STEADY=$MODE WALRELAY_BENCH_TIMELINE=$WORK/timeline \
  "$BIN" --bench > "$WORK/bench.out" 2>&1 &
BENCH_PID=$!
# The bench's phases before the steady state take about a minute.
for _ in $(seq 1 600); do
  [ -e "$WORK/timeline.ready" ] && break
  kill -0 "$BENCH_PID" 2>/dev/null || { cat "$WORK/bench.out" >&2; exit 1; }
  sleep 0.5
done
[ -e "$WORK/timeline.ready" ] || { echo "the bench never reached its steady state" >&2; exit 1; }
perf record -q -k CLOCK_MONOTONIC -a -o "$WORK/perf.data" \
  -e block:block_bio_queue,block:block_rq_issue,block:block_rq_complete,sched:sched_switch,sched:sched_wakeup \
  -- sleep 8 &
PERF_PID=$!
sleep 1
touch "$WORK/timeline.go"
wait "$PERF_PID"
wait "$BENCH_PID"
BENCH_PID=
grep -E "shared-disk quorum floor|commit / shared-disk|steady" "$WORK/bench.out"
perf script -i "$WORK/perf.data" 2>/dev/null > "$WORK/perf.txt"
python3 "$HERE/steady_timeline.py" "$WORK/timeline" "$WORK/perf.txt" "$FACTOR"
