// Pooling kernels behind kernels/cuda (see launch.h): max, average and
// global average pooling over NHWC images and their gradients. Each mirrors a
// loop of kernels/cpu/layers.cc, and max pooling picks the same (first)
// maximum of a window as the CPU twin.
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

struct Range {
  int64_t h0, h1, w0, w1;
};

__device__ __forceinline__ Range RangeOf(const WindowShape& s, int64_t oh, int64_t ow) {
  const int64_t h = oh * s.stride_h - s.pad_top;
  const int64_t w = ow * s.stride_w - s.pad_left;
  return {h > 0 ? h : 0, min(h + s.kernel_h, s.in_h), w > 0 ? w : 0, min(w + s.kernel_w, s.in_w)};
}

// The flat (h * in_w + w) position of the first maximum of window (oh, ow)
// in channel c of image xn, as MaxPoolBackward on the CPU picks it (values
// compared as floats, as WindowArgMax does for the forward).
template <typename T>
__device__ __forceinline__ int64_t ArgMax(const WindowShape& s, const T* xn, int64_t oh, int64_t ow,
                                          int64_t c) {
  const Range r = RangeOf(s, oh, ow);
  int64_t best = r.h0 * s.in_w + r.w0;
  float best_value = ToF(xn[best * s.in_c + c]);
  for (int64_t h = r.h0; h < r.h1; ++h) {
    for (int64_t w = r.w0; w < r.w1; ++w) {
      const float v = ToF(xn[(h * s.in_w + w) * s.in_c + c]);
      if (v > best_value) {
        best_value = v;
        best = h * s.in_w + w;
      }
    }
  }
  return best;
}

// Index arithmetic in I: 32-bit where the tensors allow (64-bit divisions
// dominated the pooling kernels).
template <typename I>
struct Window {
  I batch, in_h, in_w, in_c, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, pad_top,
      pad_left;
  explicit Window(const WindowShape& s)
      : batch(static_cast<I>(s.batch)),
        in_h(static_cast<I>(s.in_h)),
        in_w(static_cast<I>(s.in_w)),
        in_c(static_cast<I>(s.in_c)),
        out_h(static_cast<I>(s.out_h)),
        out_w(static_cast<I>(s.out_w)),
        kernel_h(static_cast<I>(s.kernel_h)),
        kernel_w(static_cast<I>(s.kernel_w)),
        stride_h(static_cast<I>(s.stride_h)),
        stride_w(static_cast<I>(s.stride_w)),
        pad_top(static_cast<I>(s.pad_top)),
        pad_left(static_cast<I>(s.pad_left)) {}
};

// Thread per output: the first maximum of its window (as the CPU twin) ...
// and, for MaxPoolScatterKernel, the gradient written over the whole window.
template <typename I, typename T>
__device__ __forceinline__ void WindowArgMax(const Window<I>& s, const T* x, I i, I* n_out, I* h0,
                                             I* h1, I* w0, I* w1, I* c_out, I* best) {
  const I c = i % s.in_c;
  I rest = i / s.in_c;
  const I ow = rest % s.out_w;
  rest /= s.out_w;
  const I oh = rest % s.out_h;
  const I n = rest / s.out_h;
  const I hs = oh * s.stride_h - s.pad_top, ws = ow * s.stride_w - s.pad_left;
  *h0 = hs > 0 ? hs : 0;
  *h1 = min(hs + s.kernel_h, s.in_h);
  *w0 = ws > 0 ? ws : 0;
  *w1 = min(ws + s.kernel_w, s.in_w);
  const T* xn = x + n * s.in_h * s.in_w * s.in_c;
  I arg = *h0 * s.in_w + *w0;
  float best_value = ToF(xn[arg * s.in_c + c]);
  for (I h = *h0; h < *h1; ++h) {
    for (I w = *w0; w < *w1; ++w) {
      const float v = ToF(xn[(h * s.in_w + w) * s.in_c + c]);
      if (v > best_value) {
        best_value = v;
        arg = h * s.in_w + w;
      }
    }
  }
  *n_out = n;
  *c_out = c;
  *best = arg;
}

// The maximum is one of the inputs, so it is copied as T (no rounding).
template <typename I, typename T>
__global__ void MaxPoolForwardFastKernel(Window<I> s, I total, const T* x, T* y) {
  for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    I n, h0, h1, w0, w1, c, arg;
    WindowArgMax(s, x, i, &n, &h0, &h1, &w0, &w1, &c, &arg);
    y[i] = x[(n * s.in_h * s.in_w + arg) * s.in_c + c];
  }
}

