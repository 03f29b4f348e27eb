#!/usr/bin/env bash
# The pipeline's GPU work on one host of 2 or 4 GPUs (BENCHMARKS.md,
# "Pipeline parallelism"): the GPU tests that cover it (TESTS, default
# "pipeline_gpu_test model_gpu_test replica_set_test backend_test"), then
# //bench:pipeline in bf16 (1F1B over BENCH_STAGES, default 2,4; GPipe; a
# micro-batch of 1024) and TF32 (BENCH_ARGS: more flags for each). On 2 GPUs
# the 4-GPU parts skip. Logs under $OUT (default ./gpu-out).
#
# Build, from the repository root (on the GPU host, or on a build host and
# pack; see bench/lib.sh):
#   bazel build -c opt //model:pipeline_gpu_test //model:model_gpu_test \
#     //model:replica_set_test //kernels/cuda:backend_test //bench:pipeline
# Run from the repository root:
#   bash bench/pipeline_gpu_session.sh                  # programs in bazel-bin
#   DOWNPOUR_BIN=DIR TESTS=pipeline_gpu_test bash bench/pipeline_gpu_session.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1

# The package of each test TESTS may name.
declare -A PACKAGE=([pipeline_gpu_test]=model [model_gpu_test]=model [replica_set_test]=model
  [backend_test]=kernels/cuda)
for t in ${TESTS:-pipeline_gpu_test model_gpu_test replica_set_test backend_test}; do
  program=$(downpour_prog "${PACKAGE[$t]:-model}/$t") || { echo "$t rc=127 (not built)"; continue; }
  "$program" --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|error|gradient error|stages under|stage [0-9]: ' "$OUT/$t.log" |
    head -30
done

downpour_need PIPELINE bench/pipeline
STAGES=${BENCH_STAGES:-2,4}
# shellcheck disable=SC2086  # BENCH_ARGS: words
{
  "$PIPELINE" --stages="$STAGES" --precision=bf16 ${BENCH_ARGS:-}
  "$PIPELINE" --stages=4 --precision=bf16 --schedule=gpipe ${BENCH_ARGS:-}
  "$PIPELINE" --stages=4 --precision=bf16 --micro_batch=1024 ${BENCH_ARGS:-}
  "$PIPELINE" --stages=4 --precision=tf32 ${BENCH_ARGS:-}
} 2>&1 | tee "$OUT/bench.txt" | grep -v '^    stage'
