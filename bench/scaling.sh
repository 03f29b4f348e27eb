#!/usr/bin/env bash
# The scaling benchmark: Downpour against PyTorch on one GPU host,
# for a matrix of models, precisions, cluster shapes and consistency modes.
#
# What it measures, per run:
#   time_to_target_s  from a timestamp the shell takes just before
#                     `downpourctl submit` (PyTorch: just before launching
#                     python or torchrun, so its start-up, CUDA init and
#                     data loading count) to the first test-set evaluation
#                     >= the target (0.90 cnn, 0.92 resnet18), evaluations
#                     once an epoch, at most EPOCHS (15) epochs. Downpour's
#                     daemons are started (a fresh cluster per run) and the
#                     data imported before the clock starts: that is a
#                     running service as its users see it.
#   examples_per_s    steady-state training throughput, all workers
#                     together. Downpour: each worker's Prometheus series
#                     (downpour_worker_steps_total, and the _sum of the
#                     histograms ..._step_seconds, ..._input_wait_seconds,
#                     ..._compute_seconds, ..._exchange_seconds;
#                     worker/worker_metrics.h) are
#                     polled every SAMPLE_INTERVAL (0.2 s) during the run;
#                     the windows are, per epoch after the first, the first
#                     and last poll whose rank-0 step lies strictly between
#                     two evaluations (so no evaluation ran inside; with one
#                     epoch only: after its first 50 steps); a worker's rate
#                     is its steps x batch_size / wall seconds over those
#                     windows, and the rates are summed over workers.
#                     PyTorch: bench/pytorch_train.py, GPU synchronised at
#                     the ends of each epoch's training after the first,
#                     summed over DDP ranks.
#   input_wait_frac, compute_frac, exchange_frac
#                     the workers' input-wait, compute and exchange seconds
#                     over their step seconds, summed over workers, in the
#                     same windows.
#   exchange_gb_s     bytes a worker step moves (parameters x (wire bytes
#                     of a gradient / push_every + 4 / fetch_every): push
#                     and pull) x the worker's steps / its exchange seconds,
#                     summed over workers (GB = 1e9 bytes). Exchange seconds
#                     include SYNC's wait for the slowest worker, so this is
#                     a lower bound of what the wire carried while busy.
#                     Beside it, once per call and model, the transport
#                     ceiling: //bench:transport (real
#                     downpour-ps, synthetic gradients of the model's size,
#                     1 worker, the first of SHARDS) gives loopback raw TCP and
#                     Downpour's push+pull GB/s; without it, raw loopback TCP
#                     from Python. Printed as {"ceiling": {...}}.
#
# The matrix (environment; defaults in brackets):
#   MODELS [cnn]         cnn (examples/fashion_mnist_cnn.pbtxt), resnet18
#                        (examples/fashion_mnist_resnet18.pbtxt), vgg11
#                        (examples/fashion_mnist_vgg11.pbtxt)
#   PRECISIONS [fp32]    fp32 bf16 (tf32 fp32_strict too)
#   SHAPES [1x1]         WxG: W worker processes of G GPUs each; worker i gets
#                        --devices=its own G GPUs; batch_size 128*G per worker
#                        step (a G-GPU worker is compared at G x the batch);
#                        shapes needing more GPUs than `nvidia-smi -L` lists
#                        are skipped with a note
#   MODES [SYNC]         SYNC ASYNC (SSP needs staleness: in EXTRA_SPEC)
#   SHARDS [1]           parameter shards (a list runs each)
#   SYSTEMS [downpour pytorch]
#   EXTRA_SPEC []        more spec fields, "field: value" separated by ';',
#                        e.g. "gradient_wire_dtype: BFLOAT16" or "push_every: 4;
#                        fetch_every: 4" (consistency fields go into
#                        consistency {}); named in each Downpour line as extra
#   EPOCHS [15], EPOCH_STEPS [60000 / (128 G W), rounded up: one epoch, the
#   evaluation interval; set, it also caps PyTorch's epochs, --limit_steps],
#   MAX_STEPS [none: caps a Downpour run's steps], BATCH [128 a
#   GPU], RUN_TIMEOUT [300 s a run], SAMPLE_INTERVAL [0.2], CEILING [1],
#   PYTHON [python3: runs bench/pytorch_train.py], PYTORCH_ARGS [], FASHION
#   [$FASHION_MNIST_DIR, default /usr/share/datasets/fashion-mnist: the IDX
#   .gz files], OUT [./gpu-out], TARGET [the model's: replaces it for both
#   systems], WORKER_FLAGS, PS_FLAGS [more daemon flags, e.g.
#   --compute_threads=2 for a CPU worker], DEVICES [gpu; cpu: workers get no
#   --devices flag and PyTorch runs on the CPU].
# PyTorch runs once per model and precision for each total GPU count of the
# shapes (1: one process; 2, 4: DDP through torch.distributed.run).
#
# Output, in $OUT: scaling.jsonl (a {"ceiling": ...} line per model, one line
# per run), scaling.md (bench/scaling_tools.py summary: the table, examples/s
# ours / PyTorch on 1 GPU, time to target ours vs DDP, 4-GPU efficiency =
# 4-GPU examples/s / (4 x the same system's 1-GPU examples/s)), and runs/NAME/
# with each run's spec, job status, metric samples and daemon logs.
#
# Build, from the repository root (on the GPU host, or on a build host and
# pack; see bench/lib.sh):
#   bazel build -c opt //coordinator:downpour-coordinator //server:downpour-ps \
#     //worker:downpour-worker //client:downpourctl //bench:transport
# (//bench:transport only for the ceiling line; without it the ceiling is raw
# loopback TCP from Python). Programs come from bazel-bin, or from
# DOWNPOUR_BIN=DIR. Run from the repository root, e.g. on one GPU:
#   MODELS=cnn PRECISIONS="fp32 bf16" SHAPES=1x1 bash bench/scaling.sh
#   MODELS=resnet18 PRECISIONS=bf16 SHAPES=1x1 bash bench/scaling.sh
# on two GPUs:
#   MODELS=cnn PRECISIONS=fp32 SHAPES="1x1 2x1 1x2" MODES=SYNC bash bench/scaling.sh
#   MODELS=cnn PRECISIONS=fp32 SHAPES="2x1" MODES=ASYNC SYSTEMS=downpour \
#     EXTRA_SPEC="gradient_wire_dtype: BFLOAT16" bash bench/scaling.sh
# on four:
#   MODELS=cnn PRECISIONS=fp32 SHAPES="1x1 4x1 1x4" MODES=SYNC bash bench/scaling.sh
# RUN_TIMEOUT bounds each run. On the CPU (no PyTorch DDP), small:
#   DEVICES=cpu EPOCHS=2 EPOCH_STEPS=100 SYSTEMS=downpour bash bench/scaling.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH/lib.sh" || exit 2
ROOT=$DOWNPOUR_ROOT
TOOLS=("python3" "$BENCH/scaling_tools.py")

