#!/usr/bin/env bash
# Compiles the gpu_ops CUDA sources with nvcc; no GPU needed. Exits non-zero on the first error.
#
#   custom_ops/gpu_ops/build.sh [all|harness|ops]     (default: all)
#     harness  harness/gpu_ops_c_api.cu, which includes every *_kernel.cuh, into
#              $BUILD_DIR/libfd_gpu_ops.so for each architecture in $ARCHS (the library
#              harness/run_gpu_tests.py loads through ctypes).
#     ops      each *_op.cu (the Paddle op wrappers) compiled with -c against the installed Paddle's
#              headers, for the first architecture in $ARCHS: a compile check, since linking needs a
#              CUDA build of Paddle (custom_ops/setup_ops.py builds them into fastdeploy_ops there).
#              Paddle's own CUDAExtension flags, plus -DPADDLE_NO_PYTHON: with the Python bindings
#              header, paddle/extension.h reaches phi/backends/dynload/cublas.h, which needs the
#              cuBLAS headers (<cublasXt.h>), absent from a toolkit without cuBLAS.
#
# Environment: ARCHS (default "80 90"; "native" for the GPU of this machine), BUILD_DIR (default
# /tmp/fd_gpu_ops_build), NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), PYTHON.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGET="${1:-all}"
ARCHS="${ARCHS:-80 90}"
BUILD_DIR="${BUILD_DIR:-/tmp/fd_gpu_ops_build}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
PYTHON="${PYTHON:-python}"
# the flags of custom_ops/setup_ops.py (NVCC_FLAGS)
FLAGS=(-O3 --use_fast_math -std=c++17 -Xcompiler -fPIC)

gencode() {  # -gencode options for the architectures in ARCHS
  local arch
  for arch in $ARCHS; do
    if [[ "$arch" == native ]]; then echo "-arch=native"; else echo "-gencode=arch=compute_${arch},code=sm_${arch}"; fi
  done
}

build_harness() {
  mkdir -p "$BUILD_DIR"
  echo "harness: $HERE/harness/gpu_ops_c_api.cu -> $BUILD_DIR/libfd_gpu_ops.so (archs: $ARCHS)"
  # shellcheck disable=SC2046
  "$NVCC" "${FLAGS[@]}" $(gencode) -shared -o "$BUILD_DIR/libfd_gpu_ops.so" "$HERE/harness/gpu_ops_c_api.cu"
}

build_ops() {
  local includes
  includes="$("$PYTHON" -c '
from paddle.utils.cpp_extension.extension_utils import find_paddle_includes, find_python_includes
print(" ".join("-I" + d for d in find_paddle_includes(False) + find_python_includes()))' 2>/dev/null)" || {
    echo "ops: cannot import paddle with $PYTHON: no headers to check the op wrappers against" >&2
    return 1
  }
  local first_arch="${ARCHS%% *}" source
  mkdir -p "$BUILD_DIR/ops"
  for source in "$HERE"/*_op.cu; do
    echo "ops: $(basename "$source") (arch $first_arch)"
    # shellcheck disable=SC2086,SC2046
    "$NVCC" "${FLAGS[@]}" $(ARCHS="$first_arch" gencode) -DPADDLE_WITH_CUDA -DEIGEN_USE_GPU -DNVCC \
      -DPADDLE_WITH_CUSTOM_KERNEL -DPADDLE_NO_PYTHON --expt-relaxed-constexpr -w $includes \
      -c "$source" -o "$BUILD_DIR/ops/$(basename "$source" .cu).o"
  done
}

echo "nvcc: $("$NVCC" --version | tail -n 1)"
case "$TARGET" in
  harness) build_harness ;;
  ops) build_ops ;;
  all)
    build_harness
    build_ops
    ;;
  *) echo "usage: $0 [all|harness|ops]" >&2; exit 2 ;;
esac
echo "build.sh $TARGET: ok"
