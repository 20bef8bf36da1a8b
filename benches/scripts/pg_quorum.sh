#!/usr/bin/env bash
# The peer comparison of issue 13, in one run on one machine:
#
#   PostgreSQL 15 (Debian's package): a primary and 5 streaming standbys on
#   127.0.0.1, synchronous_standby_names = 'ANY 3 (s1..s5)',
#   synchronous_commit = on; pgbench over TCP on walrelay's quorum workload
#   (one INSERT of a 100-byte value per transaction): 1 client (p50/p99 from
#   pgbench's per-transaction log), 16 clients (tps), and 1 client with
#   remote_apply (p50);
#
#   walrelay, same workload: in process (`cargo bench --bench quorum`) and
#   over HTTP (`walrelay up --writers 0`, wrk with keep-alive: 1 connection
#   for latency, 16 for throughput, plus an empty request, the HTTP floor);
#
# and prints both side by side. Not part of CI. Every wait is bounded and
# every server is stopped by PID (also on error or Ctrl-C).
#
#   benches/scripts/pg_quorum.sh            # 20 s per measurement
#   SECONDS_EACH=5 benches/scripts/pg_quorum.sh
#   ONLY=pg benches/scripts/pg_quorum.sh    # PostgreSQL's side alone
#   PAIRED_ROUNDS=5 benches/scripts/pg_quorum.sh
#
# PAIRED_ROUNDS=N adds N rounds at the end, with both systems up: each
# round measures 16-client throughput on PostgreSQL (pgbench), walrelay
# over HTTP (wrk) and walrelay in process (the quorum bench's 10 s
# profiling phase), in an order that rotates by round, and prints the
# round's ratios to PostgreSQL; then the median ratio over the rounds. A
# slow spell of the machine then lands on both sides of a ratio instead
# of on one system's single measurement.
set -euo pipefail
cd "$(dirname "$0")/../.."

SECONDS_EACH=${SECONDS_EACH:-20}
PAIRED_ROUNDS=${PAIRED_ROUNDS:-0}
BASE_PORT=${BASE_PORT:-55400}
WR_PORT=${WR_PORT:-7600}
WORK=$(mktemp -d /tmp/pg_quorum.XXXXXX)
PIDS=()    # walrelay's processes
PG_DIRS=() # PostgreSQL data directories (their postmaster.pid names the server)

# stop_pids: TERM, at most 10 s, then KILL.
source benches/scripts/lib.sh
stop_pg() {
  local pids=()
  for d in "${PG_DIRS[@]}"; do
    [ -f "$d/postmaster.pid" ] && pids+=("$(head -1 "$d/postmaster.pid")")
  done
  stop_pids "${pids[@]}"
  PG_DIRS=()
}
stop_all() {
  stop_pg
  stop_pids "${PIDS[@]}"
  rm -rf "$WORK"
}
trap stop_all EXIT INT TERM

if ! ls /usr/lib/postgresql/15/bin/initdb >/dev/null 2>&1; then
  # Debian's package, kept from starting its own cluster.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq && apt-get install -y -qq postgresql-15
  rm -f /usr/sbin/policy-rc.d
fi
need_wrk
PG=/usr/lib/postgresql/15/bin

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
chown postgres:postgres "$WORK" 2>/dev/null || true

# Waits (at most $2 tenths of a second) until command $1 succeeds.
wait_for() {
  for _ in $(seq 1 "$2"); do
    if eval "$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for: $1" >&2
  return 1
}

start_pg() { # dir port
  as_pg "$PG/postgres" -D "$1" -p "$2" -k "$WORK" >"$1.log" 2>&1 &
  PG_DIRS+=("$1")
  # A server that does not answer says why in its log.
  wait_for "as_pg $PG/pg_isready -h 127.0.0.1 -p $2" 300 || {
    tail -20 "$1.log" >&2
    return 1
  }
}

echo "== PostgreSQL 15: a primary and 5 standbys (ANY 3, synchronous_commit=on) in $WORK"
P0=$BASE_PORT
as_pg "$PG/initdb" -D "$WORK/p0" -U postgres -A trust >/dev/null
cat >>"$WORK/p0/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 10
synchronous_standby_names = 'ANY 3 (s1, s2, s3, s4, s5)'
synchronous_commit = on
fsync = on
shared_buffers = 128MB
EOF
echo "host replication postgres 127.0.0.1/32 trust" >>"$WORK/p0/pg_hba.conf"
start_pg "$WORK/p0" "$P0"
for i in 1 2 3 4 5; do
  as_pg "$PG/pg_basebackup" -h 127.0.0.1 -p "$P0" -U postgres -D "$WORK/s$i" -R -X stream >/dev/null
  sed -i "s/^primary_conninfo = '/primary_conninfo = 'application_name=s$i /" "$WORK/s$i/postgresql.auto.conf"
  start_pg "$WORK/s$i" $((P0 + i))