MODELS=${MODELS:-cnn}
PRECISIONS=${PRECISIONS:-fp32}
SHAPES=${SHAPES:-1x1}
MODES=${MODES:-SYNC}
SHARDS=${SHARDS:-1}
SYSTEMS=${SYSTEMS:-downpour pytorch}
EXTRA_SPEC=${EXTRA_SPEC:-}
EPOCHS=${EPOCHS:-15}
EPOCH_STEPS=${EPOCH_STEPS:-}
MAX_STEPS=${MAX_STEPS:-}
BATCH=${BATCH:-128}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
SAMPLE_INTERVAL=${SAMPLE_INTERVAL:-0.2}
CEILING=${CEILING:-1}
DEVICES=${DEVICES:-gpu}
PYTHON=${PYTHON:-python3}
PYTORCH_ARGS=${PYTORCH_ARGS:-}
FASHION=${FASHION:-$FASHION_MNIST_DIR}
TARGET=${TARGET:-}
WORKER_FLAGS=${WORKER_FLAGS:-}
PS_FLAGS=${PS_FLAGS:-}
TRAIN_EXAMPLES=60000

downpour_need COORDINATOR coordinator/downpour-coordinator
downpour_need PS server/downpour-ps
downpour_need WORKER worker/downpour-worker
downpour_need CTL client/downpourctl
TRANSPORT=$(downpour_prog bench/transport 2>/dev/null) || TRANSPORT=""

