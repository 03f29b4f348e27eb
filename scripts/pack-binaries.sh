#!/usr/bin/env bash
# Packs built programs for a host that has no build toolchain (a GPU host that
# runs the bench/*.sh scripts, say). Each PROGRAM is copied to OUT_DIR/bin and
# every shared library it needs (as ldd resolves them here) to OUT_DIR/lib,
# and the copies are stripped. Left out, to be found on the host instead:
# glibc's own libraries (the loader, libc, libm, libpthread, ...: they must be
# the host's) and the CUDA and NVIDIA libraries (libcuda, libnvidia*,
# libcudart, libcublas*, libcudnn*, libnccl, libcurand, libcufft, libcusparse,
# libcusolver, libnvrtc, libnvJitLink: they must match the host's driver).
#
# OUT_DIR/env.sh, sourced by bash on the host, puts OUT_DIR/lib first on
# LD_LIBRARY_PATH, then the host's CUDA libraries (/usr/local/cuda/lib64 and
# the lib folders of pip's nvidia packages, found with python3, where there
# are any), puts OUT_DIR/bin first on PATH and sets NCCL_NVLS_ENABLE=0. It
# finds its folder wherever OUT_DIR is moved or unpacked.
#
# usage: scripts/pack-binaries.sh [--tar] [--symbols] OUT_DIR PROGRAM...
#   --tar       also write OUT_DIR.tar.xz, whose one top folder is OUT_DIR's name
#   --symbols   keep the symbol tables (for perf on the other host); debug
#               information is stripped either way
# e.g.
#   bazel build -c opt //server:downpour-ps //client:downpourctl
#   scripts/pack-binaries.sh --tar out/downpour bazel-bin/server/downpour-ps \
#     bazel-bin/client/downpourctl
#   # on the other host, beside a checkout of this repository:
#   tar -xJf downpour.tar.xz && DOWNPOUR_BIN=downpour bash bench/gpu_session.sh
# Exits non-zero, naming the program, when a program is missing or needs a
# library that ldd does not find here (CUDA's and glibc's excepted).
set -euo pipefail

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 2
}

make_tar=0
strip_flag=--strip-unneeded
while [[ ${1:-} == -* ]]; do
  case $1 in
    -h | --help) usage ;;
    --tar) make_tar=1; shift ;;
    --symbols) strip_flag=--strip-debug; shift ;;
    *) usage ;;
  esac
done
(($# >= 2)) || usage
out=$1
shift

# Whether a library (its file name) stays behind: glibc's, CUDA's, NVIDIA's.
from_host() {
  case $1 in
    ld-linux*.so* | libc.so* | libm.so* | libmvec.so* | libpthread.so* | libdl.so* | \
      librt.so* | libresolv.so* | libutil.so* | libanl.so* | libnsl.so* | libnss_*.so* | \
      libBrokenLocale.so* | libthread_db.so* | libc_malloc_debug.so*)
      return 0 ;;
    libcuda.so* | libnvidia* | libcudart.so* | libcublas* | libcudnn* | libnccl.so* | \
      libcurand.so* | libcufft.so* | libcusparse.so* | libcusolver.so* | libnvrtc* | \
      libnvJitLink*)
      return 0 ;;
  esac
  return 1
}

mkdir -p "$out/bin" "$out/lib"
for program in "$@"; do
  [[ -f $program && -x $program ]] || { echo "pack-binaries: $program: no such program" >&2; exit 1; }
  install -m 755 "$program" "$out/bin/"
  strip "$strip_flag" "$out/bin/$(basename "$program")"
  # ldd's lines: "NAME => PATH (ADDRESS)", "NAME => not found", or a path or
  # the vDSO alone (nothing to copy). A static program or a script has none.
  libraries=$(ldd "$program" 2>/dev/null) || continue
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    from_host "$name" && continue
    if [[ $path == not ]]; then
      echo "pack-binaries: $program needs $name, which ldd does not find here" >&2
      exit 1
    fi
    [[ -f $out/lib/$name ]] && continue
    install -m 644 "$path" "$out/lib/$name"
    strip "$strip_flag" "$out/lib/$name"
  done <<<"$libraries"
done

cat >"$out/env.sh" <<'EOF'
# Sourced (bash): the programs packed beside this file by
# scripts/pack-binaries.sh, their libraries, then the host's CUDA libraries.
_downpour_pack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_downpour_libs=$_downpour_pack/lib
if [[ -d /usr/local/cuda/lib64 ]]; then
  _downpour_libs=$_downpour_libs:/usr/local/cuda/lib64
fi
# pip's nvidia-* packages (cuDNN, cuBLAS, NCCL, ... as PyTorch installs them)
# keep their libraries in site-packages/nvidia/*/lib.
if command -v python3 >/dev/null 2>&1; then
  _downpour_pip=$(python3 -c '
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))
' 2>/dev/null || true)
  if [[ -n $_downpour_pip ]]; then
    _downpour_libs=$_downpour_libs:$_downpour_pip
  fi
fi
export LD_LIBRARY_PATH=$_downpour_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$_downpour_pack/bin:$PATH
# NVLink SHARP (multicast) stays off: on a host whose GPUs others share, a
# program that uses it can put those GPUs out of service, and no collective
# of Downpour's needs it.
export NCCL_NVLS_ENABLE=0
unset _downpour_pack _downpour_libs _downpour_pip
EOF

echo "pack-binaries: $# program(s), $(find "$out/lib" -type f | wc -l) libraries in $out ($(du -sh "$out" | cut -f1))"
if ((make_tar)); then
  parent=$(dirname "$out")
  top=$(basename "$out")
  tar -C "$parent" -cf - "$top" | xz -T0 >"$out.tar.xz"
  echo "pack-binaries: $out.tar.xz ($(du -h "$out.tar.xz" | cut -f1))"
fi
