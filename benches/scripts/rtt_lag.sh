#!/usr/bin/env bash
# Confirm lag and commit latency against network distance (issue 13, item
# 6; papers/performance.md, "Confirm lag against distance").
#
# Each durability follower (5, W=3) and one read replica run in a network
# namespace of their own, joined to the root namespace by a veth pair; the
# primary and the client run in the root namespace. This kernel has no
# netem, so distance is a userspace delay proxy (benches/src/bin/
# delay_proxy.rs) holding every byte RTT/2 in each direction: the primary
# dials each follower through it, and the replica dials the primary (and
# the followers it catches up from) through it. So every replication path
# has the chosen RTT; the client talks to the primary's HTTP API directly.
#
# For each RTT (RTTS, default "0 5 20 80" ms) a fresh cluster starts, a
# probe checks the path's RTT through the proxy, and one client sends
# INSERTs of 100 bytes, one per transaction, for SECONDS_EACH (default 10)
# seconds; the replica logs every confirm lag (leader's quorum instant to
# visible on the replica, same machine clock). The fsync floor (pwrite of
# 4 KiB + fdatasync) and the shared-disk floor (W-th of 5 concurrent ones)
# are measured before each cluster starts, on the same disk. Prints a
# table with the targets (confirm lag <= RTT + 1 ms; commit <= W-th
# follower RTT + fsync floor + 1 ms, with the RTTs the probe measured: one
# path's for the lag, the W-th quickest of the five followers' paths' round
# trips started together for the commit) and writes OUT_DIR/rtt-lag.csv and
# OUT_DIR/rtt-lag.svg.
#
# Needs root (ip netns, veth) and the release binaries:
#
#   cargo build --release -p walrelay-engine -p walrelay-benches \
#       --bin walrelay --bin delay_proxy --bin rtt_probe
#   benches/scripts/rtt_lag.sh | tee papers/performance-rtt.txt
#
# Not part of CI. Every wait is bounded; every process it starts is stopped
# by PID, and the namespaces and veth pairs it made are deleted, on exit,
# error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

RTTS=${RTTS:-"0 5 20 80"}
# Options added to `walrelay primary` (e.g. "--eager-followers 5").
PRIMARY_ARGS=${PRIMARY_ARGS:-}
SECONDS_EACH=${SECONDS_EACH:-10}
# A directory for each RTT's commit latencies, one a line in order
# (commits-<RTT>ms.txt), to line the slow ones up with the log's rolls.
COMMITS_DIR=${COMMITS_DIR:-}
[ -z "$COMMITS_DIR" ] || mkdir -p "$COMMITS_DIR"
FLOOR_ITERS=${FLOOR_ITERS:-2000}
PORT=${PORT:-7700}
OUT_DIR=${OUT_DIR:-papers}
TARGET=${CARGO_TARGET_DIR:-target}/release
BIN=$TARGET/walrelay
PROXY=$TARGET/delay_proxy
PROBE=$TARGET/rtt_probe
# Namespaces wrl-f0..wrl-f4 (followers) and wrl-rep (replica); veth wrlN in
# the root namespace, wrlNp inside; subnet $NET.N.0/30 (.1 root, .2 inside).
NS=wrl
NET=10.213
REPLICA_NS=5

for b in "$BIN" "$PROXY" "$PROBE"; do
  [ -x "$b" ] || { echo "no $b: see the build command at the top of $0" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "$0 needs root (ip netns, veth pairs)" >&2; exit 1; }
for n in $(ip netns list | awk '{print $1}'); do
  case $n in "$NS"-*)
    echo "namespace $n exists (an earlier run?); remove it first: ip netns del $n" >&2
    exit 1 ;;
  esac
done

# On the disk (not a tmpfs), so the followers' fsyncs are real ones.
WORK=$(mktemp -d "${WORK_ROOT:-/var/tmp}/rtt_lag.XXXXXX")
PIDS=()  # every process started and not yet stopped
NSES=()  # namespaces made
LINKS=() # root ends of the veth pairs made (deleting one deletes both)

