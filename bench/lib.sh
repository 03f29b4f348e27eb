# shellcheck shell=bash
# Sourced by the bench/*.sh scripts: where the programs they run come from.
#
# With DOWNPOUR_BIN=DIR, from DIR: a folder of programs (an install prefix's
# bin), or a folder written by scripts/pack-binaries.sh (programs in DIR/bin,
# their libraries in DIR/lib, and DIR/env.sh, which is sourced here so that
# the packed libraries and the host's CUDA libraries are found). Pack on the
# build host, copy the folder (or its .tar.xz with --tar) to the GPU host,
# and run there from a checkout of this repository:
#   scripts/pack-binaries.sh --tar out/downpour bazel-bin/server/downpour-ps ...
#   DOWNPOUR_BIN=downpour bash bench/gpu_session.sh
# Without DOWNPOUR_BIN, from bazel-bin/ of this repository: build the targets
# a script's header names with `bazel build -c opt` there first. Under
# `bazel test` (the smoke tests), from the test's runfiles.
#
# Also sets DOWNPOUR_ROOT (the repository) and FASHION_MNIST_DIR (the
# Fashion-MNIST IDX .gz files; default /usr/share/datasets/fashion-mnist, as
# scripts/install-deps.sh installs them).

DOWNPOUR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FASHION_MNIST_DIR=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}

if [[ -n ${DOWNPOUR_BIN:-} ]]; then
  if [[ ! -d $DOWNPOUR_BIN ]]; then
    echo "DOWNPOUR_BIN=$DOWNPOUR_BIN: no such folder" >&2
    return 1
  fi
  DOWNPOUR_BIN=$(cd "$DOWNPOUR_BIN" && pwd)
  if [[ -f $DOWNPOUR_BIN/env.sh ]]; then
    # shellcheck source=/dev/null
    source "$DOWNPOUR_BIN/env.sh"
  elif [[ $(basename "$DOWNPOUR_BIN") == bin && -f $DOWNPOUR_BIN/../env.sh ]]; then
    # shellcheck source=/dev/null
    source "$DOWNPOUR_BIN/../env.sh"
  fi
fi
# NVLink SHARP (multicast) stays off, as in a packed folder's env.sh: on a host
# whose GPUs others share, a program that uses it can put those GPUs out of
# service, and no collective of Downpour's needs it.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

# downpour_prog PACKAGE/NAME: prints the path of the program of Bazel target
# //PACKAGE:NAME (e.g. server/downpour-ps), or says on stderr where it looked
# and returns 1.
downpour_prog() {
  local path
  if [[ -n ${DOWNPOUR_BIN:-} ]]; then
    path=$DOWNPOUR_BIN/${1##*/}
    [[ -d $DOWNPOUR_BIN/bin ]] && path=$DOWNPOUR_BIN/bin/${1##*/}
  elif [[ -n ${TEST_SRCDIR:-} ]]; then
    path=$DOWNPOUR_ROOT/$1
  else
    path=$DOWNPOUR_ROOT/bazel-bin/$1
  fi
  if [[ ! -x $path ]]; then
    echo "no $path: build //${1%/*}:${1##*/} (bazel build -c opt), or set DOWNPOUR_BIN" >&2
    return 1
  fi
  echo "$path"
}

# downpour_need VAR PACKAGE/NAME: sets VAR to downpour_prog's path, or exits
# the script (status 2) when the program is not there.
downpour_need() {
  local path
  path=$(downpour_prog "$2") || exit 2
  printf -v "$1" '%s' "$path"
}

# downpour_runfiles DIR: makes DIR a runfiles tree holding the daemons, for
# the benchmarks that start them as tests do (//bench:transport,
# //bench:sparse: run them with TEST_SRCDIR=DIR TEST_WORKSPACE=downpour).
downpour_runfiles() {
  local program path
  for program in coordinator/downpour-coordinator server/downpour-ps client/downpourctl; do
    path=$(downpour_prog "$program") || return 1
    mkdir -p "$1/downpour/${program%/*}"
    ln -sf "$path" "$1/downpour/$program"
  done
}
