#!/usr/bin/env bash
# //bench:step_time on the CPU kernels with tiny loops: the models parse and
# train, and a JSON line comes out per model.
set -euo pipefail
out=$(bench/step_time --device=-1 --models=mlp,cnn --batch=8 --steps=2 --repeats=1 --warmup=1)
echo "$out"
[[ $(grep -c '"step_ms_loop"' <<<"$out") == 2 ]]
