#!/usr/bin/env bash
# Regenerates the TensorFlow-written reference records in this folder with
# real TensorFlow from PyPI, installed into a throwaway virtual environment
# (deleted afterwards; TF_VENV=DIR uses and keeps an existing one instead).
# The records and expected.txt are committed; data/image_reference_test reads
# them. Usage: data/testdata/make_tf_reference.sh
set -euo pipefail

TF_VERSION=2.16.2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

venv="${TF_VENV:-}"
if [[ -z "$venv" ]]; then
  venv="$(mktemp -d)/venv"
  trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "tensorflow-cpu==$TF_VERSION"
fi
TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" "$here/make_tf_reference.py" "$here"
