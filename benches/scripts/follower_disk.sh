#!/usr/bin/env bash
# Follower disk over time under `walrelay up`'s default demo workload
# (papers/lifecycle.md). Runs a release `walrelay up` for MINUTES (default
# 10) in a fresh DIR, and every 10 s appends to DIR/../follower_disk.csv (or
# $CSV) one row: seconds since start, the database size (the primary's
# db.sqlite), and each follower's disk (du -sb DIR/follower-K). Then plots
# it (benches/scripts/plot_follower_disk.py) with the bound
# max(256 MiB, 2 x database size).
#
# While it runs it also measures follower restarts: at RESTART_AT seconds
# (default: 60% of the run, blank to skip) it kills the follower with the
# largest log and times, from the kill and from the new process's start,
# until that follower's "listening" line (up restarts dead followers).
#
#   cargo build --release -p walrelay-engine
#   benches/scripts/follower_disk.sh [MINUTES] [DIR]
#
# BASE_PORT (default 7300) moves the cluster's ports off `up`'s default.
# Writes: $CSV (default papers/lifecycle-follower-disk.csv), $SVG (default
# papers/lifecycle-follower-disk.svg), DIR/up.log, DIR/restarts.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
MINUTES=${1:-10}
DIR=${2:-$(mktemp -d /tmp/walrelay-disk.XXXXXX)}
CSV=${CSV:-papers/lifecycle-follower-disk.csv}
SVG=${SVG:-papers/lifecycle-follower-disk.svg}
BIN=${WALRELAY_BIN:-${CARGO_TARGET_DIR:-target}/release/walrelay}
FOLLOWERS=5
BASE_PORT=${BASE_PORT:-7300}
SECONDS_TOTAL=$((MINUTES * 60))
RESTART_AT=${RESTART_AT-$((SECONDS_TOTAL * 6 / 10))}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p walrelay-engine" >&2; exit 1; }
mkdir -p "$DIR"
LOG=$DIR/up.log

"$BIN" up --dir "$DIR" --seconds "$SECONDS_TOTAL" --base-port "$BASE_PORT" >"$LOG" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null || true' EXIT
echo "walrelay up (pid $UP) in $DIR for $MINUTES min; log $LOG" >&2

header="t_s,db_bytes"
for k in $(seq 0 $((FOLLOWERS - 1))); do header="$header,follower_${k}_bytes"; done
echo "$header" >"$CSV"

db_bytes() {
  local slot=0 d
  [ -f "$DIR/primary-slot" ] && slot=$(cat "$DIR/primary-slot")
  if [ "$slot" = 0 ]; then d=$DIR/primary; else d=$DIR/replica-$((slot - 1)); fi
  stat -c %s "$d/db.sqlite" 2>/dev/null || echo 0
}

uptime_s() { cut -d' ' -f1 /proc/uptime; }

# Kill the follower with the most disk; wait for its next "listening" line.
restart_one() {
  local best=0 bestk=0 k b
  for k in $(seq 0 $((FOLLOWERS - 1))); do
    b=$(du -sb "$DIR/follower-$k" | cut -f1)
    if [ "$b" -gt "$best" ]; then best=$b; bestk=$k; fi
  done
  local pidf=$DIR/pids/follower-$bestk old new addr before t0 t1 start ticks
  old=$(cat "$pidf")
  addr="127.0.0.1:$((BASE_PORT + 1 + bestk))"
  before=$(grep -c "follower $addr listening" "$LOG" || true)
  t0=$(uptime_s)
  kill -9 "$old"
  local deadline=$(($(date +%s) + 60))
  while [ "$(grep -c "follower $addr listening" "$LOG" || true)" -le "$before" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "follower-$bestk: no listening line within 60 s" >&2; return; }
    sleep 0.01
  done
  t1=$(uptime_s)
  new=$(cat "$pidf")
  ticks=$(getconf CLK_TCK)
  # Field 22 of /proc/PID/stat: start time in clock ticks since boot.
  start=$(awk -v t="$ticks" '{print $22 / t}' "/proc/$new/stat")
  awk -v k="$bestk" -v b="$best" -v t0="$t0" -v t1="$t1" -v s="$start" -v hz="$ticks" 'BEGIN {
    printf "follower-%s du=%d bytes: kill->listening %.3f s, spawn->listening %.3f s (start time to 1/%d s)\n", k, b, t1 - t0, t1 - s, hz
  }' | tee -a "$DIR/restarts.txt" >&2
}

start=$(date +%s)
restarted=
while kill -0 $UP 2>/dev/null; do
  now=$(($(date +%s) - start))
  row="$now,$(db_bytes)"
  for k in $(seq 0 $((FOLLOWERS - 1))); do
    row="$row,$(du -sb "$DIR/follower-$k" 2>/dev/null | cut -f1 || echo 0)"
  done
  echo "$row" >>"$CSV"
  if [ -n "$RESTART_AT" ] && [ -z "$restarted" ] && [ "$now" -ge "$RESTART_AT" ]; then
    restarted=1
    for _ in 1 2 3; do restart_one; sleep 2; done
  fi
  sleep $((10 - ($(date +%s) - start) % 10))
done
wait $UP || echo "walrelay up exited with $?" >&2
trap - EXIT
grep -E "^follower .* log_bytes=" "$LOG" | tail -5 >&2 || true
python3 benches/scripts/plot_follower_disk.py "$CSV" "$SVG"
echo "wrote $CSV and $SVG" >&2
