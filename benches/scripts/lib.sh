# Shared by the benchmark scripts (sourced after they cd to the repo root).

# Stops each PID: TERM, then at most STOP_WAIT_S seconds (default 10) for
# it to exit, then KILL; reaps it if it is this shell's child.
stop_pids() {
  local tenths=$(( ${STOP_WAIT_S:-10} * 10 ))
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for _ in $(seq 1 "$tenths"); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

# The median of its numeric arguments (the lower one of the middle two).
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# "commits/s cpu_us" of the quorum bench's profiling phase: executable $1
# run with WALRELAY_BENCH_PROFILE=$2 sessions (10 s), each figure the mean
# of the phase's lines ("N sessions: R commits/s, CPU per commit C us, ...").
quorum_profile() {
  WALRELAY_BENCH_PROFILE=$2 "$1" --bench 2>/dev/null | awk '
    / sessions: / {
      for (i = 1; i <= NF; i++) {
        if ($i == "commits/s,") r += $(i - 1)
        if ($i == "commit") c += $(i + 1)
      }
      n++
    }
    END { if (n) printf "%d %.1f", r / n, c / n; else printf "0 0" }'
}

# The benchmarks' write as the HTTP API's JSON body: one INSERT of a
# 100-byte value into `kv` (the table kv_ready creates), random bytes as
# in the in-process bench (the worst case for compressed records).
insert_body() {
  printf '{"sql":"INSERT INTO kv(v) VALUES (randomblob(100))"}'
}

# Writes wrk's script for a keep-alive POST of JSON body $2 to file $1 (the
# body holds no single quote).
wrk_post_script() {
  printf '%s\n' 'wrk.method = "POST"' 'wrk.headers["content-type"] = "application/json"' \
    "wrk.body = '$2'" >"$1"
}

# Whether command $1 is installed.
need() { command -v "$1" >/dev/null 2>&1; }

# Installs wrk from Debian's packages where it is missing.
need_wrk() { need wrk || { apt-get update -qq && apt-get install -y -qq wrk; }; }

# The cargo profile the measurements build with (Cargo.toml's `perf`: fat
# LTO), and where its binaries land.
PROFILE=${WALRELAY_PROFILE:-perf}
BUILT=target/$PROFILE

# The `walrelay` binary to measure: WALRELAY_BIN if set, else the
# profile's build (built here). Prints its absolute path.
walrelay_bin() {
  if [ -n "${WALRELAY_BIN:-}" ]; then
    realpath "$WALRELAY_BIN"
  else
    cargo build -q --profile "$PROFILE" -p walrelay-engine --bin walrelay
    realpath "./$BUILT/walrelay"
  fi
}

# Waits (at most 60 s) until the `/query` endpoint $1 answers, then
# creates the benchmarks' table `kv` there; fails if it never answers.
kv_ready() {
  local _
  for _ in $(seq 1 600); do
    if curl -sf -X POST "$1" -d '{"sql":"SELECT 1"}' >/dev/null 2>&1; then
      curl -sf -X POST "$1" -d '{"sql":"CREATE TABLE IF NOT EXISTS kv(id INTEGER PRIMARY KEY, v TEXT)"}' >/dev/null
      return
    fi
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2
  return 1
}
