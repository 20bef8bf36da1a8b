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
