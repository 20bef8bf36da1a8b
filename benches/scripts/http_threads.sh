#!/usr/bin/env bash
# Where a request's CPU goes over HTTP: per role and thread of `walrelay up`.
#
#   benches/scripts/http_threads.sh [SECONDS] [CONNECTIONS]
#
# Starts `walrelay up --writers 0 --insecure --fleet-nodes 0` (the `perf`
# profile's build; extra `up` options from UP_ARGS), loads it with wrk for SECONDS
# (default 10) on CONNECTIONS keep-alive connections (default 16), each
# request one INSERT of a 100-byte value (or the JSON body in BODY, such
# as '{"sql":"SELECT 1"}' for the HTTP floor's CPU), and prints the requests/s, the
# machine's CPU per request (/proc/stat: every process and the kernel's
# own threads, wrk included), then each walrelay thread kind's CPU and
# context switches per request (thread_cpu.py), the writes per group
# commit and how the groups spread by size (the primary's
# walrelay_group_commit_size histogram). papers/performance-log.md ("Tenth
# session") shows what it printed.
#
# WALRELAY_BIN=path runs that `walrelay` binary instead of building one
# (two builds against each other).
#
# Not part of CI. Every wait is bounded; `up` is stopped by its PID (it
# stops its children), also on error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/scripts/lib.sh

SECONDS_EACH=${1:-10}
CONNS=${2:-16}
PORT=${WALRELAY_PORT:-7700}
WORK=$(mktemp -d /tmp/http_threads.XXXXXX)
PIDS=()
cleanup() { stop_pids "${PIDS[@]}"; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

need_wrk
BIN=$(walrelay_bin)
# shellcheck disable=SC2086 # UP_ARGS is a list of options
"$BIN" up --dir "$WORK/up" --base-port "$PORT" --writers 0 --insecure \
  --fleet-nodes 0 --seconds $((SECONDS_EACH + 120)) ${UP_ARGS:-} >"$WORK/up.log" 2>&1 &
PIDS+=($!)
URL="http://127.0.0.1:$((PORT + 10))/v1/databases/main/query"
kv_ready "$URL"
BODY=${BODY:-$(insert_body)}
# The body must answer 200: a typo would measure error answers.
curl -sf -X POST "$URL" -d "$BODY" >/dev/null
wrk_post_script "$WORK/insert.lua" "$BODY"
groups() {
  curl -s "http://127.0.0.1:$((PORT + 10))/metrics" |
    awk '/^walrelay_group_commits_total/ { g = $2 } /^walrelay_group_commit_writes_total/ { w = $2 }
         END { print g + 0, w + 0 }'
}
# "le cumulative" per line: the primary's histogram of writes per group.
sizes() {
  curl -s "http://127.0.0.1:$((PORT + 10))/metrics" |
    awk -F'[{}]' '/^walrelay_group_commit_size_bucket/ {
      split($2, a, ",le=\""); sub(/".*/, "", a[2]); print a[2], $3 + 0 }'
}
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

wrk -t"$(( CONNS < 2 ? 1 : 2 ))" -c"$CONNS" -d2s -s "$WORK/insert.lua" "$URL" >/dev/null # warm up
read -r G0 W0 <<<"$(groups)"
S0=$(sizes)
B0=$(busy_ticks)
python3 benches/scripts/thread_cpu.py snap "$WORK/before.json"
OUT=$(wrk -t"$(( CONNS < 2 ? 1 : 2 ))" -c"$CONNS" -d"${SECONDS_EACH}s" -s "$WORK/insert.lua" "$URL")
python3 benches/scripts/thread_cpu.py snap "$WORK/after.json"
B1=$(busy_ticks)
read -r G1 W1 <<<"$(groups)"
S1=$(sizes)
REQS=$(echo "$OUT" | awk '/requests in/ { print $1 }')
RPS=$(echo "$OUT" | awk '/^Requests\/sec/ { print $2 }')
TICK_US=$((1000000 / $(getconf CLK_TCK)))
echo "$RPS requests/s on $CONNS connections over ${SECONDS_EACH}s;" \
  "machine CPU per request $(awk -v t=$((B1 - B0)) -v u=$TICK_US -v r="$REQS" 'BEGIN { printf "%.1f", t * u / r }') us;" \
  "$(awk -v g=$((G1 - G0)) -v w=$((W1 - W0)) 'BEGIN { printf "%.1f", g ? w / g : 0 }') writes per group"
# Each bucket's share of the groups in the run (bound: at most that many writes).
paste -d' ' <(echo "$S0") <(echo "$S1") | awk '
  { le[NR] = $1; c[NR] = $4 - $2 }
  END {
    line = "groups by writes (at most):"
    for (i = 1; i <= NR; i++) {
      n = c[i] - (i > 1 ? c[i - 1] : 0)
      if (c[NR] > 0) line = line sprintf(" %s:%.0f%%", le[i], 100 * n / c[NR])
    }
    print line
  }'
python3 benches/scripts/thread_cpu.py diff "$WORK/before.json" "$WORK/after.json" "$REQS"
