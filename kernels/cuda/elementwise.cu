// Element-wise CUDA kernels behind kernels/cuda (see launch.h): bias
// broadcast, scaling, type conversion and the reduced weight cast, loss-scale
// unscaling, ReLU, dropout, copy-or-add and add. Each mirrors a loop of
// kernels/cpu/layers.cc, element for element.
//
// The kernels are templates over the activation element type T (float,
// __nv_bfloat16, __half): they read T into fp32, compute in fp32 as the float
// version does and round once on store, so T = float runs the exact fp32
// arithmetic. The explicit instantiations are at the end of the file.
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
__global__ void BroadcastRowsKernel(int64_t rows, int64_t cols, const float* bias, T* y) {
  GRID_STRIDE(i, rows * cols) { y[i] = FromF<T>(bias[i % cols]); }
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  GRID_STRIDE(i, n) { x[i] = alpha == 0.f ? 0.f : alpha * x[i]; }
}

template <typename S, typename D>
__global__ void ConvertKernel(int64_t n, const S* x, D* y, const float* bias, int64_t channels,
                              bool accumulate, bool relu) {
  GRID_STRIDE(i, n) {
    float v = ToF(x[i]);
    if (bias != nullptr) v += bias[i % channels];
    if (relu) v = v > 0.f ? v : 0.f;
    y[i] = FromF<D>(accumulate ? ToF(y[i]) + v : v);
  }
}

// Elements per thread of the packed Convert: one 16-byte access on the
// narrower side (two on the wider side when the sizes differ).
template <typename S, typename D>
constexpr int kConvertPack = kPack<S> > kPack<D> ? kPack<S> : kPack<D>;

template <typename S, typename D>
__global__ void ConvertPackKernel(int64_t packs, const S* x, D* y, const float* bias,
                                  int64_t channels, bool accumulate, bool relu) {
  constexpr int N = kConvertPack<S, D>;
  GRID_STRIDE(i, packs) {
    float v[N];
    LoadF(x + i * N, v);
    if (bias != nullptr) {
      // The channel of the first element, then stepped (no division each).
      int64_t c = (i * N) % channels;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        v[k] += bias[c];
        if (++c == channels) c = 0;
      }
    }
    if (relu) {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = v[k] > 0.f ? v[k] : 0.f;
    }
    if (accumulate) {
      float old[N];
      LoadF(y + i * N, old);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = old[k] + v[k];
    }
    StoreF(y + i * N, v);
  }
}

// blockIdx.y is the range; blockIdx.x strides over its elements.
template <typename T>
__global__ void CastRangesToReducedKernel(const int64_t* src_begin, const int64_t* dst_begin,
                                          const int64_t* count, const float* x, T* y) {
  const int r = blockIdx.y;
  const float* in = x + src_begin[r];
  T* out = y + dst_begin[r];
  const int64_t n = count[r];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromF<T>(in[i]);
  }
}

