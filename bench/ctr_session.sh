#!/usr/bin/env bash
# Issue 13's large runs on one GPU machine, in one call of the device tool
# (logs and figures to $OUT, or ./ctr-out):
#   STAGES=tests  the CUDA ops of named inputs (CopyBlock, PairwiseDot) and
#                 the GPU model tests;
#   STAGES=table  //bench:sparse with a table of >= 2 GB (rows and Adam's
#                 state) over 4 shards each limited to 1 GiB (--memory_limit):
#                 every row held, no eviction, no refusal;
#   STAGES=ctr    examples/ctr_dlrm.pbtxt on a generated 10M + 1M click log
#                 through 2 shards and 2 workers on the GPU: its test AUC and
#                 log loss beside the generator's Bayes figures.
# Here (no GPU needed):
#   bazel build -c opt //kernels/cuda:layers_test //model:model_gpu_test //bench:sparse \
#     //coordinator:downpour-coordinator //server:downpour-ps //worker:downpour-worker \
#     //client:downpourctl
#   ../shared/tools/device-bundle .device/bundle bazel-bin/kernels/cuda/layers_test \
#     bazel-bin/model/model_gpu_test bazel-bin/bench/sparse \
#     bazel-bin/coordinator/downpour-coordinator bazel-bin/server/downpour-ps \
#     bazel-bin/worker/downpour-worker bazel-bin/client/downpourctl
#   (cd .device && tar -cf - bundle | xz -T2 > bundle.tar.xz && rm -rf bundle)
# Then the device tool: carry [".device"], command "bash bench/ctr_session.sh"
# (BUNDLE_DIR=.device/ctr with the bundle made there, carry [".device/ctr"]).
set -uo pipefail
OUT=${OUT:-$PWD/ctr-out}
mkdir -p "$OUT"
B=${BUNDLE_DIR:-.device}
[[ -f $B/bundle.tar.xz && ! -d $B/bundle ]] && tar -xJf "$B/bundle.tar.xz" -C "$B"
source "$B/bundle/env.sh"
STAGES=${STAGES:-tests table ctr}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
nproc | tee "$OUT/cores.txt"

if [[ $STAGES == *tests* ]]; then
  for t in layers_test model_gpu_test; do
    $t --gtest_color=no >"$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  done
fi

if [[ $STAGES == *table* ]]; then
  # dim 64, 3M rows drawn near-uniformly (skew 0.01): ~816 B a row with Adam.
  # The bench finds the daemons as tests do, under $TEST_SRCDIR/downpour.
  R=$(mktemp -d)
  mkdir -p "$R/downpour/server" "$R/downpour/coordinator" "$R/downpour/client"
  ln -s "$(command -v downpour-ps)" "$R/downpour/server/downpour-ps"
  ln -s "$(command -v downpour-coordinator)" "$R/downpour/coordinator/downpour-coordinator"
  ln -s "$(command -v downpourctl)" "$R/downpour/client/downpourctl"
  start=$SECONDS
  TEST_SRCDIR=$R TEST_WORKSPACE=downpour sparse --shards=4 --workers=2 --tables=1 --features=26 --dim=64 --vocab=3000000 --batch=8192 \
    --skews=0.01 --sync_skew=0 --steps=${TABLE_STEPS:-40} --warmup=1 --dense_vocab=-1 \
    --memory_limit=1073741824 >"$OUT/table.txt" 2>"$OUT/table.err"
  echo "table rc=$? wall_s=$((SECONDS - start))"
  tail -4 "$OUT/table.txt"
fi

if [[ $STAGES == *ctr* ]]; then
  W=$(mktemp -d)
  D=$W/data
  start=$SECONDS
  downpourctl dataset generate --kind=ctr --out_dir="$D/ctr" --name=ctr --examples=10000000 \
    --test_examples=1000000 --shards=32 --vocabulary=${CTR_VOCABULARY:-100:10000} 2>&1 | tee "$OUT/generate.txt"
  echo "generate wall_s=$((SECONDS - start))"
  downpour-coordinator --listen=127.0.0.1:0 --port_file="$W/c.port" --state_dir="$W/state" \
    >"$W/coordinator.log" 2>&1 &
  for _ in $(seq 100); do [[ -s $W/c.port ]] && break; sleep 0.1; done
  C=$(cat "$W/c.port")
  for i in 0 1; do
    downpour-ps --listen=127.0.0.1:0 --port_file="$W/ps$i.port" --coordinator="$C" \
      --memory_limit=${SHARD_LIMIT:-0} >"$W/ps$i.log" 2>&1 &
    downpour-worker --listen=127.0.0.1:0 --port_file="$W/w$i.port" --coordinator="$C" \
      --data_dir="$D" --devices=${WORKER_DEVICES:-0} >"$W/w$i.log" 2>&1 &
  done
  sleep 3
  downpourctl --coordinator="$C" nodes 2>&1 | tee "$OUT/nodes.txt"
  start=$SECONDS
  timeout ${TRAIN_TIMEOUT:-500} downpourctl --coordinator="$C" submit examples/ctr_dlrm.pbtxt \
    --job_id=ctr --wait --timeout=490s >"$OUT/train.txt" 2>"$OUT/train_progress.txt"
  echo "train rc=$? wall_s=$((SECONDS - start))"
  tail -2 "$OUT/train_progress.txt"; cat "$OUT/train.txt"
  downpourctl --coordinator="$C" get ctr >"$OUT/get.txt" 2>&1
  grep -iE "AUC|log loss|step" "$OUT/get.txt" | head -20
  cp "$W"/*.log "$OUT/" 2>/dev/null
  grep -h "trained\|AUC" "$W"/w*.log | tail -8
  kill $(jobs -p) 2>/dev/null; wait
fi
