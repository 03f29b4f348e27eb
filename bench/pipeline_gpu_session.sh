#!/usr/bin/env bash
# The pipeline's GPU work in one call of the device tool (BENCHMARKS.md,
# "Pipeline parallelism"): the GPU tests that cover it, then //bench:pipeline
# in bf16 (1F1B and GPipe) and TF32. Logs under $OUT (or ./gpu-out).
#
# Here (no GPU needed):
#   bazel build -c opt //model:pipeline_gpu_test //model:model_gpu_test \
#     //model:replica_set_test //kernels/cuda:backend_test //bench:pipeline
#   O=bazel-out/k8-opt/bin; ../shared/tools/device-bundle .device-pipeline/bundle \
#     $O/model/pipeline_gpu_test $O/model/model_gpu_test $O/model/replica_set_test \
#     $O/kernels/cuda/backend_test $O/bench/pipeline
#   (cd .device-pipeline && tar -cf - bundle | xz -T2 > bundle.tar.xz && rm -rf bundle)
# Then the device tool, kind nvidia-h100-x4 (or x2: the 4-GPU parts skip),
# carry [".device-pipeline"], command "bash bench/pipeline_gpu_session.sh".
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[[ -f .device-pipeline/bundle.tar.xz && ! -d .device-pipeline/bundle ]] &&
  tar -xJf .device-pipeline/bundle.tar.xz -C .device-pipeline
source .device-pipeline/bundle/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1

for t in ${TESTS:-pipeline_gpu_test model_gpu_test replica_set_test backend_test}; do
  $t --gtest_color=no >"$OUT/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|error|gradient error|stages under|stage [0-9]: ' "$OUT/$t.log" |
    head -30
done

STAGES=${BENCH_STAGES:-2,4}
{
  pipeline --stages=$STAGES --precision=bf16 ${BENCH_ARGS:-}
  pipeline --stages=4 --precision=bf16 --schedule=gpipe ${BENCH_ARGS:-}
  pipeline --stages=4 --precision=bf16 --micro_batch=1024 ${BENCH_ARGS:-}
  pipeline --stages=4 --precision=tf32 ${BENCH_ARGS:-}
} 2>&1 | tee "$OUT/bench.txt" | grep -v '^    stage'