// Windows that do not overlap (stride >= kernel): each input is in at most
// one window, so a thread per output writes its window's gradient with no
// race. Inputs in no window are left alone (zeroed first for an overwrite).
template <typename I, typename T>
__global__ void MaxPoolScatterKernel(Window<I> s, I total, const T* x, const T* dy, T* dx,
                                     bool accumulate) {
  for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    I n, h0, h1, w0, w1, c, arg;
    WindowArgMax(s, x, i, &n, &h0, &h1, &w0, &w1, &c, &arg);
    const float g = ToF(dy[i]);
    T* dxn = dx + n * s.in_h * s.in_w * s.in_c;
    for (I h = h0; h < h1; ++h) {
      for (I w = w0; w < w1; ++w) {
        const I p = h * s.in_w + w;
        const float v = p == arg ? g : 0.f;
        T* o = dxn + p * s.in_c + c;
        *o = FromF<T>(accumulate ? ToF(*o) + v : v);
      }
    }
  }
}

// The output windows that cover input position p (one axis): [first, last].
__device__ __forceinline__ void Covering(int64_t p, int64_t pad, int64_t kernel, int64_t stride,
                                         int64_t out, int64_t* first, int64_t* last) {
  const int64_t q = p + pad;  // Position in padded coordinates.
  // Window o covers q when o * stride <= q < o * stride + kernel.
  *first = q - kernel + 1 <= 0 ? 0 : (q - kernel + 1 + stride - 1) / stride;
  *last = min(q / stride, out - 1);
}

// Gathers, per input element, the gradient of every window that picked it:
// no atomics, and the same choice of maximum as the CPU twin.
template <typename T>
__global__ void MaxPoolBackwardKernel(WindowShape s, const T* x, const T* dy, T* dx,
                                      bool accumulate) {
  GRID_STRIDE(i, s.batch * s.in_elements()) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % s.in_w;
    rest /= s.in_w;
    const int64_t h = rest % s.in_h;
    const int64_t n = rest / s.in_h;
    const T* xn = x + n * s.in_elements();
    int64_t oh0, oh1, ow0, ow1;
    Covering(h, s.pad_top, s.kernel_h, s.stride_h, s.out_h, &oh0, &oh1);
    Covering(w, s.pad_left, s.kernel_w, s.stride_w, s.out_w, &ow0, &ow1);
    float g = 0.f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        if (ArgMax(s, xn, oh, ow, c) == h * s.in_w + w) {
          g += ToF(dy[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + c]);
        }
      }
    }
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + g : g);
  }
}

template <typename T>
__global__ void AvgPoolForwardKernel(WindowShape s, const T* x, T* y) {
  GRID_STRIDE(i, s.batch * s.out_elements()) {
    const int64_t c = i % s.out_c;
    int64_t rest = i / s.out_c;
    const int64_t ow = rest % s.out_w;
    rest /= s.out_w;
    const int64_t oh = rest % s.out_h;
    const int64_t n = rest / s.out_h;
    const T* xn = x + n * s.in_elements();
    const Range r = RangeOf(s, oh, ow);
    float sum = 0.f;
    for (int64_t h = r.h0; h < r.h1; ++h) {
      for (int64_t w = r.w0; w < r.w1; ++w) sum += ToF(xn[(h * s.in_w + w) * s.in_c + c]);
    }
    y[i] = FromF<T>(sum * (1.f / static_cast<float>((r.h1 - r.h0) * (r.w1 - r.w0))));
  }
}

template <typename T>
__global__ void AvgPoolBackwardKernel(WindowShape s, const T* dy, T* dx, bool accumulate) {
  GRID_STRIDE(i, s.batch * s.in_elements()) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % s.in_w;
    rest /= s.in_w;
    const int64_t h = rest % s.in_h;
    const int64_t n = rest / s.in_h;
    int64_t oh0, oh1, ow0, ow1;
    Covering(h, s.pad_top, s.kernel_h, s.stride_h, s.out_h, &oh0, &oh1);
    Covering(w, s.pad_left, s.kernel_w, s.stride_w, s.out_w, &ow0, &ow1);
    float g = 0.f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const Range r = RangeOf(s, oh, ow);
        g += ToF(dy[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + c]) *
             (1.f / static_cast<float>((r.h1 - r.h0) * (r.w1 - r.w0)));
      }
    }
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + g : g);
  }
}

template <typename T>
__global__ void GlobalAvgPoolForwardKernel(int64_t batch, int64_t spatial, int64_t channels,
                                           const T* x, T* y) {
  const float inv = 1.f / static_cast<float>(spatial);
  GRID_STRIDE(i, batch * channels) {
    const int64_t c = i % channels;
    const int64_t n = i / channels;
    float sum = 0.f;
    for (int64_t p = 0; p < spatial; ++p) sum += ToF(x[(n * spatial + p) * channels + c]);
    y[i] = FromF<T>(sum * inv);
  }
}

template <typename T>
__global__ void GlobalAvgPoolBackwardKernel(int64_t batch, int64_t spatial, int64_t channels,
                                            const T* dy, T* dx, bool accumulate) {
  const float inv = 1.f / static_cast<float>(spatial);
  GRID_STRIDE(i, batch * spatial * channels) {
    const int64_t c = i % channels;
    const int64_t n = i / (spatial * channels);
    const float g = ToF(dy[n * channels + c]) * inv;
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + g : g);
  }
}

}  // namespace