done
PSQL=("$PG/psql" -h 127.0.0.1 -p "$P0" -U postgres -d postgres -qtAX)
wait_for "[ \$(as_pg ${PSQL[*]} -c \"SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'quorum'\") = 5 ]" 600
as_pg "${PSQL[@]}" -c "CREATE TABLE kv(id bigserial PRIMARY KEY, v text)"
VALUE=$(printf 'x%.0s' $(seq 1 100))
echo "INSERT INTO kv(v) VALUES ('$VALUE');" >"$WORK/insert.sql"
chown postgres:postgres "$WORK/insert.sql" 2>/dev/null || true

pgbench() { (cd "$WORK" && as_pg env PGOPTIONS="${PGOPTIONS:-}" "$PG/pgbench" -h 127.0.0.1 -p "$P0" -U postgres -n -f "$WORK/insert.sql" "$@" postgres); }
# p50 and p99 (microseconds) of pgbench's per-transaction logs in $WORK.
log_percentiles() {
  cat "$WORK"/pgbench_log.* | awk '{print $3}' | sort -n | awk '
    { a[NR] = $1 } END { printf "%d %d", a[int(NR * 0.50)], a[int(NR * 0.99)] }'
  rm -f "$WORK"/pgbench_log.*
}
pgbench -c 1 -T "$SECONDS_EACH" -l >/dev/null
read -r PG_P50 PG_P99 <<<"$(log_percentiles)"
PG_TPS=$(pgbench -c 16 -j 2 -T "$SECONDS_EACH" | awk '/^tps/ {printf "%d", $3}')
PGOPTIONS="-c synchronous_commit=remote_apply" pgbench -c 1 -T "$SECONDS_EACH" -l >/dev/null
read -r PG_RA_P50 _ <<<"$(log_percentiles)"
# The paired rounds need PostgreSQL again at the end; idle meanwhile.
[ "$PAIRED_ROUNDS" -gt 0 ] && [ "${ONLY:-}" != pg ] || stop_pg
if [ "${ONLY:-}" = pg ]; then
  printf 'PostgreSQL 15: 1 client p50 %s us p99 %s us; 16 clients %s tps; remote_apply p50 %s us\n' \
    "$PG_P50" "$PG_P99" "$PG_TPS" "$PG_RA_P50"
  exit 0
fi

echo "== walrelay in process: cargo bench --bench quorum"
QUORUM=$(WALRELAY_BENCH_STEADY=${WALRELAY_BENCH_STEADY:-1} cargo bench -q --profile "$PROFILE" -p walrelay-benches --bench quorum 2>/dev/null)
echo "$QUORUM"

echo "== walrelay over HTTP: walrelay up --writers 0, wrk (keep-alive)"
cargo build -q --profile "$PROFILE" -p walrelay-engine --bin walrelay
cargo build -q --profile "$PROFILE" -p walrelay-benches --bin rtt_probe
./$BUILT/walrelay up --dir "$WORK/up" --base-port "$WR_PORT" --writers 0 --insecure \
  --fleet-nodes 0 --seconds $((SECONDS_EACH * 4 + 60 + PAIRED_ROUNDS * (2 * SECONDS_EACH + 40))) \
  >"$WORK/up.log" 2>&1 &
PIDS+=($!)
URL="http://127.0.0.1:$((WR_PORT + 10))/v1/databases/main/query"
kv_ready "$URL"
wrk_post_script "$WORK/insert.lua" "$(insert_body)"
wrk_post_script "$WORK/empty.lua" '{"sql":"SELECT 1"}'
# wrk's --latency percentiles, in microseconds: "p50 p99".
wrk_latency() {
  wrk -t1 -c1 -d"${SECONDS_EACH}s" --latency -s "$1" "$URL" | awk '
    function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; return v * 1000000 }
    $1 == "50%" { p50 = us($2) } $1 == "99%" { p99 = us($2) }
    END { printf "%d %d", p50, p99 }'
}
read -r HTTP_FLOOR_P50 _ <<<"$(wrk_latency "$WORK/empty.lua")"
read -r HTTP_P50 HTTP_P99 <<<"$(wrk_latency "$WORK/insert.lua")"
HTTP_RPS=$(wrk -t2 -c16 -d"${SECONDS_EACH}s" -s "$WORK/insert.lua" "$URL" | awk '/^Requests\/sec/ {printf "%d", $2}')

# Reads on the region-a replica: a point read by key against the same
# server's empty request (its own HTTP floor).
wrk_post_script "$WORK/point.lua" '{"sql":"SELECT v FROM kv WHERE id = ?1","params":[1]}'
PRIMARY_URL=$URL
URL="http://127.0.0.1:$((WR_PORT + 11))/v1/databases/main/query"
read -r REPLICA_FLOOR_P50 _ <<<"$(wrk_latency "$WORK/empty.lua")"
read -r REPLICA_READ_P50 REPLICA_READ_P99 <<<"$(wrk_latency "$WORK/point.lua")"
# The same on one connection, alternating: an empty request, then a
# point read of a random key of the whole table; both see the same load.
READS=$(./$BUILT/rtt_probe read "127.0.0.1:$((WR_PORT + 11))" "$SECONDS_EACH")
echo "$READS"
URL=$PRIMARY_URL
# Commit-ack -> visible on that replica, read with the INSERT's bookmark.
VISIBLE=$(./$BUILT/rtt_probe visible "127.0.0.1:$((WR_PORT + 10))" "127.0.0.1:$((WR_PORT + 11))" "$SECONDS_EACH")
echo "$VISIBLE"
kv() { echo "$VISIBLE" | grep -o "$1=[0-9.]*" | cut -d= -f2; }

