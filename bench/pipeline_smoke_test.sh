#!/usr/bin/env bash
# //bench:pipeline on CPU stages with a tiny model: it builds, runs both
# schedules over 2 and 3 stages, and prints a ratio row for each.
#   bazel test //bench:pipeline_smoke_test
# or, from the repository root after `bazel build -c opt //bench:pipeline`
# (or with DOWNPOUR_BIN=DIR; bench/lib.sh): bash bench/pipeline_smoke_test.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" || exit 2
downpour_need PIPELINE bench/pipeline
for schedule in 1f1b gpipe; do
  out=$("$PIPELINE" --cpu --stages=2,3 --width=32 --layers=6 --input=16 --micro_batch=4 \
    --steps=2 --repeats=1 --warmup=1 --precision=fp32 --schedule=$schedule)
  echo "$out"
  [[ $(grep -c '^| [23] | .* | \*\*' <<<"$out") == 2 ]]
done
if "$PIPELINE" --cpu --schedule=zigzag 2>/dev/null; then
  echo "--schedule=zigzag should be refused" >&2
  exit 1
fi
