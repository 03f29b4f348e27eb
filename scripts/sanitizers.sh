#!/usr/bin/env bash
# Runs the tests under a sanitizer (docs/operations.md, "Sanitizers"), in a Bazel output
# base of its own so the main build's cache stays warm, at low priority. Not
# part of scripts/test.sh: the instrumented build and the slower daemons take
# far longer than CI's 20 minutes.
#
# usage: scripts/sanitizers.sh asan|tsan [BAZEL TEST ARGUMENTS...]
#   asan  every test, unit and integration (the daemons the integration tests
#         start are instrumented too): AddressSanitizer with LeakSanitizer,
#         and UndefinedBehaviorSanitizer
#   tsan  ThreadSanitizer on every package whose tests need no gRPC: the
#         parameter store (ps/), the parameter exchange and the worker
#         (worker/), the coordinator's state (control/), the shard runtime,
#         the data pipeline, the model, and the check that TSan sees
#         Abseil's synchronization (common/platform). Not rpc/, client/,
#         coordinator/ or tests/: Debian's gRPC is not instrumented, and what
#         it hands between threads reads as races.
# Further arguments go to `bazel test`, e.g. --test_filter=... or targets
# (which replace the default ones). SANITIZER_OUTPUT_BASE names the output
# base (default ~/.cache/downpour-asan or ~/.cache/downpour-tsan).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$ROOT/scripts/install-deps.sh" --test

sanitizer=${1:-}
case $sanitizer in
  asan)
    # Every package, named rather than //...: from another output base,
    # //... would also walk the workspace's bazel-* links into the main
    # build's output base.
    mapfile -t targets < <(git -C "$ROOT" ls-files '*BUILD.bazel' | cut -d/ -f1 | sort -u |
      sed 's|.*|//&/...|')
    ;;
  tsan)
    targets=(//common/... //control/... //data/... //kernels/... //model/... //ps/... //server/...
      //spec/... //worker/...)
    ;;
  *)
    awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"
    exit 2
    ;;
esac
shift
flags=()
for arg in "$@"; do
  if [[ $arg == //* || $arg == -//* ]]; then
    [[ ${replaced:-} ]] || targets=()
    replaced=1
    targets+=("$arg")
  else
    flags+=("$arg")
  fi
done

output_base=${SANITIZER_OUTPUT_BASE:-$HOME/.cache/downpour-$sanitizer}
exec nice -n 10 bazel --output_base="$output_base" test --config="$sanitizer" --keep_going \
  "${flags[@]}" -- "${targets[@]}"