__global__ void UnscaleCheckFiniteKernel(int64_t n, float inv_scale, float* g, int* flag) {
  bool bad = false;
  GRID_STRIDE(i, n) {
    const float v = g[i];
    bad |= !isfinite(v);
    g[i] = v * inv_scale;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

template <typename T>
__global__ void ReluForwardKernel(int64_t n, const T* x, T* y) {
  GRID_STRIDE(i, n) {
    const float v = ToF(x[i]);
    y[i] = FromF<T>(v > 0.f ? v : 0.f);
  }
}

template <typename T>
__global__ void ReluBackwardKernel(int64_t n, const T* y, const T* dy, T* dx, bool accumulate) {
  GRID_STRIDE(i, n) {
    const float g = ToF(y[i]) > 0.f ? ToF(dy[i]) : 0.f;
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + g : g);
  }
}

// The packed (16-byte) versions of the element-wise kernels: the same
// arithmetic per element, kPack<T> elements per thread.
template <typename T>
__global__ void ReluForwardPackKernel(int64_t packs, const T* x, T* y) {
  constexpr int N = kPack<T>;
  GRID_STRIDE(i, packs) {
    float v[N];
    LoadF(x + i * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = v[k] > 0.f ? v[k] : 0.f;
    StoreF(y + i * N, v);
  }
}

template <typename T>
__global__ void ReluBackwardPackKernel(int64_t packs, const T* y, const T* dy, T* dx,
                                       bool accumulate) {
  constexpr int N = kPack<T>;
  GRID_STRIDE(i, packs) {
    float v[N], g[N];
    LoadF(y + i * N, v);
    LoadF(dy + i * N, g);
#pragma unroll
    for (int k = 0; k < N; ++k) g[k] = v[k] > 0.f ? g[k] : 0.f;
    if (accumulate) {
      float d[N];
      LoadF(dx + i * N, d);
#pragma unroll
      for (int k = 0; k < N; ++k) g[k] = d[k] + g[k];
    }
    StoreF(dx + i * N, g);
  }
}

template <typename T>
__global__ void CopyOrAddPackKernel(int64_t packs, const T* x, T* y, bool accumulate) {
  constexpr int N = kPack<T>;
  GRID_STRIDE(i, packs) {
    float v[N];
    LoadF(x + i * N, v);
    if (accumulate) {
      float old[N];
      LoadF(y + i * N, old);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = old[k] + v[k];
    }
    StoreF(y + i * N, v);
  }
}

template <typename T>
__global__ void AddPackKernel(int64_t packs, const T* a, const T* b, T* y) {
  constexpr int N = kPack<T>;
  GRID_STRIDE(i, packs) {
    float u[N], v[N];
    LoadF(a + i * N, u);
    LoadF(b + i * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) u[k] += v[k];
    StoreF(y + i * N, u);
  }
}

template <typename T>
__global__ void DropoutForwardKernel(int64_t n, float rate, float scale, uint64_t key, const T* x,
                                     T* y, uint8_t* mask) {
  GRID_STRIDE(i, n) {
    const bool keep = rate <= 0.f || DropoutUniform(key, i) >= rate;
    mask[i] = keep ? 1 : 0;
    y[i] = FromF<T>(keep ? (rate <= 0.f ? ToF(x[i]) : ToF(x[i]) * scale) : 0.f);
  }
}

template <typename T>
__global__ void DropoutBackwardKernel(int64_t n, float scale, const uint8_t* mask, const T* dy,
                                      T* dx, bool accumulate) {
  GRID_STRIDE(i, n) {
    const float g = mask[i] ? ToF(dy[i]) * scale : 0.f;
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + g : g);
  }
}

template <typename T>
__global__ void CopyOrAddKernel(int64_t n, const T* x, T* y, bool accumulate) {
  GRID_STRIDE(i, n) {
    const float v = ToF(x[i]);
    y[i] = FromF<T>(accumulate ? ToF(y[i]) + v : v);
  }
}

template <typename T>
__global__ void AddBlockKernel(int64_t rows, int64_t width, const T* x, int64_t x_stride, T* y,
                               int64_t y_stride) {
  GRID_STRIDE(i, rows * width) {
    const int64_t r = i / width;
    const int64_t c = i - r * width;
    T* out = y + r * y_stride + c;
    *out = FromF<T>(ToF(*out) + ToF(x[r * x_stride + c]));
  }
}

template <typename T>
__global__ void AddKernel(int64_t n, const T* a, const T* b, T* y) {
  GRID_STRIDE(i, n) { y[i] = FromF<T>(ToF(a[i]) + ToF(b[i])); }
}

}  // namespace