if [[ $DEVICES == cpu ]]; then
  NGPU=0
else
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
fi
JSONL=$OUT/scaling.jsonl
: >"$JSONL"
: >"$OUT/notes.txt"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

emit() { echo "$1" | tee -a "$JSONL"; }
note() { echo "# $*" | tee -a "$OUT/notes.txt" >&2; }

# Whether shape WxG fits here (a note says why not, unless $2 is "quiet");
# sets W, G.
shape_fits() {
  W=${1%%x*}
  G=${1#*x}
  local why=""
  if ! [[ $1 =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]]; then
    why="skip $1: a shape is WxG, e.g. 2x1"
  elif [[ $DEVICES == cpu ]]; then
    ((G == 1)) || why="skip $1: DEVICES=cpu runs one CPU replica a worker"
  elif ((W * G > NGPU)); then
    why="skip $1: needs $((W * G)) GPUs, nvidia-smi lists $NGPU"
  fi
  [[ -z $why ]] && return 0
  [[ ${2:-} == quiet ]] || note "$why"
  return 1
}

param_mb() { case $1 in cnn) echo 1.61 ;; resnet18) echo 42.62 ;; vgg11) echo 112.58 ;; *) echo 10 ;; esac; }

spec_for() {
  case $1 in
    cnn) echo "$ROOT/examples/fashion_mnist_cnn.pbtxt" ;;
    resnet18) echo "$ROOT/examples/fashion_mnist_resnet18.pbtxt" ;;
    vgg11) echo "$ROOT/examples/fashion_mnist_vgg11.pbtxt" ;;
    *) echo "unknown model $1 (cnn, resnet18, vgg11)" >&2; return 1 ;;
  esac
}
target_for() {
  if [[ -n $TARGET ]]; then echo "$TARGET"; return; fi
  case $1 in resnet18 | vgg11) echo 0.92 ;; *) echo 0.90 ;; esac
}

wait_file() {
  local f=$1 i
  for i in $(seq 200); do [[ -s $f ]] && return 0; sleep 0.05; done
  return 1
}

# Stops the processes of a run: SIGTERM, then SIGKILL for any left after 3 s.
stop_all() {
  local p i
  for p in "$@"; do kill -TERM "$p" 2>/dev/null; done
  for i in $(seq 30); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "$@"; do kill -KILL "$p" 2>/dev/null; done
  for p in "$@"; do wait "$p" 2>/dev/null; done
}

