// Layout changes behind the convolutions of kernels/cuda (see launch.h):
// explicit padding of NHWC images for shapes cuDNN cannot pad (any element
// type T, read and rounded as every kernel here does) and the fp32 NHWC <->
// NCHW transposes of the NCHW convolution path, with their adjoints.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_helpers.cuh"
#include "kernels/cuda/launch.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace internal {
namespace {

template <typename T>
__global__ void PadImagesKernel(WindowShape s, int64_t ph, int64_t pw, const T* x, T* padded) {
  GRID_STRIDE(i, s.batch * ph * pw * s.in_c) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % pw - s.pad_left;
    rest /= pw;
    const int64_t h = rest % ph - s.pad_top;
    const int64_t n = rest / ph;
    padded[i] = FromF<T>((h >= 0 && h < s.in_h && w >= 0 && w < s.in_w)
                             ? ToF(x[((n * s.in_h + h) * s.in_w + w) * s.in_c + c])
                             : 0.f);
  }
}

template <typename T>
__global__ void CropImagesKernel(WindowShape s, int64_t ph, int64_t pw, const T* dpadded, T* dx,
                                 bool accumulate) {
  GRID_STRIDE(i, s.batch * s.in_elements()) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % s.in_w;
    rest /= s.in_w;
    const int64_t h = rest % s.in_h;
    const int64_t n = rest / s.in_h;
    const int64_t hp = h + s.pad_top;
    const int64_t wp = w + s.pad_left;
    // Rows past the last window (negative bottom padding) get no gradient.
    const float g =
        (hp < ph && wp < pw) ? ToF(dpadded[((n * ph + hp) * pw + wp) * s.in_c + c]) : 0.f;
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + g : g);
  }
}

// ---- Layout changes.
constexpr int kTransposeTile = 32;

// grid (col tiles, row tiles, batch), block (32, 8).
__global__ void BatchedTransposeKernel(int64_t rows, int64_t cols, const float* in, float* out,
                                       const float* bias, bool accumulate) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];
  const int64_t b = blockIdx.z;
  const float* src = in + b * rows * cols;
  float* dst = out + b * rows * cols;
  const int64_t c0 = blockIdx.x * static_cast<int64_t>(kTransposeTile);
  const int64_t r0 = blockIdx.y * static_cast<int64_t>(kTransposeTile);
  for (int j = threadIdx.y; j < kTransposeTile; j += blockDim.y) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTransposeTile; j += blockDim.y) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) {
      float v = tile[threadIdx.x][j];
      if (bias != nullptr) v += bias[r];
      float* o = dst + c * rows + r;
      *o = accumulate ? *o + v : v;
    }
  }
}

__global__ void PadToNchwKernel(WindowShape s, int64_t ph, int64_t pw, const float* x,
                                float* padded) {
  GRID_STRIDE(i, s.batch * s.in_c * ph * pw) {
    const int64_t w = i % pw - s.pad_left;
    int64_t rest = i / pw;
    const int64_t h = rest % ph - s.pad_top;
    rest /= ph;
    const int64_t c = rest % s.in_c;
    const int64_t n = rest / s.in_c;
    padded[i] = (h >= 0 && h < s.in_h && w >= 0 && w < s.in_w)
                    ? x[((n * s.in_h + h) * s.in_w + w) * s.in_c + c]
                    : 0.f;
  }
}

__global__ void CropFromNchwKernel(WindowShape s, int64_t ph, int64_t pw, const float* dpadded,
                                   float* dx, bool accumulate) {
  GRID_STRIDE(i, s.batch * s.in_elements()) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % s.in_w;
    rest /= s.in_w;
    const int64_t h = rest % s.in_h;
    const int64_t n = rest / s.in_h;
    const int64_t hp = h + s.pad_top;
    const int64_t wp = w + s.pad_left;
    const float g = (hp < ph && wp < pw) ? dpadded[((n * s.in_c + c) * ph + hp) * pw + wp] : 0.f;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

}  // namespace

template <typename T>
cudaError_t PadImages(cudaStream_t stream, const WindowShape& s, int64_t padded_h, int64_t padded_w,
                      const T* x, T* padded) {
  PadImagesKernel<<<Blocks(s.batch * padded_h * padded_w * s.in_c), kThreads, 0, stream>>>(
      s, padded_h, padded_w, x, padded);
  return cudaGetLastError();
}

template <typename T>
cudaError_t CropImages(cudaStream_t stream, const WindowShape& s, int64_t padded_h,
                       int64_t padded_w, const T* dpadded, T* dx, bool accumulate) {
  CropImagesKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(
      s, padded_h, padded_w, dpadded, dx, accumulate);
  return cudaGetLastError();
}

cudaError_t BatchedTranspose(cudaStream_t stream, int64_t batch, int64_t rows, int64_t cols,
                             const float* in, float* out, const float* bias, bool accumulate) {
  if (batch == 0 || rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + kTransposeTile - 1) / kTransposeTile),
                  static_cast<unsigned>((rows + kTransposeTile - 1) / kTransposeTile),
                  static_cast<unsigned>(batch));
  BatchedTransposeKernel<<<grid, dim3(kTransposeTile, 8), 0, stream>>>(rows, cols, in, out, bias,
                                                                       accumulate);
  return cudaGetLastError();
}

cudaError_t PadToNchw(cudaStream_t stream, const WindowShape& s, int64_t ph, int64_t pw,
                      const float* x, float* padded) {
  PadToNchwKernel<<<Blocks(s.batch * s.in_c * ph * pw), kThreads, 0, stream>>>(s, ph, pw, x,
                                                                               padded);
  return cudaGetLastError();
}

cudaError_t CropFromNchw(cudaStream_t stream, const WindowShape& s, int64_t ph, int64_t pw,
                         const float* dpadded, float* dx, bool accumulate) {
  CropFromNchwKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(s, ph, pw, dpadded,
                                                                                 dx, accumulate);
  return cudaGetLastError();
}

#define DOWNPOUR_INSTANTIATE(T)                                                                    \
  template cudaError_t PadImages<T>(cudaStream_t, const WindowShape&, int64_t, int64_t, const T*,  \
                                    T*);                                                           \
  template cudaError_t CropImages<T>(cudaStream_t, const WindowShape&, int64_t, int64_t, const T*, \
                                     T*, bool);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
