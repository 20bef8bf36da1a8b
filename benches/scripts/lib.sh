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
