#!/usr/bin/env bash
# //bench:step_time on the CPU kernels with tiny loops: the models parse and
# train, and a JSON line comes out per model; every precision name is taken
# (the CPU computes each in fp32) and an unknown one is refused.
#   bazel test //bench:step_time_smoke_test
# or, from the repository root after `bazel build -c opt //bench:step_time`
# (or with DOWNPOUR_BIN=DIR; bench/lib.sh): bash bench/step_time_smoke_test.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" || exit 2
downpour_need STEP_TIME bench/step_time
out=$("$STEP_TIME" --device=-1 --models=mlp,cnn --batch=8 --steps=2 --repeats=1 --warmup=1)
echo "$out"
[[ $(grep -c '"step_ms_loop"' <<<"$out") == 2 ]]
for p in tf32 fp32_strict bf16 fp16; do
  out=$("$STEP_TIME" --device=-1 --models=mlp --batch=8 --steps=1 --repeats=1 --warmup=0 \
    --precision=$p 2>/dev/null)
  grep -q "\"precision\": \"$p\"" <<<"$out"
done
if "$STEP_TIME" --device=-1 --models=mlp --precision=FP32 2>/dev/null; then
  echo "--precision=FP32 (upper case) should be refused" >&2
  exit 1
fi
