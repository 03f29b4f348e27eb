#!/usr/bin/env bash
# Sparse tables at scale on one GPU host, stage by stage (STAGES, default
# "tests table ctr pytorch compare"); logs and figures go to $OUT (default
# ./ctr-out):
#   tests  the CUDA ops of named inputs (CopyBlock, PairwiseDot) and the GPU
#          model tests
#   table  //bench:sparse with a table of >= 2 GB (rows and Adam's state)
#          over 4 shards each limited to 1 GiB (--memory_limit): every row
#          held, no eviction, no refusal (TABLE_STEPS, default 40)
#   ctr    CTR_SPEC (examples/ctr_dlrm.pbtxt) on the 10M + 1M click log through
#          SHARDS shards (2) and WORKERS workers (2), worker i on GPU i of
#          WORKER_DEVICES ("0"; a list, cycled: "0 1 2 3" puts 4 workers on
#          4 GPUs), the spec's num_workers and num_shards set to match and
#          its batch to BATCH / WORKERS (BATCH: 4096, the spec's 2 x 2,048):
#          the job's test AUC and log loss beside the generator's Bayes
#          figures (SHARD_LIMIT, the shards' --memory_limit, default 0;
#          WORKER_FLAGS, more flags for every worker, e.g.
#          --device_memory_limit=2GiB; PS_FLAGS, likewise for every
#          shard, e.g. --sparse_threads=8; TRAIN_TIMEOUT, default 500 s;
#          STALENESS, every table's embedding_staleness, default 0); the
#          spec run in $OUT/ctr_spec.pbtxt,
#          the job as `downpourctl -o json get` shows it in $OUT/job.json
#   pytorch  bench/pytorch_ctr.py, the same model in PyTorch on the same
#          files, with the same batch (BATCH), optimizers and steps, on
#          PYTORCH_DEVICE (cuda) with PYTHON (python3, with torch and numpy);
#          it parses the records once and caches them beside the data
#          (pytorch_ctr.cache/), before its clock starts: $OUT/pytorch.txt
#   compare  the two side by side (bench/ctr_compare.py: steady-state
#          examples/s, their ratio Downpour / PyTorch, AUC, log loss, and
#          the evaluations of the test set, how many and their seconds):
#          $OUT/compare.txt; needs both stages' output in $OUT
# ctr and pytorch train CTR_SPEC (default examples/ctr_dlrm.pbtxt; one of
# fewer steps checks the stages on a CPU, with WORKER_DEVICES=auto and
# PYTORCH_DEVICE=cpu) on one click log, generated once for both into CTR_DATA
# (default: a new temporary folder; one that already holds ctr/ctr.json is
# used as it is) by `downpourctl dataset generate --kind=ctr`: 10M train and
# 1M test examples in 32 shards, vocabularies CTR_VOCABULARY (100:10000),
# ids drawn with the Zipf skew CTR_ZIPF (the generator's 1.05; near 0 is
# flat).
#
# Build, from the repository root (on the GPU host, or on a build host and
# pack; see bench/lib.sh):
#   bazel build -c opt //kernels/cuda:layers_test //model:model_gpu_test //bench:sparse \
#     //coordinator:downpour-coordinator //server:downpour-ps //worker:downpour-worker \
#     //client:downpourctl
# (tests needs the two tests; table //bench:sparse and the daemons; ctr the
# daemons and downpourctl; pytorch downpourctl, to generate the data). Run
# from the repository root:
#   bash bench/ctr_session.sh                     # programs in bazel-bin
#   DOWNPOUR_BIN=DIR STAGES=table bash bench/ctr_session.sh
#   CTR_DATA=/data/click STAGES="ctr pytorch compare" bash bench/ctr_session.sh
set -uo pipefail
OUT=${OUT:-$PWD/ctr-out}
mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" || exit 2
STAGES=${STAGES:-tests table ctr pytorch compare}
CTR_SPEC=${CTR_SPEC:-examples/ctr_dlrm.pbtxt}
# stage NAME: whether NAME is one of the words of STAGES.
stage() { [[ " $STAGES " == *" $1 "* ]]; }
WORKERS=${WORKERS:-2}
SHARDS=${SHARDS:-2}
read -r -a DEVICES <<<"${WORKER_DEVICES:-0}"
BATCH=${BATCH:-4096}
if ((WORKERS < 1 || SHARDS < 1 || BATCH % WORKERS != 0)); then
  echo "WORKERS=$WORKERS SHARDS=$SHARDS BATCH=$BATCH: need at least one of each and BATCH a multiple of WORKERS" >&2
  exit 2
fi
# The spec both stages run: CTR_SPEC with this cluster's shape.
SPEC=$OUT/ctr_spec.pbtxt
sed -E -e "s/^num_workers: [0-9]+/num_workers: $WORKERS/" -e "s/^num_shards: [0-9]+/num_shards: $SHARDS/" \
  -e "s/batch_size: [0-9]+/batch_size: $((BATCH / WORKERS))/" \
  -e "s/sparse: true/sparse: true embedding_staleness: ${STALENESS:-0}/" "$CTR_SPEC" >"$SPEC"
