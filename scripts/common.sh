# Shared by scripts/demo.sh, test.sh, fuzz.sh and sanitizers.sh: the
# repository root and the daemon helpers for a local cluster on loopback.
# Each script installs what it needs (scripts/install-deps.sh).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PIDS=()
NAMES=()

# wait_for_file FILE SECONDS: waits until FILE exists (a daemon's --port_file).
wait_for_file() {
  local file=$1 deadline=$((SECONDS + $2))
  while [[ ! -s $file ]]; do
    if ((SECONDS >= deadline)); then
      echo "timed out after $2 s waiting for $file" >&2
      return 1
    fi
    sleep 0.1
  done
}

# start_daemon NAME LOG ARGS...: starts a daemon in the background.
start_daemon() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  PIDS+=($!)
  NAMES+=("$name")
}

# stop_daemons: SIGTERM to each daemon in the reverse of the order they
# started — workers, then shards, then the coordinator, whom the others tell
# that they leave — each waited for (10 s, then SIGKILL, which is said).
stop_daemons() {
  local i pid
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid=${PIDS[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "${NAMES[i]} (pid $pid) did not stop within 10 s of SIGTERM: killed" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
  NAMES=()
}
