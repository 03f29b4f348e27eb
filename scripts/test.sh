#!/usr/bin/env bash
# Runs every test (unit tests beside the code, multi-process integration tests
# in tests/) with Bazel, offline, and ends with one line: N passed, N failed.
# Extra arguments go to `bazel test` (e.g. --test_filter=...).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log=$(mktemp -t downpour-test.XXXXXX)
layering=$(mktemp -t downpour-layering.XXXXXX)
trap 'rm -f "$log" "$layering"' EXIT
bazel test //... --test_output=errors "$@" 2>&1 | tee "$log" | grep -vE '^(INFO|Loading|Analyzing)'
# The dependency rules of ARCHITECTURE.md over the build graph (bazel query,
# so outside `bazel test`).
python3 "$ROOT/tests/layering_test.py" --junit "$layering"
python3 "$ROOT/scripts/count_tests.py" "$ROOT" "$log" "$layering"
