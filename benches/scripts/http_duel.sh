#!/usr/bin/env bash
# Two `walrelay` builds against each other over HTTP, loaded at the same
# time, so that both meet the same machine.
#
#   benches/scripts/http_duel.sh A_BIN B_BIN [SECONDS] [CONNECTIONS] [ROUNDS]
#
# Each round starts two `walrelay up --writers 0 --insecure --fleet-nodes 0`
# clusters, one per build (their base ports swapped every other round),
# and loads both at once with one wrk each for SECONDS (default 10) on
# CONNECTIONS keep-alive connections (default 16), each request one INSERT
# of a 100-byte value (or the JSON body in BODY). It prints each round's
# requests/s and B/A, then the median B/A over ROUNDS (default 6).
# UP_ARGS_A and UP_ARGS_B are extra `up` options for each side: one build
# given twice with two settings compares the settings.
#
# Why at once: this machine's speed drifts by tens of percent within
# minutes, so two builds measured one after the other differ by more than
# most levers do. Run at the same moment they share every drift; A
# against A reads 0.99-1.02x (papers/performance-log.md, "Twenty-third
# session"). The two clusters share the two vCPUs, so the rates are each
# about half of one cluster's alone: the ratio is the measurement.
#
# Not part of CI. Every wait is bounded; each `up` is stopped by its PID
# (it stops its children), also on error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/scripts/lib.sh

A_BIN=$(realpath "$1")
B_BIN=$(realpath "$2")
SECONDS_EACH=${3:-10}
CONNS=${4:-16}
ROUNDS=${5:-6}
PORT=${WALRELAY_PORT:-7700}
WORK=$(mktemp -d /tmp/http_duel.XXXXXX)
PIDS=()
cleanup() { stop_pids "${PIDS[@]}"; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

need_wrk
BODY=${BODY:-$(insert_body)}
wrk_post_script "$WORK/body.lua" "$BODY"
RATIOS=()
for round in $(seq 1 "$ROUNDS"); do
  if ((round % 2)); then PA=$PORT PB=$((PORT + 100)); else PA=$((PORT + 100)) PB=$PORT; fi
  for side in a b; do
    if [ $side = a ]; then
      bin=$A_BIN port=$PA extra=${UP_ARGS_A:-}
    else
      bin=$B_BIN port=$PB extra=${UP_ARGS_B:-}
    fi
    # shellcheck disable=SC2086 # the extra options are a list
    "$bin" up --dir "$WORK/$side" --base-port "$port" --writers 0 --insecure \
      --fleet-nodes 0 --seconds $((SECONDS_EACH + 120)) $extra >"$WORK/$side.log" 2>&1 &
    PIDS+=($!)
  done
  URL_A="http://127.0.0.1:$((PA + 10))/v1/databases/main/query"
  URL_B="http://127.0.0.1:$((PB + 10))/v1/databases/main/query"
  kv_ready "$URL_A"
  kv_ready "$URL_B"
  # The body must answer 200: a typo would measure error answers.
  curl -sf -X POST "$URL_A" -d "$BODY" >/dev/null
  curl -sf -X POST "$URL_B" -d "$BODY" >/dev/null
  # Warm up both, then measure both at once.
  for d in 2 "$SECONDS_EACH"; do
    wrk -t1 -c"$CONNS" -d"${d}s" -s "$WORK/body.lua" "$URL_A" >"$WORK/wrk_a" &
    WA=$!
    wrk -t1 -c"$CONNS" -d"${d}s" -s "$WORK/body.lua" "$URL_B" >"$WORK/wrk_b"
    wait "$WA"
  done
  RA=$(awk '/^Requests\/sec/ { print $2 }' "$WORK/wrk_a")
  RB=$(awk '/^Requests\/sec/ { print $2 }' "$WORK/wrk_b")
  RATIO=$(awk -v a="$RA" -v b="$RB" 'BEGIN { printf "%.3f", b / a }')
  RATIOS+=("$RATIO")
  echo "round $round: A $RA requests/s, B $RB requests/s, B/A ${RATIO}x"
  stop_pids "${PIDS[@]}"
  PIDS=()
  rm -rf "$WORK/a" "$WORK/b"
done
echo "median B/A over $ROUNDS rounds: $(median "${RATIOS[@]}")x"