# stop_pids: TERM, at most 15 s (a primary waits for its last commits to
# be confirmed), then KILL.
source benches/scripts/lib.sh
STOP_WAIT_S=15
forget() { # removes PIDs from PIDS once stopped
  local keep=() p q
  for p in "${PIDS[@]}"; do
    for q in "$@"; do [ "$p" = "$q" ] && continue 2; done
    keep+=("$p")
  done
  PIDS=("${keep[@]}")
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ ${#PIDS[@]} -gt 0 ] && stop_pids "${PIDS[@]}"
  for l in "${LINKS[@]}"; do ip link del "$l" 2>/dev/null || true; done
  for n in "${NSES[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  if [ "$rc" != 0 ] && [ -z "${KEEP:-}" ]; then
    # What failed, before the logs go.
    for f in "$WORK"/rtt-*/*.log; do
      [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }
    done
  fi
  if [ -n "${KEEP:-}" ]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Namespace $1 with a veth pair numbered $2.
make_ns() {
  local ns=$1 i=$2
  ip netns add "$ns"
  NSES+=("$ns")
  ip link add "$NS$i" type veth peer name "$NS${i}p"
  LINKS+=("$NS$i")
  ip link set "$NS${i}p" netns "$ns"
  ip addr add "$NET.$i.1/30" dev "$NS$i"
  ip link set "$NS$i" up
  ip -n "$ns" addr add "$NET.$i.2/30" dev "$NS${i}p"
  ip -n "$ns" link set "$NS${i}p" up
  ip -n "$ns" link set lo up
}

# Waits at most $3 s for file $1 to contain $2; fails if PID $4 died.
wait_for() {
  local file=$1 text=$2 secs=$3 pid=$4
  for _ in $(seq 1 $((secs * 20))); do
    grep -qs -- "$text" "$file" && return 0
    kill -0 "$pid" 2>/dev/null || { echo "process $pid exited; $file:" >&2; tail -5 "$file" >&2; return 1; }
    sleep 0.05
  done
  echo "timed out waiting for '$text' in $file" >&2
  return 1
}

# Field $1 of a key=value line $2.
field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$2"; }

for i in 0 1 2 3 4; do make_ns "$NS-f$i" "$i"; done
make_ns "$NS-rep" "$REPLICA_NS"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/cluster.key")
echo "namespaces: ${NSES[*]}; work in $WORK" >&2

CSV=$WORK/rtt-lag.csv
echo "rtt_ms,path_rtt_p50_us,path_rtt_p99_us,wth_rtt_p50_us,wth_rtt_p99_us,commits,commit_p50_us,commit_p99_us,http_floor_p50_us,http_floor_p99_us,lags,lag_p50_us,lag_p99_us,fsync_p50_us,fsync_p99_us,shared_disk_p50_us,shared_disk_p99_us" >"$CSV"

run_one() {
  local rtt=$1 d=$WORK/rtt-$1 i
  mkdir -p "$d"
  local key=(--cluster-key "$WORK/cluster.key")
  local primary_followers=() replica_followers=() routes=()
  for i in 0 1 2 3 4; do
    primary_followers+=("127.0.0.1:$((PORT + i))")
    replica_followers+=("$NET.$REPLICA_NS.1:$((PORT + i))")
    routes+=("127.0.0.1:$((PORT + i))=$NET.$i.2:7000" "$NET.$REPLICA_NS.1:$((PORT + i))=$NET.$i.2:7000")
  done
  routes+=("$NET.$REPLICA_NS.1:$((PORT + 10))=127.0.0.1:$((PORT + 10))")
  # The probe's paths: root namespace to an echo server beside follower 0
  # (the path RTT), and to one beside each follower (the W-th of their
  # round trips started together: what a quorum that far away waits for).
  routes+=("127.0.0.1:$((PORT + 9))=$NET.0.2:7001")
  local echoes=()
  for i in 0 1 2 3 4; do
    routes+=("127.0.0.1:$((PORT + 20 + i))=$NET.$i.2:7001")
    echoes+=("127.0.0.1:$((PORT + 20 + i))")
  done
  local pids=()

  # The floors just before this RTT's cluster starts, on the disk the
  # followers use: the machine is shared, and its disk's speed drifts.
  local floor
  floor=$("$PROBE" floor "$d" "$FLOOR_ITERS")
  "$PROXY" $((rtt * 500)) "${routes[@]}" >"$d/proxy.log" 2>&1 &
  PIDS+=($!) && pids+=($!)
  wait_for "$d/proxy.log" "delay_proxy:" 10 $!
  for i in 0 1 2 3 4; do
    ip netns exec "$NS-f$i" "$PROBE" echo "$NET.$i.2:7001" >"$d/echo-$i.log" 2>&1 &
    PIDS+=($!) && pids+=($!)
  done
  for i in 0 1 2 3 4; do
    ip netns exec "$NS-f$i" "$BIN" follower --listen "$NET.$i.2:7000" \
      --dir "$d/follower-$i" "${key[@]}" >"$d/follower-$i.log" 2>&1 &
    PIDS+=($!) && pids+=($!)
    wait_for "$d/follower-$i.log" " listening" 20 $!
  done
  local followers_csv
  followers_csv=$(IFS=,; echo "${primary_followers[*]}")
  # shellcheck disable=SC2086 # PRIMARY_ARGS is a list of options
  "$BIN" primary --dir "$d/primary" --followers "$followers_csv" \
    --listen "127.0.0.1:$((PORT + 10))" --http "127.0.0.1:$((PORT + 11))" --insecure \
    ${PRIMARY_ARGS:-} "${key[@]}" >"$d/primary.log" 2>&1 &
  local primary=$!
  PIDS+=($!)
  wait_for "$d/primary.log" "primary HTTP at" 60 $primary
  followers_csv=$(IFS=,; echo "${replica_followers[*]}")
  ip netns exec "$NS-rep" "$BIN" replica --dir "$d/replica" \
    --leader "$NET.$REPLICA_NS.1:$((PORT + 10))" --followers "$followers_csv" \
    --confirm-lag-log "$d/lags" "${key[@]}" >"$d/replica.log" 2>&1 &
  PIDS+=($!) && pids+=($!)
  wait_for "$d/replica.log" "following" 30 $!

  # About 2 s of round trips (at least 20), after the proxy dialed.
  local n=500
  [ "$rtt" -gt 0 ] && n=$((2000 / rtt))
  [ "$n" -lt 20 ] && n=20
  local path wth load
  path=$("$PROBE" ping "127.0.0.1:$((PORT + 9))" "$n")
  wth=$("$PROBE" ping "$(IFS=,; echo "${echoes[*]}")" "$n")
  local commits_to=${COMMITS_DIR:+$COMMITS_DIR/commits-${rtt}ms.txt}
  load=$(RTT_PROBE_COMMITS_TO=$commits_to "$PROBE" load "127.0.0.1:$((PORT + 11))" "$SECONDS_EACH" "$d/lags")
  echo "rtt=${rtt}ms $path $wth $load $floor"

  # The primary first: it stops its HTTP and waits for its last commits
  # to be confirmed, which needs the followers and the proxy still up.
  stop_pids "$primary" && forget "$primary"
  grep -h "stopped cleanly\|could not stop" "$d/primary.log" >&2 || true
  stop_pids "${pids[@]}" && forget "${pids[@]}"

  local f
  local row=$rtt
  for f in path_rtt_p50_us path_rtt_p99_us; do row+=",$(field $f "$path")"; done
  for f in wth_rtt_p50_us wth_rtt_p99_us; do row+=",$(field $f "$wth")"; done
  for f in commits commit_p50_us commit_p99_us http_floor_p50_us http_floor_p99_us lags lag_p50_us lag_p99_us; do
    row+=",$(field $f "$load")"
  done
  for f in fsync_p50_us fsync_p99_us shared_disk_p50_us shared_disk_p99_us; do row+=",$(field $f "$floor")"; done
  echo "$row" >>"$CSV"
}

for rtt in $RTTS; do
  echo "RTT $rtt ms: starting a cluster, then $SECONDS_EACH s of load (load average $(cut -d" " -f1-3 /proc/loadavg))" >&2
  run_one "$rtt"
done

mkdir -p "$OUT_DIR"
cp "$CSV" "$OUT_DIR/rtt-lag.csv"
echo
python3 benches/scripts/plot_rtt_lag.py "$OUT_DIR/rtt-lag.csv" "$OUT_DIR/rtt-lag.svg"
