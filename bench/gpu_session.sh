#!/usr/bin/env bash
# The GPU work of one GPU host, stage by stage (STAGES, default "tests bench
# train"); logs and tables go to $OUT (default ./gpu-out):
#   tests       the GPU tests of kernels/cuda and model (gtest binaries run
#               directly; a line per test with its PASSED/FAILED counts)
#   bench       //bench:step_time once per precision of PRECISIONS beside
#               bench/pytorch_step_time.py on the same card, then
#               bench/compare_step_time.py's table (table.md)
#   ab          two builds' step times alternated on the same card (old new
#               new old per precision), compared by bench/compare_builds.py
#   profile     per-layer times of a step and each convolution's cuDNN choices
#   train       examples/fashion_mnist_cnn.pbtxt (TRAIN_SPEC) through a real
#               coordinator, shard and worker on GPU(s) WORKER_DEVICES (0)
#   durability  exports loaded by PyTorch with load_state_dict, a ResNet-18
#               job surviving a killed shard and a shard killed while writing
#               a checkpoint, then //bench:checkpoint beside the disk
#   recovery    (with durability or alone) a killed worker's rank taken over
#               and a SIGTERMed shard drained, without a rollback
#
# Build, from the repository root (on the GPU host, or on a build host and
# pack; see bench/lib.sh):
#   bazel build -c opt //kernels/cuda:context_test //kernels/cuda:layers_test \
#     //kernels/cuda:reduced_layers_test //kernels/cuda:conv_test //kernels/cuda:optimizer_test \
#     //kernels/cuda:backend_test //kernels/cuda:collectives_test //model:model_gpu_test \
#     //model:replica_set_test //bench:step_time //bench:checkpoint \
#     //coordinator:downpour-coordinator //server:downpour-ps //worker:downpour-worker \
#     //client:downpourctl
# (a stage needs only its own: tests the tests; bench, ab and profile
# step_time; train, durability and recovery the four daemons and tools, and
# checkpoint for durability). Run from the repository root:
#   bash bench/gpu_session.sh                               # programs in bazel-bin
#   DOWNPOUR_BIN=DIR bash bench/gpu_session.sh              # or in DIR (bench/lib.sh)
#   STAGES=bench PRECISIONS="fp32 tf32 fp32_strict bf16" \
#     PYTORCH_ARGS="--steps 20 --warmup 5" bash bench/gpu_session.sh
# Environment: STAGES; PRECISIONS (bench: default "fp32 tf32 fp32_strict
# bf16"; ab: default fp32); STEP_TIME_ARGS (more step_time flags);
# PYTORCH_ARGS (gets --precisions from PRECISIONS unless it names its own);
# PROFILE_ARGS; STEP_TIME_OLD (ab: the other build's step_time; default
# step_time_old in DOWNPOUR_BIN); TRAIN_SPEC, WORKER_DEVICES, TRAIN_TIMEOUT
# (400 s), SCRAPE_AFTER_S (10); FASHION_MNIST_DIR (the Fashion-MNIST .gz
# files, default /usr/share/datasets/fashion-mnist). PyTorch and NumPy come
# from python3.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" || exit 2
STAGES=${STAGES:-tests bench train}
# stage NAME: whether NAME is one of the words of STAGES.
stage() { [[ " $STAGES " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if stage tests; then
  for test in kernels/cuda/context_test kernels/cuda/layers_test kernels/cuda/reduced_layers_test \
    kernels/cuda/conv_test kernels/cuda/optimizer_test kernels/cuda/backend_test \
    kernels/cuda/collectives_test model/model_gpu_test model/replica_set_test; do
    t=${test##*/}
    program=$(downpour_prog "$test") || { echo "$t rc=127 (not built)"; continue; }
    "$program" --gtest_color=no >"$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure|error' "$OUT/$t.log" | head -20
  done
fi

if stage bench || stage ab || stage profile; then
  downpour_need STEP_TIME bench/step_time
fi

if stage bench; then
  # Ours once per precision in PRECISIONS (default "fp32 tf32 fp32_strict
  # bf16": fp32 is PyTorch's default, TF32 convolutions only; tf32 adds the
  # GEMMs; fp32_strict has no TF32; fp16 may be added), PyTorch's with the
  # same names (PYTORCH_ARGS defaults to --precisions with PRECISIONS;
  # pass --precisions yourself in PYTORCH_ARGS to override).
  BENCH_PRECISIONS=${PRECISIONS:-fp32 tf32 fp32_strict bf16}
  for p in $BENCH_PRECISIONS; do
    # shellcheck disable=SC2086  # STEP_TIME_ARGS: words
    "$STEP_TIME" --precision="$p" ${STEP_TIME_ARGS:-} 2>&1
  done | tee "$OUT/ours.jsonl"
  PT_ARGS=${PYTORCH_ARGS:-}
  [[ $PT_ARGS == *--precisions* ]] || PT_ARGS="$PT_ARGS --precisions ${BENCH_PRECISIONS// /,}"
  # shellcheck disable=SC2086  # PT_ARGS: words
  PYTHONUNBUFFERED=1 python3 bench/pytorch_step_time.py $PT_ARGS \
    2>&1 | tee "$OUT/pytorch.jsonl"
  python3 bench/compare_step_time.py "$OUT/ours.jsonl" "$OUT/pytorch.jsonl" | tee "$OUT/table.md"
fi

if stage ab; then
  # The old and the new build's step times, alternated (old new new old per
  # precision, so drift of the card cancels), then compared: medians of each.
  # The old build's step_time: STEP_TIME_OLD, or step_time_old in DOWNPOUR_BIN.
  STEP_TIME_OLD=${STEP_TIME_OLD:-}
  [[ -z $STEP_TIME_OLD && -n ${DOWNPOUR_BIN:-} ]] && STEP_TIME_OLD=$(downpour_prog bench/step_time_old)
  [[ -x $STEP_TIME_OLD ]] || { echo "STAGES=ab needs STEP_TIME_OLD=PATH, the other build's step_time" >&2; exit 2; }
  for p in ${PRECISIONS:-fp32}; do
    for build in old new new old; do
      bin=$STEP_TIME
      [[ $build == old ]] && bin=$STEP_TIME_OLD
      # shellcheck disable=SC2086  # STEP_TIME_ARGS: words
      "$bin" --precision="$p" ${STEP_TIME_ARGS:-} 2>/dev/null >>"$OUT/ab_$build.jsonl"
    done
  done
  python3 bench/compare_builds.py "$OUT/ab_old.jsonl" "$OUT/ab_new.jsonl" | tee "$OUT/ab.md"
fi

if stage profile; then
  # Per-layer device times of one step, and every convolution's measured
  # algorithms in both layouts.
  # shellcheck disable=SC2086  # PROFILE_ARGS: words
  "$STEP_TIME" --profile --log_conv --repeats=1 --steps=5 ${PROFILE_ARGS:-} >"$OUT/profile.jsonl" \
    2>"$OUT/conv.log"
  python3 - "$OUT/profile.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"profile"')]
for model in dict.fromkeys(r['profile'] for r in rows):
    mine = [r for r in rows if r['profile'] == model and r['layer'] != 'TOTAL']
    total = next(r for r in rows if r['profile'] == model and r['layer'] == 'TOTAL')
    top = sorted(mine, key=lambda r: -(r['forward_ms'] + r['backward_ms']))[:8]
    print(f"{model}: forward {total['forward_ms']:.2f} ms backward {total['backward_ms']:.2f} ms; top: " +
          ', '.join(f"{r['layer']} {r['forward_ms']:.2f}+{r['backward_ms']:.2f}" for r in top))
PY
fi

if stage train || stage durability || stage recovery; then
  downpour_need COORDINATOR coordinator/downpour-coordinator
  downpour_need PS server/downpour-ps
  downpour_need WORKER worker/downpour-worker
  downpour_need CTL client/downpourctl
fi
stage durability && downpour_need CHECKPOINT_BENCH bench/checkpoint

if stage train; then
  W=$(mktemp -d)
  "$CTL" dataset import --fashion_mnist="$FASHION_MNIST_DIR" --out_dir="$W/data/fashion-mnist" \
    --shards=4 >"$OUT/import.log" 2>&1 || { echo "import failed"; cat "$OUT/import.log"; }
  "$COORDINATOR" --listen=127.0.0.1:0 --port_file="$W/c.port" --state_dir="$W/state" \
    >"$W/coordinator.log" 2>&1 &
  PIDS=($!)
  for _ in $(seq 100); do [[ -s $W/c.port ]] && break; sleep 0.1; done
  C=$(cat "$W/c.port")
  "$PS" --listen=127.0.0.1:0 --port_file="$W/ps.port" --coordinator="$C" >"$W/ps.log" 2>&1 &
  PIDS+=($!)
  "$WORKER" --listen=127.0.0.1:0 --port_file="$W/w.port" --coordinator="$C" \
    --data_dir="$W/data" --devices="${WORKER_DEVICES:-0}" --metrics_listen=127.0.0.1:0 >"$W/worker.log" 2>&1 &
  PIDS+=($!)
  for f in ps.port w.port; do for _ in $(seq 100); do [[ -s $W/$f ]] && break; sleep 0.1; done; done
  sleep 1
  "$CTL" --coordinator="$C" nodes 2>&1 | tee "$OUT/nodes.txt"
  M=$(grep -o 'metrics on [0-9.:]*' "$W/worker.log" | head -1 | awk '{print $3}')
  scrape() { python3 -c "import urllib.request;print(urllib.request.urlopen('http://$M/metrics').read().decode())"; }
  # The worker's /metrics while the job trains (GPU memory in use), kept whole.
  [[ -n $M ]] && (sleep "${SCRAPE_AFTER_S:-10}"; scrape >"$OUT/metrics_during.txt" 2>&1) &
  start=$SECONDS
  timeout "${TRAIN_TIMEOUT:-400}" "$CTL" --coordinator="$C" submit "${TRAIN_SPEC:-examples/fashion_mnist_cnn.pbtxt}" \
    --wait --timeout=390s >"$OUT/train.txt" 2>"$OUT/train_progress.txt"
  echo "train rc=$? wall_s=$((SECONDS - start))"
  tail -3 "$OUT/train_progress.txt"; cat "$OUT/train.txt"
  [[ -n $M ]] && grep -E '^downpour_worker_(devices|gpu_memory)' "$OUT/metrics_during.txt"
  [[ -n $M ]] && scrape 2>/dev/null | grep -E 'downpour_worker_(devices|gpu_memory)|examples_per_second' | tee "$OUT/metrics.txt"
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  cp "$W/worker.log" "$W/ps.log" "$OUT/" 2>/dev/null
  grep -E 'device|model replica|accuracy' "$W/worker.log" | head
fi

if stage durability || stage recovery; then
  # The real daemons with a checkpoint root on the GPU: two shards, two
  # workers on GPU 0.
  W=$(mktemp -d)
  R=$W/checkpoints
  "$CTL" dataset import --fashion_mnist="$FASHION_MNIST_DIR" --out_dir="$W/data/fashion-mnist" \
    --shards=4 >"$OUT/import.log" 2>&1 || { echo "import failed"; cat "$OUT/import.log"; }
  dd if=/dev/zero of="$W/raw.bin" bs=8M count=64 conv=fsync 2>&1 | tail -1 | sed 's/^/raw disk: /' \
    | tee "$OUT/raw_disk.txt"
  rm -f "$W/raw.bin"
  "$COORDINATOR" --listen=127.0.0.1:0 --port_file="$W/c.port" --state_dir="$W/state" \
    --checkpoint_root="$R" --heartbeat_interval_ms=200 --node_timeout_ms=2000 >"$W/coordinator.log" 2>&1 &
  PIDS=($!)
  for _ in $(seq 100); do [[ -s $W/c.port ]] && break; sleep 0.1; done
  C=$(cat "$W/c.port")
  start_shard() {
    "$PS" --listen=127.0.0.1:0 --port_file="$W/ps$1.port" --coordinator="$C" \
      --checkpoint_root="$R" >"$W/ps$1.log" 2>&1 &
    SHARD_PID[$1]=$!
    PIDS+=($!)
  }
  start_shard 0
  start_shard 1
  for i in 0 1; do
    "$WORKER" --listen=127.0.0.1:0 --port_file="$W/w$i.port" --coordinator="$C" \
      --data_dir="$W/data" --devices=0 >"$W/worker$i.log" 2>&1 &
    WORKER_PID[i]=$!
    PIDS+=($!)
  done
  sleep 2
  ctl() { "$CTL" --coordinator="$C" "$@"; }
  # The newest checkpoint's step of a job (0 if none).
  newest() { ctl -o json get "$1" | python3 -c 'import json,sys; c=json.load(sys.stdin).get("checkpoints",[]); print(c[-1]["step"] if c else 0)'; }
  check_export() {
    ctl -o json get "$1" >"$OUT/$1.json"
    ctl export "$1" --out="$W/$1.safetensors" | tee -a "$OUT/durability.txt"
    python3 bench/export_pytorch_check.py --export "$W/$1.safetensors" --job "$OUT/$1.json" \
      --fashion "$FASHION_MNIST_DIR" | tee -a "$OUT/durability.txt"
  }
  if stage durability; then
  ctl submit examples/fashion_mnist_cnn_bn.pbtxt --job_id=cnn-bn --wait --timeout=300s 2>/dev/null \
    | tee -a "$OUT/durability.txt"
  check_export cnn-bn
  # ResNet-18: kill -9 shard 1 once a checkpoint at step >= 200 exists; a
  # replacement registers; the job restarts from the checkpoint.
  ctl submit examples/fashion_mnist_resnet18.pbtxt --job_id=resnet-shard-loss >/dev/null
  for _ in $(seq 600); do (( $(newest resnet-shard-loss) >= 200 )) && break; sleep 0.2; done
  kill -9 "${SHARD_PID[1]}"; echo "killed ps1 at checkpoint $(newest resnet-shard-loss)" | tee -a "$OUT/durability.txt"
  start_shard 2
  ctl wait resnet-shard-loss --timeout=300s 2>/dev/null | tee -a "$OUT/durability.txt"
  check_export resnet-shard-loss
  # A shard killed while it writes a checkpoint: ask for one and kill shard 0
  # at once (its 22 MB part takes a while); the manifest never names a
  # partial file, and the job continues from the complete one before.
  ctl submit examples/fashion_mnist_resnet18.pbtxt --job_id=resnet-mid-write >/dev/null
  for _ in $(seq 600); do (( $(newest resnet-mid-write) >= 200 )) && break; sleep 0.2; done
  # Kill shard 0 the moment its next part is being written (its temporary
  # file exists).
  mid_write=no
  for _ in $(seq 6000); do
    if compgen -G "$R/resnet-mid-write/step-*/shard-0.safetensors.tmp" >/dev/null; then
      kill -9 "${SHARD_PID[0]}"
      mid_write=yes
      break
    fi
    sleep 0.005
  done
  echo "killed ps0 during a checkpoint write: $mid_write; on disk then:" | tee -a "$OUT/durability.txt"
  for d in "$R"/resnet-mid-write/*; do
    echo "  $(basename "$d"): $(cd "$d" && printf '%s ' *)" | tee -a "$OUT/durability.txt"
  done
  start_shard 3
  ctl wait resnet-mid-write --timeout=300s 2>/dev/null | tee -a "$OUT/durability.txt"
  check_export resnet-mid-write
  for j in resnet-shard-loss resnet-mid-write; do
    ctl get "$j" | sed -n '/^events/,$p' | tee -a "$OUT/durability.txt"
  done
  fi
  if stage recovery; then
    # Without a rollback: the ResNet-18 job's worker killed once a
    # checkpoint at step >= 200 exists (the other, idle worker takes its
    # rank over at the shards' step, with the checkpoint's batch-norm
    # statistics), then a shard stopped with SIGTERM (it drains: the job
    # moves to a spare from a fresh checkpoint).
    start_shard 4
    # The clean run the faults are measured against.
    ctl submit examples/fashion_mnist_resnet18.pbtxt --job_id=resnet-clean --wait --timeout=300s \
      2>/dev/null | tee -a "$OUT/durability.txt"
    ctl submit examples/fashion_mnist_resnet18.pbtxt --job_id=resnet-worker-loss >/dev/null
    for _ in $(seq 600); do (( $(newest resnet-worker-loss) >= 200 )) && break; sleep 0.2; done
    holder=$(ctl -o json get resnet-worker-loss | python3 -c 'import json,sys; print(json.load(sys.stdin)["placement"]["worker_nodes"][0])')
    for i in 0 1; do
      if [[ $holder == *":$(cut -d: -f2 "$W/w$i.port")" ]]; then
        kill -9 "${WORKER_PID[i]}"
        echo "killed worker $i ($holder) at checkpoint $(newest resnet-worker-loss)" | tee -a "$OUT/durability.txt"
      fi
    done
    ctl wait resnet-worker-loss --timeout=300s 2>/dev/null | tee -a "$OUT/durability.txt"
    check_export resnet-worker-loss
    ctl submit examples/fashion_mnist_resnet18.pbtxt --job_id=resnet-shard-drain >/dev/null
    for _ in $(seq 600); do (( $(newest resnet-shard-drain) >= 200 )) && break; sleep 0.2; done
    victim=$(ctl -o json get resnet-shard-drain | python3 -c 'import json,sys; print(json.load(sys.stdin)["placement"]["shard_nodes"][0])')
    for i in 0 1 2 3 4; do
      if [[ -s $W/ps$i.port && $victim == *":$(cut -d: -f2 "$W/ps$i.port")" ]]; then
        kill -TERM "${SHARD_PID[$i]}"
        echo "SIGTERM to shard $i ($victim) at checkpoint $(newest resnet-shard-drain)" | tee -a "$OUT/durability.txt"
      fi
    done
    ctl wait resnet-shard-drain --timeout=300s 2>/dev/null | tee -a "$OUT/durability.txt"
    check_export resnet-shard-drain
    for j in resnet-worker-loss resnet-shard-drain; do
      ctl get "$j" | sed -n '/^events/,$p' | tee -a "$OUT/durability.txt"
    done
  fi
  grep -h "wrote .*MB/s" "$W"/ps*.log | tee "$OUT/checkpoint_writes.txt" | tail -4
  # A shard's checkpoint write beside the disk's raw rate, and the step
  # slowdown while checkpoints are written (//bench:checkpoint).
  stage durability && "$CHECKPOINT_BENCH" --dir="$W/bench" 2>/dev/null | tee "$OUT/checkpoint_bench.jsonl"
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  cp "$W"/*.log "$OUT/" 2>/dev/null
fi
