#!/usr/bin/env bash
# Runs every test (unit tests beside the code, multi-process integration tests
# in tests/) with Bazel, offline, and ends with one line: N passed, N failed.
# Extra arguments go to `bazel test` (e.g. --test_filter=...).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$ROOT/scripts/install-deps.sh" --test

# Each phase's wall time, said as it ends (CI's budget is the sum).
phase_start=$SECONDS
phase_done() {
  echo "test.sh: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)"
  phase_start=$SECONDS
}

log=$(mktemp -t downpour-test.XXXXXX)
layering=$(mktemp -t downpour-layering.XXXXXX)
export_xml=$(mktemp -t downpour-export.XXXXXX)
onnx_xml=$(mktemp -t downpour-onnx.XXXXXX)
tensorboard_xml=$(mktemp -t downpour-tensorboard.XXXXXX)
pyclient_xml=$(mktemp -t downpour-pyclient.XXXXXX)
deploy_xml=$(mktemp -t downpour-deploy.XXXXXX)
slurm_xml=$(mktemp -t downpour-slurm.XXXXXX)
cpu_only_xml=$(mktemp -t downpour-cpu-only.XXXXXX)
fuzz_xml=$(mktemp -t downpour-fuzz.XXXXXX)
venv_out=$(mktemp -t downpour-venv.XXXXXX)
trap 'rm -f "$log" "$layering" "$export_xml" "$onnx_xml" "$tensorboard_xml" "$pyclient_xml" "$deploy_xml" "$slurm_xml" "$cpu_only_xml" "$fuzz_xml" "$venv_out"' EXIT
# The pinned PyPI venv of the Python checks below is made while Bazel builds
# (downloads, not CPU).
"$ROOT/scripts/python-deps.sh" >"$venv_out" &
venv_pid=$!
# The fuzz targets (clang, ASan: an output base of their own, minutes cold)
# build at the lowest priority while the tests run: the integration tests
# mostly wait (heartbeats, timeouts), so the build takes the idle CPU and
# the fuzz step below finds it done.
fuzz_build_log=$(mktemp -t downpour-fuzz-build.XXXXXX)
if [[ ${FUZZ_SECONDS:-10} != 0 ]]; then
  nice -n 19 bazel --output_base="${FUZZ_OUTPUT_BASE:-$HOME/.cache/downpour-fuzz}" build \
    --config=fuzz //fuzz:all >"$fuzz_build_log" 2>&1 &
  fuzz_build_pid=$!
fi
# One disk cache for the main build and the CPU-only build below: the actions
# that CUDA does not change are built once.
disk_cache=${DOWNPOUR_DISK_CACHE:-$HOME/.cache/downpour-disk}
bazel test --disk_cache="$disk_cache" //... --test_output=errors "$@" 2>&1 | tee "$log" | grep -vE '^(INFO|Loading|Analyzing)'
phase_done "bazel test //..."
# The dependency rules of docs/architecture.md over the build graph (bazel query,
# so outside `bazel test`).
python3 "$ROOT/tests/layering_test.py" --junit "$layering"
# Exported models loaded by NumPy through the PyPI safetensors package (pinned
# in a venv); without them the check reports itself skipped, with the reason.
python=python3
wait "$venv_pid" && python=$(cat "$venv_out")
"$python" "$ROOT/tests/export_numpy_test.py" --bin "$(bazel info bazel-bin 2>/dev/null)" \
  --junit "$export_xml"
# `export --format=onnx` of three short jobs, checked by PyPI onnx and run by
# onnxruntime on the test records (same venv; skipped without it; ~1 min).
"$python" "$ROOT/tests/onnx_test.py" --bin "$(bazel info bazel-bin 2>/dev/null)" \
  --junit "$onnx_xml"
# The coordinator's TensorBoard event files, read during a job by PyPI
# tensorboard's EventAccumulator (same venv; skipped without it).
"$python" "$ROOT/tests/tensorboard_test.py" --bin "$(bazel info bazel-bin 2>/dev/null)" \
  --junit "$tensorboard_xml"
# The Python client (python/, pip-installed from a copy into a temp folder
# with the venv's pinned grpcio-tools) against a coordinator, a shard and a
# worker, and a TLS coordinator (same venv; skipped without it; ~15 s).
"$python" "$ROOT/tests/python_client_test.py" --bin "$(bazel info bazel-bin 2>/dev/null)" \
  --junit "$pyclient_xml"
# deploy/ against the built daemons' flags and ports, plus promtool,
# systemd-analyze and the other tools it finds (Debian's python3 for PyYAML;
# hadolint from the venv).
/usr/bin/python3 "$ROOT/deploy/deploy_test.py" --bin "$(bazel info bazel-bin 2>/dev/null)" \
  --hadolint "$ROOT/.venv/bin/hadolint" --junit "$deploy_xml"
# deploy/slurm/downpour-cpu.sbatch trains a short job on a one-node Slurm of
# its own (munged, slurmctld, slurmd from a temp dir; about 15 s; root only,
# skipped elsewhere or without Slurm).
/usr/bin/python3 "$ROOT/deploy/slurm_test.py" --bin "$(bazel info bazel-bin 2>/dev/null)" \
  --junit "$slurm_xml"
phase_done "layering, Python, deploy and Slurm checks"
# The daemons built with the CUDA toolkit hidden (a second Bazel output base in
# a temp dir; from the disk cache but for what CUDA changes) train a short job
# on the CPU. (Beside the Python checks above it took 198 s and slowed them:
# both want the two cores.)
python3 "$ROOT/tests/cpu_only_build_test.py" --junit "$cpu_only_xml" --disk_cache "$disk_cache"
phase_done "CPU-only build"
# Each fuzz target of fuzz/ for FUZZ_SECONDS (default 10; 0 skips them), two at
# a time, over a copy of its seeds: clang, ASan and UBSan in an output base of
# its own (a cold build of about 4.5 min on 2 busy cores; warm in
# ~/.cache/downpour-fuzz after that). A crash fails its case; the run's
# directory (crash inputs, logs) is kept then.
[[ -n ${fuzz_build_pid:-} ]] && wait "$fuzz_build_pid"
rm -f "$fuzz_build_log"
fuzz_out=$(mktemp -d -t downpour-fuzz-run.XXXXXX)
FUZZ_OUT=$fuzz_out "$ROOT/scripts/fuzz.sh" --junit "$fuzz_xml" --parallel 2 "${FUZZ_SECONDS:-10}" &&
  rm -rf "$fuzz_out"
phase_done "fuzz targets"
python3 "$ROOT/scripts/count_tests.py" "$ROOT" "$log" "$layering" "$export_xml" "$onnx_xml" \
  "$tensorboard_xml" "$pyclient_xml" "$deploy_xml" "$slurm_xml" "$cpu_only_xml" "$fuzz_xml"
