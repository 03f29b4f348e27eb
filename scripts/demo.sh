#!/usr/bin/env bash
# The main job: builds Downpour, starts a local cluster on loopback (one
# coordinator, two parameter shards, two workers), imports Fashion-MNIST,
# trains examples/fashion_mnist_mlp.pbtxt in SYNC mode with live progress, and
# prints one line: job <id> SUCCEEDED steps=<n> test_accuracy=<x> wall_s=<t>.
# The daemons keep checkpoints; the trained model is exported (PyTorch's
# layout) to out/demo-model.safetensors, with its spec and the job's status
# beside it (DEMO_EXPORT=0: not).
#   scripts/demo.sh [JOB_SPEC]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$ROOT/scripts/install-deps.sh"
SPEC=${1:-examples/fashion_mnist_mlp.pbtxt}
SHARDS=${DEMO_SHARDS:-2}
WORKERS=${DEMO_WORKERS:-2}
FASHION=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}

echo "demo: building (bazel, offline)..." >&2
if ! bazel build --noshow_progress --ui_event_filters=-info //coordinator:downpour-coordinator \
  //server:downpour-ps //worker:downpour-worker //client:downpourctl >&2; then
  echo "demo: build failed" >&2
  exit 1
fi
BIN=$(bazel info bazel-bin 2>/dev/null)
for b in coordinator/downpour-coordinator server/downpour-ps worker/downpour-worker client/downpourctl; do
  [[ -x $BIN/$b ]] || { echo "demo: build failed ($b missing)" >&2; exit 1; }
done

WORK=$(mktemp -d -t downpour-demo.XXXXXX)
cleanup() { stop_daemons; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'echo "demo: interrupted" >&2; exit 130' INT TERM

echo "demo: importing Fashion-MNIST from $FASHION..." >&2
"$BIN/client/downpourctl" dataset import --fashion_mnist="$FASHION" \
  --out_dir="$WORK/data/fashion-mnist" --shards=4 >&2

start_daemon coordinator "$WORK/coordinator.log" "$BIN/coordinator/downpour-coordinator" \
  --listen=127.0.0.1:0 --port_file="$WORK/coordinator.port" --state_dir="$WORK/state" \
  --checkpoint_root="$WORK/checkpoints" --metrics_listen=127.0.0.1:0
wait_for_file "$WORK/coordinator.port" 30
COORD=$(cat "$WORK/coordinator.port")
for i in $(seq 0 $((SHARDS - 1))); do
  start_daemon "ps$i" "$WORK/ps$i.log" "$BIN/server/downpour-ps" --listen=127.0.0.1:0 \
    --port_file="$WORK/ps$i.port" --coordinator="$COORD" --checkpoint_root="$WORK/checkpoints" \
    --metrics_listen=127.0.0.1:0
done
for i in $(seq 0 $((WORKERS - 1))); do
  start_daemon "worker$i" "$WORK/worker$i.log" "$BIN/worker/downpour-worker" \
    --listen=127.0.0.1:0 --port_file="$WORK/worker$i.port" --coordinator="$COORD" \
    --data_dir="$WORK/data" --metrics_listen=127.0.0.1:0
done
for i in $(seq 0 $((SHARDS - 1))); do wait_for_file "$WORK/ps$i.port" 30; done
for i in $(seq 0 $((WORKERS - 1))); do wait_for_file "$WORK/worker$i.port" 30; done
echo "demo: cluster up: coordinator $COORD, $SHARDS shards, $WORKERS workers" >&2
"$BIN/client/downpourctl" --coordinator="$COORD" nodes >&2

status=0
result=$("$BIN/client/downpourctl" --coordinator="$COORD" submit "$SPEC" --wait) || status=$?
if ((status != 0)); then
  echo "demo: the job did not succeed; daemon logs follow" >&2
  tail -n 20 "$WORK"/*.log >&2
elif [[ ${DEMO_EXPORT:-1} != 0 ]]; then
  job=$(awk '{print $2}' <<<"$result")
  mkdir -p "$ROOT/out"
  "$BIN/client/downpourctl" --coordinator="$COORD" export "$job" \
    --out="$ROOT/out/demo-model.safetensors" >&2
  "$BIN/client/downpourctl" --coordinator="$COORD" -o json get "$job" >"$ROOT/out/demo-job.json"
  echo "demo: load it in PyTorch (load_state_dict) and check its accuracy with" \
    "python3 bench/export_pytorch_check.py --export out/demo-model.safetensors" \
    "--job out/demo-job.json" >&2
fi
[[ -n $result ]] && echo "$result"
exit $status