template <typename T>
cudaError_t BroadcastRows(cudaStream_t stream, int64_t rows, int64_t cols, const float* bias,
                          T* y) {
  BroadcastRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t Scale(cudaStream_t stream, int64_t n, float alpha, float* x) {
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

template <typename S, typename D>
cudaError_t Convert(cudaStream_t stream, int64_t n, const S* x, D* y, const float* bias,
                    int64_t channels, bool accumulate, bool relu) {
  if (n <= 0) return cudaSuccess;
  constexpr int kN = kConvertPack<S, D>;
  if (Packed(n, kN, x, y)) {
    ConvertPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(n / kN, x, y, bias, channels,
                                                               accumulate, relu);
  } else {
    ConvertKernel<<<Blocks(n), kThreads, 0, stream>>>(n, x, y, bias, channels, accumulate, relu);
  }
  return cudaGetLastError();
}

cudaError_t CastRangesToReduced(cudaStream_t stream, int num_ranges, const int64_t* src_begin,
                                const int64_t* dst_begin, const int64_t* count, int64_t max_count,
                                const float* x, void* y, bool fp16) {
  if (num_ranges <= 0 || max_count <= 0) return cudaSuccess;
  // A few thousand blocks per range saturate the card; more would mostly
  // launch empty blocks for the short ranges.
  const dim3 grid(std::min(Blocks(max_count), 2048u), static_cast<unsigned>(num_ranges));
  if (fp16) {
    CastRangesToReducedKernel<<<grid, kThreads, 0, stream>>>(src_begin, dst_begin, count, x,
                                                             static_cast<__half*>(y));
  } else {
    CastRangesToReducedKernel<<<grid, kThreads, 0, stream>>>(src_begin, dst_begin, count, x,
                                                             static_cast<__nv_bfloat16*>(y));
  }
  return cudaGetLastError();
}

cudaError_t UnscaleCheckFinite(cudaStream_t stream, int64_t n, float inv_scale, float* g,
                               int* flag) {
  if (n <= 0) return cudaSuccess;
  UnscaleCheckFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(n, inv_scale, g, flag);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ReluForward(cudaStream_t stream, int64_t n, const T* x, T* y) {
  constexpr int kN = kPack<T>;
  if (Packed(n, kN, x, y)) {
    ReluForwardPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(n / kN, x, y);
  } else {
    ReluForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, x, y);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t ReluBackward(cudaStream_t stream, int64_t n, const T* y, const T* dy, T* dx,
                         bool accumulate) {
  constexpr int kN = kPack<T>;
  if (Packed(n, kN, y, dy, dx)) {
    ReluBackwardPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(n / kN, y, dy, dx, accumulate);
  } else {
    ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, y, dy, dx, accumulate);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t DropoutForward(cudaStream_t stream, int64_t n, float rate, uint64_t key, const T* x,
                           T* y, uint8_t* mask) {
  DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, rate, 1.f / (1.f - rate), key, x, y,
                                                           mask);
  return cudaGetLastError();
}

template <typename T>
cudaError_t DropoutBackward(cudaStream_t stream, int64_t n, float rate, const uint8_t* mask,
                            const T* dy, T* dx, bool accumulate) {
  DropoutBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, 1.f / (1.f - rate), mask, dy, dx,
                                                            accumulate);
  return cudaGetLastError();
}

template <typename T>
cudaError_t CopyOrAdd(cudaStream_t stream, int64_t n, const T* x, T* y, bool accumulate) {
  constexpr int kN = kPack<T>;
  if (Packed(n, kN, x, y)) {
    CopyOrAddPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(n / kN, x, y, accumulate);
  } else {
    CopyOrAddKernel<<<Blocks(n), kThreads, 0, stream>>>(n, x, y, accumulate);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t AddBlock(cudaStream_t stream, int64_t rows, int64_t width, const T* x, int64_t x_stride,
                     T* y, int64_t y_stride) {
  AddBlockKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(rows, width, x, x_stride, y,
                                                                y_stride);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Add(cudaStream_t stream, int64_t n, const T* a, const T* b, T* y) {
  constexpr int kN = kPack<T>;
  if (Packed(n, kN, a, b, y)) {
    AddPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(n / kN, a, b, y);
  } else {
    AddKernel<<<Blocks(n), kThreads, 0, stream>>>(n, a, b, y);
  }
  return cudaGetLastError();
}

// ---- Explicit instantiations: every activation template for each element
// type, and Convert for every (source, destination) pair.
#define DOWNPOUR_INSTANTIATE(T)                                                                   \
  template cudaError_t BroadcastRows<T>(cudaStream_t, int64_t, int64_t, const float*, T*);        \
  template cudaError_t ReluForward<T>(cudaStream_t, int64_t, const T*, T*);                       \
  template cudaError_t ReluBackward<T>(cudaStream_t, int64_t, const T*, const T*, T*, bool);      \
  template cudaError_t DropoutForward<T>(cudaStream_t, int64_t, float, uint64_t, const T*, T*,    \
                                         uint8_t*);                                               \
  template cudaError_t DropoutBackward<T>(cudaStream_t, int64_t, float, const uint8_t*, const T*, \
                                          T*, bool);                                              \
  template cudaError_t CopyOrAdd<T>(cudaStream_t, int64_t, const T*, T*, bool);                   \
  template cudaError_t AddBlock<T>(cudaStream_t, int64_t, int64_t, const T*, int64_t, T*,         \
                                   int64_t);                                                      \
  template cudaError_t Add<T>(cudaStream_t, int64_t, const T*, const T*, T*);

#define DOWNPOUR_INSTANTIATE_CONVERT(S, D)                                                       \
  template cudaError_t Convert<S, D>(cudaStream_t, int64_t, const S*, D*, const float*, int64_t, \
                                     bool, bool);

DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)

DOWNPOUR_INSTANTIATE_CONVERT(float, float)
DOWNPOUR_INSTANTIATE_CONVERT(float, __nv_bfloat16)
DOWNPOUR_INSTANTIATE_CONVERT(float, __half)
DOWNPOUR_INSTANTIATE_CONVERT(__nv_bfloat16, float)
DOWNPOUR_INSTANTIATE_CONVERT(__nv_bfloat16, __nv_bfloat16)
DOWNPOUR_INSTANTIATE_CONVERT(__nv_bfloat16, __half)
DOWNPOUR_INSTANTIATE_CONVERT(__half, float)
DOWNPOUR_INSTANTIATE_CONVERT(__half, __nv_bfloat16)
DOWNPOUR_INSTANTIATE_CONVERT(__half, __half)

#undef DOWNPOUR_INSTANTIATE_CONVERT
#undef DOWNPOUR_INSTANTIATE

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