# ctr_data: sets D to the folder holding ctr/ (a worker's --data_dir), with
# the click log generated there unless it already is.
ctr_data() {
  [[ -n ${D:-} ]] && return
  D=${CTR_DATA:-$(mktemp -d)}
  if [[ -f $D/ctr/ctr.json ]]; then
    echo "click log: $D/ctr (already there)"
    return
  fi
  downpour_need CTL client/downpourctl
  local start=$SECONDS
  "$CTL" dataset generate --kind=ctr --out_dir="$D/ctr" --name=ctr --examples=10000000 \
    --test_examples=1000000 --shards=32 --vocabulary="${CTR_VOCABULARY:-100:10000}" --zipf="${CTR_ZIPF:-1.05}" 2>&1 | tee "$OUT/generate.txt"
  echo "generate wall_s=$((SECONDS - start))"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
nproc | tee "$OUT/cores.txt"

if stage tests; then
  for test in kernels/cuda/layers_test model/model_gpu_test; do
    t=${test##*/}
    program=$(downpour_prog "$test") || { echo "$t rc=127 (not built)"; continue; }
    "$program" --gtest_color=no >"$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  done
fi

if stage table; then
  # dim 64, 3M rows drawn near-uniformly (skew 0.01): ~816 B a row with Adam.
  # The bench finds the daemons as tests do, under $TEST_SRCDIR/downpour.
  downpour_need SPARSE bench/sparse
  R=$(mktemp -d)
  downpour_runfiles "$R" || exit 2
  start=$SECONDS
  TEST_SRCDIR=$R TEST_WORKSPACE=downpour "$SPARSE" --shards=4 --workers=2 --tables=1 --features=26 --dim=64 --vocab=3000000 --batch=8192 \
    --skews=0.01 --sync_skew=0 --steps="${TABLE_STEPS:-40}" --warmup=1 --dense_vocab=-1 \
    --memory_limit=1073741824 >"$OUT/table.txt" 2>"$OUT/table.err"
  echo "table rc=$? wall_s=$((SECONDS - start))"
  tail -4 "$OUT/table.txt"
fi

if stage ctr; then
  downpour_need COORDINATOR coordinator/downpour-coordinator
  downpour_need PS server/downpour-ps
  downpour_need WORKER worker/downpour-worker
  downpour_need CTL client/downpourctl
  ctr_data
  W=$(mktemp -d)
  "$COORDINATOR" --listen=127.0.0.1:0 --port_file="$W/c.port" --state_dir="$W/state" \
    >"$W/coordinator.log" 2>&1 &
  PIDS=($!)
  for _ in $(seq 100); do [[ -s $W/c.port ]] && break; sleep 0.1; done
  C=$(cat "$W/c.port")
  SHARD_PIDS=()
  WORKER_PIDS=()
  for ((i = 0; i < SHARDS; i++)); do
    "$PS" --listen=127.0.0.1:0 --port_file="$W/ps$i.port" --coordinator="$C" \
      --memory_limit="${SHARD_LIMIT:-0}" ${PS_FLAGS:-} >"$W/ps$i.log" 2>&1 &
    PIDS+=($!)
    SHARD_PIDS+=($!)
  done
  for ((i = 0; i < WORKERS; i++)); do
    "$WORKER" --listen=127.0.0.1:0 --port_file="$W/w$i.port" --coordinator="$C" \
      --data_dir="$D" --devices="${DEVICES[i % ${#DEVICES[@]}]}" ${WORKER_FLAGS:-} >"$W/w$i.log" 2>&1 &
    PIDS+=($!)
    WORKER_PIDS+=($!)
  done
  sleep 3
  "$CTL" --coordinator="$C" nodes 2>&1 | tee "$OUT/nodes.txt"
  start=$SECONDS
  timeout "${TRAIN_TIMEOUT:-500}" "$CTL" --coordinator="$C" submit "$SPEC" \
    --job_id=ctr --wait --timeout=490s >"$OUT/train.txt" 2>"$OUT/train_progress.txt"
  echo "train rc=$? wall_s=$((SECONDS - start))"
  tail -2 "$OUT/train_progress.txt"; cat "$OUT/train.txt"
  "$CTL" --coordinator="$C" get ctr >"$OUT/get.txt" 2>&1
  "$CTL" --coordinator="$C" -o json get ctr >"$OUT/job.json" 2>&1
  grep -iE "AUC|log loss|step" "$OUT/get.txt" | head -20
  # What the shards hold once the job has trained (its rows, before it ends
  # and they are dropped: the job is still theirs until the coordinator says).
  # With the CPU seconds each shard and worker has spent since it started
  # (user + system, every thread): over the job's steps, what a step cost
  # each process.
  cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' /proc/"$1"/stat 2>/dev/null; }
  for pid in "${SHARD_PIDS[@]}"; do
    echo "shard pid $pid cpu_s $(cpu_s "$pid") $(grep -E 'VmRSS|VmHWM' /proc/"$pid"/status 2>/dev/null | tr -s ' \n' ' ')"
  done | tee "$OUT/shards.txt"
  for pid in "${WORKER_PIDS[@]}"; do echo "worker pid $pid cpu_s $(cpu_s "$pid")"; done | tee -a "$OUT/shards.txt"
  cp "$W"/*.log "$OUT/" 2>/dev/null
  grep -h "trained\|AUC" "$W"/w*.log | tail -8
  kill "${PIDS[@]}" 2>/dev/null; wait
fi

if stage pytorch; then
  ctr_data
  start=$SECONDS
  "${PYTHON:-python3}" bench/pytorch_ctr.py --data="$D" --spec="$SPEC" \
    --device="${PYTORCH_DEVICE:-cuda}" >"$OUT/pytorch.txt" 2>"$OUT/pytorch.err"
  echo "pytorch rc=$? wall_s=$((SECONDS - start))"
  tail -2 "$OUT/pytorch.err"; cat "$OUT/pytorch.txt"
fi

if stage compare; then
  python3 bench/ctr_compare.py --job="$OUT/job.json" --progress="$OUT/train_progress.txt" \
    --worker_logs "$OUT"/w*.log --pytorch="$OUT/pytorch.txt" 2>&1 | tee "$OUT/compare.txt"
fi