# One Downpour run: a fresh cluster (coordinator, S shards, W workers), one job.
run_downpour() {
  local model=$1 precision=$2 shape=$3 mode=$4 shards=$5
  local batch=$((BATCH * G)) name R C i j devs epoch steps target
  name="$model-$precision-$shape-${mode,,}-s$shards"
  [[ -n $EXTRA_SPEC ]] && name="$name-$(echo "$EXTRA_SPEC" | tr -c 'A-Za-z0-9' '_' | tr -s '_' | cut -c1-40 | sed 's/_$//')"
  R=$OUT/runs/$name
  rm -rf "$R" "${WORK:?}/$name"
  mkdir -p "$R" "$WORK/$name"
  epoch=${EPOCH_STEPS:-$(((TRAIN_EXAMPLES + batch * W - 1) / (batch * W)))}
  steps=$((EPOCHS * epoch))
  [[ -n $MAX_STEPS ]] && ((steps > MAX_STEPS)) && steps=$MAX_STEPS
  target=$(target_for "$model")
  "${TOOLS[@]}" spec --base "$(spec_for "$model")" --out "$R/spec.pbtxt" --name "scaling-$name" \
    --workers "$W" --shards "$shards" --mode "$mode" --precision "$precision" --batch "$batch" \
    --steps "$steps" --eval_every "$epoch" --target "$target" --extra "$EXTRA_SPEC" || return 1

  local run_pids=()
  "$COORDINATOR" --listen=127.0.0.1:0 --port_file="$WORK/$name/c.port" \
    --state_dir="$WORK/$name/state" >"$R/coordinator.log" 2>&1 &
  run_pids+=($!)
  PIDS+=($!)
  wait_file "$WORK/$name/c.port" || { note "$name: the coordinator did not start"; stop_all "${run_pids[@]}"; return 1; }
  C=$(cat "$WORK/$name/c.port")
  for ((j = 0; j < shards; j++)); do
    # shellcheck disable=SC2086  # PS_FLAGS: words
    "$PS" --listen=127.0.0.1:0 --port_file="$WORK/$name/ps$j.port" --coordinator="$C" \
      --node_id="ps$j" $PS_FLAGS >"$R/ps$j.log" 2>&1 &
    run_pids+=($!)
    PIDS+=($!)
  done
  for ((i = 0; i < W; i++)); do
    devs=()
    if [[ $DEVICES != cpu ]]; then
      local list=""
      for ((j = i * G; j < (i + 1) * G; j++)); do list="$list${list:+,}$j"; done
      devs=("--devices=$list")
    fi
    # shellcheck disable=SC2086  # WORKER_FLAGS: words
    "$WORKER" --listen=127.0.0.1:0 --port_file="$WORK/$name/w$i.port" --coordinator="$C" \
      --node_id="w$i" --data_dir="$WORK/data" --metrics_listen=127.0.0.1:0 "${devs[@]}" \
      $WORKER_FLAGS >"$R/worker$i.log" 2>&1 &
    run_pids+=($!)
    PIDS+=($!)
  done
  local metrics=""
  for i in $(seq 200); do
    metrics=$("$CTL" --coordinator="$C" -o json nodes 2>/dev/null |
      "${TOOLS[@]}" nodes --workers "$W" --shards "$shards") && break
    metrics=""
    sleep 0.1
  done
  "$CTL" --coordinator="$C" nodes >"$R/nodes.txt" 2>&1
  if [[ -z $metrics ]]; then
    note "$name: the cluster did not come up (see $R)"
    stop_all "${run_pids[@]}"
    return 1
  fi
  # shellcheck disable=SC2086
  "${TOOLS[@]}" sample --out "$R/samples.jsonl" --interval "$SAMPLE_INTERVAL" $metrics &
  local sampler=$!
  PIDS+=("$sampler")

  local t_submit t_end rc why=""
  t_submit=$(date +%s.%N)
  timeout "$RUN_TIMEOUT" "$CTL" --coordinator="$C" -o json submit "$R/spec.pbtxt" --job_id=run \
    --wait >"$R/final.json" 2>"$R/progress.txt"
  rc=$?
  t_end=$(date +%s.%N)
  ((rc == 124)) && why="timed out after ${RUN_TIMEOUT}s;"
  "$CTL" --coordinator="$C" -o json get run >"$R/job.json" 2>>"$R/progress.txt"
  stop_all "$sampler"
  stop_all "${run_pids[@]}"
  local label="$W worker"
  ((W > 1)) && label="${label}s"
  if [[ $DEVICES == cpu ]]; then label="$label x CPU"; else label="$label x $G GPU"; ((G > 1)) && label="${label}s"; fi
  emit "$("${TOOLS[@]}" result --job "$R/job.json" --samples "$R/samples.jsonl" \
    --shape "$label, $shards shard$( ((shards > 1)) && echo s)" --model "$model" --mode "$mode" \
    --precision "$precision" --workers "$W" --gpus "$( [[ $DEVICES == cpu ]] && echo 0 || echo $((W * G)))" \
    --shards "$shards" --batch "$batch" --t_submit "$t_submit" --t_end "$t_end" --target "$target" \
    --extra "$EXTRA_SPEC" --note "$why")"
}