field() { echo "$QUORUM" | grep -m1 "$1" | grep -o "$2 *[0-9.]*" | grep -o '[0-9.]*$'; }
WR_P50=$(field "commit latency, 1 session" p50)
WR_P99=$(field "commit latency, 1 session" p99)
WR_TPS=$(echo "$QUORUM" | awk '/throughput, 16 sessions/ {printf "%d", $4}')

echo
echo "== side by side (one INSERT of a 100-byte value per transaction, W = 3 of 5)"
printf '%-34s %14s %14s %14s\n' "" "PostgreSQL 15" "walrelay" "walrelay HTTP"
printf '%-34s %14s %14s %14s\n' "1 session p50 (us)" "$PG_P50" "${WR_P50:-?}" "$HTTP_P50"
printf '%-34s %14s %14s %14s\n' "1 session p99 (us)" "$PG_P99" "${WR_P99:-?}" "$HTTP_P99"
printf '%-34s %14s %14s %14s\n' "16 sessions (commits/s)" "$PG_TPS" "${WR_TPS:-?}" "$HTTP_RPS"
printf '%-34s %14s\n' "remote_apply 1 session p50 (us)" "$PG_RA_P50"
printf '%-34s %14s %14s %14s\n' "HTTP floor: empty request p50 (us)" "" "" "$HTTP_FLOOR_P50"
printf '%-34s %14s %14s %14s\n' "replica: empty request p50 (us)" "" "" "$REPLICA_FLOOR_P50"
printf '%-34s %14s %14s %14s\n' "replica: point read p50/p99 (us)" "" "" "$REPLICA_READ_P50/$REPLICA_READ_P99"
rd() { echo "$READS" | grep -o "$1=[0-9.]*" | cut -d= -f2; }
printf '%-34s %14s %14s %14s\n' "replica, alternating: empty/point" "" "" "$(rd floor_p50_us)/$(rd point_p50_us)"
printf '%-34s %14s %14s %14s\n' "  p50 (us), random keys; ratio" "" "" "$(rd ratio_p50)x"
printf '%-34s %14s %14s %14s\n' "ack -> visible p50 (us)" "$PG_RA_P50 (ra)" "" "$(kv ack_to_visible_p50_us)"
printf '%-34s %14s %14s %14s\n' "visible on first read (%)" "" "" "$(kv visible_pct)"

[ "$PAIRED_ROUNDS" -gt 0 ] || exit 0
echo
echo "== paired rounds: 16 clients each, PostgreSQL / walrelay HTTP / walrelay in process"
QUORUM_BIN=$(pwd)/$(ls -t "$BUILT"/deps/quorum-* | grep -v '\.d$' | head -1)
pg_round() { pgbench -c 16 -j 2 -T "$SECONDS_EACH" | awk '/^tps/ {printf "%d", $3}'; }
http_round() { wrk -t2 -c16 -d"${SECONDS_EACH}s" -s "$WORK/insert.lua" "$URL" | awk '/^Requests\/sec/ {printf "%d", $2}'; }
inproc_round() { (cd "$WORK" && quorum_profile "$QUORUM_BIN" 16) | cut -d' ' -f1; }
RATIOS_HTTP=()
RATIOS_INPROC=()
printf '%-6s %14s %14s %14s %10s %10s\n' round "PostgreSQL" "walrelay HTTP" "in process" "HTTP/PG" "proc/PG"
for r in $(seq 1 "$PAIRED_ROUNDS"); do
  case $((r % 3)) in
    1) R_PG=$(pg_round); R_HTTP=$(http_round); R_IN=$(inproc_round) ;;
    2) R_HTTP=$(http_round); R_IN=$(inproc_round); R_PG=$(pg_round) ;;
    0) R_IN=$(inproc_round); R_PG=$(pg_round); R_HTTP=$(http_round) ;;
  esac
  RH=$(awk -v a="$R_HTTP" -v b="$R_PG" 'BEGIN { printf "%.2f", b ? a / b : 0 }')
  RI=$(awk -v a="$R_IN" -v b="$R_PG" 'BEGIN { printf "%.2f", b ? a / b : 0 }')
  RATIOS_HTTP+=("$RH")
  RATIOS_INPROC+=("$RI")
  printf '%-6s %14s %14s %14s %9sx %9sx\n' "$r" "$R_PG" "$R_HTTP" "$R_IN" "$RH" "$RI"
done
printf 'median over %s rounds: walrelay HTTP / PostgreSQL %sx, walrelay in process / PostgreSQL %sx\n' \
  "$PAIRED_ROUNDS" "$(median "${RATIOS_HTTP[@]}")" "$(median "${RATIOS_INPROC[@]}")"