namespace {

bool Fits32(const WindowShape& s) {
  const int64_t limit = int64_t{1} << 30;
  return s.batch * s.in_elements() < limit && s.batch * s.out_elements() < limit;
}

template <typename I, typename T>
void LaunchMaxPoolForward(cudaStream_t stream, const WindowShape& s, const T* x, T* y) {
  const int64_t total = s.batch * s.out_elements();
  MaxPoolForwardFastKernel<I, T>
      <<<Blocks(total), kThreads, 0, stream>>>(Window<I>(s), static_cast<I>(total), x, y);
}

template <typename I, typename T>
void LaunchMaxPoolScatter(cudaStream_t stream, const WindowShape& s, const T* x, const T* dy, T* dx,
                          bool accumulate) {
  const int64_t total = s.batch * s.out_elements();
  MaxPoolScatterKernel<I, T><<<Blocks(total), kThreads, 0, stream>>>(
      Window<I>(s), static_cast<I>(total), x, dy, dx, accumulate);
}

}  // namespace

template <typename T>
cudaError_t MaxPoolForward(cudaStream_t stream, const WindowShape& s, const T* x, T* y) {
  if (s.batch * s.out_elements() == 0) return cudaSuccess;
  if (Fits32(s)) {
    LaunchMaxPoolForward<int32_t>(stream, s, x, y);
  } else {
    LaunchMaxPoolForward<int64_t>(stream, s, x, y);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t MaxPoolBackward(cudaStream_t stream, const WindowShape& s, const T* x, const T* dy,
                            T* dx, bool accumulate) {
  if (s.batch * s.in_elements() == 0) return cudaSuccess;
  if (s.stride_h < s.kernel_h || s.stride_w < s.kernel_w) {
    MaxPoolBackwardKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(s, x, dy, dx,
                                                                                      accumulate);
    return cudaGetLastError();
  }
  const bool covers_all = s.stride_h == s.kernel_h && s.stride_w == s.kernel_w && s.pad_top == 0 &&
                          s.pad_left == 0 && s.out_h * s.kernel_h == s.in_h &&
                          s.out_w * s.kernel_w == s.in_w;
  if (!accumulate && !covers_all) {
    // All-zero bytes are +0 in each of the three types.
    const cudaError_t e = cudaMemsetAsync(dx, 0, sizeof(T) * s.batch * s.in_elements(), stream);
    if (e != cudaSuccess) return e;
  }
  if (s.batch * s.out_elements() == 0) return cudaSuccess;
  if (Fits32(s)) {
    LaunchMaxPoolScatter<int32_t>(stream, s, x, dy, dx, accumulate);
  } else {
    LaunchMaxPoolScatter<int64_t>(stream, s, x, dy, dx, accumulate);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t AvgPoolForward(cudaStream_t stream, const WindowShape& s, const T* x, T* y) {
  AvgPoolForwardKernel<<<Blocks(s.batch * s.out_elements()), kThreads, 0, stream>>>(s, x, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t AvgPoolBackward(cudaStream_t stream, const WindowShape& s, const T* dy, T* dx,
                            bool accumulate) {
  AvgPoolBackwardKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(s, dy, dx,
                                                                                    accumulate);
  return cudaGetLastError();
}

template <typename T>
cudaError_t GlobalAvgPoolForward(cudaStream_t stream, int64_t batch, int64_t spatial,
                                 int64_t channels, const T* x, T* y) {
  GlobalAvgPoolForwardKernel<<<Blocks(batch * channels), kThreads, 0, stream>>>(batch, spatial,
                                                                                channels, x, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t GlobalAvgPoolBackward(cudaStream_t stream, int64_t batch, int64_t spatial,
                                  int64_t channels, const T* dy, T* dx, bool accumulate) {
  GlobalAvgPoolBackwardKernel<<<Blocks(batch * spatial * channels), kThreads, 0, stream>>>(
      batch, spatial, channels, dy, dx, accumulate);
  return cudaGetLastError();
}

#define DOWNPOUR_INSTANTIATE(T)                                                                    \
  template cudaError_t MaxPoolForward<T>(cudaStream_t, const WindowShape&, const T*, T*);          \
  template cudaError_t MaxPoolBackward<T>(cudaStream_t, const WindowShape&, const T*, const T*,    \
                                          T*, bool);                                               \
  template cudaError_t AvgPoolForward<T>(cudaStream_t, const WindowShape&, const T*, T*);          \
  template cudaError_t AvgPoolBackward<T>(cudaStream_t, const WindowShape&, const T*, T*, bool);   \
  template cudaError_t GlobalAvgPoolForward<T>(cudaStream_t, int64_t, int64_t, int64_t, const T*,  \
                                               T*);                                                \
  template cudaError_t GlobalAvgPoolBackward<T>(cudaStream_t, int64_t, int64_t, int64_t, const T*, \
                                                T*, bool);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
