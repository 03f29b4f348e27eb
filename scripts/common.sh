# Shared by scripts/demo.sh and scripts/test.sh: repository root, dependency
# install, and the daemon helpers for a local cluster on loopback.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
"$ROOT/scripts/install-deps.sh"

PIDS=()

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
}

stop_daemons() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  PIDS=()
}
