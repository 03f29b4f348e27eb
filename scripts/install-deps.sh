#!/usr/bin/env bash
# Installs the Debian packages Downpour needs.
#   scripts/install-deps.sh          what building the daemons and running
#                                    them (scripts/demo.sh) needs
#   scripts/install-deps.sh --test   that, and what the test suite needs
#                                    (scripts/test.sh, fuzz.sh, sanitizers.sh)
# The test extras: GoogleTest and Google Benchmark; prometheus gives
# promtool, which tests/metrics_test runs over every daemon's /metrics;
# python3-yaml, shellcheck and chromium check deploy/ and the dashboards;
# slurm-wlm and munge are the one-node Slurm that deploy/slurm_test.py runs
# the CPU batch script on (about 20 s of apt); clang, its sanitizer and
# libFuzzer runtimes and lld build fuzz/.
# Idempotent: when everything is present it prints nothing and returns at
# once. The CUDA toolkit is not among them: the build uses it where it is
# installed and builds for the CPU only where it is not
# (third_party/system/system.bzl).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java default-jdk-headless
  build-essential pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libonnx-dev
  libabsl-dev libopenblas-dev libsqlite3-dev libssl-dev openssl
  zlib1g-dev libjpeg62-turbo-dev libpng-dev
  dataset-fashion-mnist python3-venv
)
TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus python3-yaml shellcheck chromium
  slurm-wlm munge
  clang libclang-rt-14-dev lld
)

case ${1:-} in
  "") ;;
  --test) PACKAGES+=("${TEST_PACKAGES[@]}") ;;
  *)
    echo "usage: scripts/install-deps.sh [--test]" >&2
    exit 2
    ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