# One PyTorch baseline on N GPUs (1: one process; more: DDP).
run_pytorch() {
  local model=$1 precision=$2 n=$3 log t0 rc line args=()
  log=$OUT/runs/pytorch-$model-$precision-$n.log
  mkdir -p "$OUT/runs"
  args=(--model "$model" --precision "$precision" --fashion "$FASHION" --epochs "$EPOCHS" --batch "$BATCH"
    --target "$(target_for "$model")")
  [[ $DEVICES == cpu ]] && args+=(--device cpu)
  [[ -n $EPOCH_STEPS ]] && args+=(--limit_steps "$EPOCH_STEPS")
  # shellcheck disable=SC2206
  args+=($PYTORCH_ARGS)
  t0=$(date +%s.%N)
  if ((n == 1)); then
    PYTHONUNBUFFERED=1 timeout "$RUN_TIMEOUT" "$PYTHON" "$BENCH/pytorch_train.py" "${args[@]}" \
      --t0 "$t0" >"$log" 2>&1
  else
    PYTHONUNBUFFERED=1 timeout "$RUN_TIMEOUT" "$PYTHON" -m torch.distributed.run --standalone \
      --nproc_per_node="$n" "$BENCH/pytorch_train.py" "${args[@]}" --t0 "$t0" >"$log" 2>&1
  fi
  rc=$?
  line=$(grep '^{"system"' "$log" | tail -1)
  if [[ -n $line ]]; then
    emit "$line"
  else
    note "pytorch $model $precision on $n GPU(s) failed (rc=$rc): $(grep -v '^{' "$log" | tail -3 | tr '\n' ' ')"
    emit "{\"system\": \"$( ((n > 1)) && echo pytorch_ddp || echo pytorch)\", \"model\": \"$model\", \"precision\": \"$precision\", \"gpus\": $n, \"error\": \"rc=$rc, see runs/$(basename "$log")\"}"
  fi
}

if [[ $SYSTEMS == *downpour* ]]; then
  "$CTL" dataset import --fashion_mnist="$FASHION" --out_dir="$WORK/data/fashion-mnist" \
    --shards=4 >"$OUT/import.log" 2>&1 || { echo "import failed"; cat "$OUT/import.log"; exit 1; }
  if [[ $CEILING == 1 ]]; then
    downpour_runfiles "$WORK/runfiles" || exit 2
    for model in $MODELS; do
      emit "$(TEST_SRCDIR=$WORK/runfiles TEST_WORKSPACE=downpour "${TOOLS[@]}" ceiling \
        --transport "$TRANSPORT" --model "$model" --size_mb "$(param_mb "$model")" \
        --shards "${SHARDS%% *}")"
    done
  fi
fi

for model in $MODELS; do
  spec_for "$model" >/dev/null || exit 2
  for precision in $PRECISIONS; do
    if [[ $SYSTEMS == *downpour* ]]; then
      for shape in $SHAPES; do
        shape_fits "$shape" || continue
        for mode in $MODES; do
          for shards in $SHARDS; do
            run_downpour "$model" "$precision" "$shape" "$mode" "$shards"
          done
        done
      done
    fi
    if [[ $SYSTEMS == *pytorch* ]]; then
      counts=""
      for shape in $SHAPES; do
        shape_fits "$shape" quiet || continue
        n=$((W * G))
        [[ $DEVICES == cpu ]] && n=1
        [[ " $counts " == *" $n "* ]] || counts="$counts $n"
      done
      for n in $(echo "$counts" | tr ' ' '\n' | sort -n); do
        run_pytorch "$model" "$precision" "$n"
      done
    fi
  done
done

"${TOOLS[@]}" summary "$JSONL" | tee "$OUT/scaling.md"
