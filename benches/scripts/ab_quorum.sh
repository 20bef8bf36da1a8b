#!/usr/bin/env bash
# Two builds of the quorum bench against each other, in paired rounds.
#
#   benches/scripts/ab_quorum.sh A_BIN B_BIN [ROUNDS] [SESSIONS]
#
# A_BIN and B_BIN are quorum bench executables (`cargo bench -p
# walrelay-benches --bench quorum --no-run` prints the path; copy it aside
# before building the other side). Each round runs both, in an order that
# alternates by round, in their 10 s profiling phase at SESSIONS sessions
# (default 16), and prints each one's commits/s and CPU per commit (every
# node of the in-process cluster) and the round's ratio B / A; then the
# median ratios over the ROUNDS rounds (default 6). On this machine one
# binary's throughput moves by 2x within an hour (papers/performance-log.md,
# run 12): a round's two runs share that moment, single runs do not.
#
# Not part of CI. Each run is one bounded process (the bench stops its
# phase after 10 s); its cluster lives in a temporary directory under
# WALRELAY_BENCH_DIR (default: a fresh one under /tmp), removed at the end.
set -euo pipefail
# median, quorum_profile (lib.sh)
source "$(dirname "$0")/lib.sh"

if [ $# -lt 2 ]; then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
A_BIN=$(realpath "$1")
B_BIN=$(realpath "$2")
ROUNDS=${3:-6}
SESSIONS=${4:-16}
WORK=$(mktemp -d /tmp/ab_quorum.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
export WALRELAY_BENCH_DIR=${WALRELAY_BENCH_DIR:-$WORK}

one_run() { quorum_profile "$1" "$SESSIONS"; }

RATE_RATIOS=()
CPU_RATIOS=()
printf '%-6s %18s %18s %10s %10s\n' round "A commits/s, us" "B commits/s, us" "rate B/A" "CPU B/A"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then
    read -r A_RATE A_CPU <<<"$(one_run "$A_BIN")"
    read -r B_RATE B_CPU <<<"$(one_run "$B_BIN")"
  else
    read -r B_RATE B_CPU <<<"$(one_run "$B_BIN")"
    read -r A_RATE A_CPU <<<"$(one_run "$A_BIN")"
  fi
  RR=$(awk -v a="$A_RATE" -v b="$B_RATE" 'BEGIN { printf "%.3f", a ? b / a : 0 }')
  CR=$(awk -v a="$A_CPU" -v b="$B_CPU" 'BEGIN { printf "%.3f", a ? b / a : 0 }')
  RATE_RATIOS+=("$RR")
  CPU_RATIOS+=("$CR")
  printf '%-6s %18s %18s %9sx %9sx\n' "$r" "$A_RATE, $A_CPU" "$B_RATE, $B_CPU" "$RR" "$CR"
done
printf 'median over %s rounds at %s sessions: commits/s B/A %sx, CPU per commit B/A %sx\n' \
  "$ROUNDS" "$SESSIONS" "$(median "${RATE_RATIOS[@]}")" "$(median "${CPU_RATIOS[@]}")"
