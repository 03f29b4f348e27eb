// Our own CUDA kernels behind kernels/cuda (see cuda_kernels.h). Each mirrors
// a loop of kernels/cpu.cc or kernels/optimizer.cc, element for element. The
// activation kernels are templates over the element type T (float,
// __nv_bfloat16, __half): they read T into fp32, compute in fp32 as the float
// version does and round once on store, so T = float runs the exact fp32
// arithmetic. The explicit instantiations are at the end of the file.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_kernels.h"

namespace downpour {
namespace kernels {
namespace cuda_internal {
namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (capped; the loops stride).
unsigned Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- Element types: every load goes through ToF and every store through
// FromF (round to nearest even), so the arithmetic between is fp32.
__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromF<__half>(float v) {
  return __float2half_rn(v);
}

// 16-byte accesses for the element-wise kernels: a Pack is kPack<T> elements
// (4 floats or 8 halves), loaded and stored as one 128-bit access. Used where
// n is a multiple of the pack and every pointer is 16-byte aligned (Packed).
template <typename T>
constexpr int kPack = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T e[kPack<T>];
};

// The N elements at p (16-byte aligned; N a multiple of kPack<T>) as floats.
template <int N, typename T>
__device__ __forceinline__ void LoadF(const T* p, float (&v)[N]) {
  static_assert(N % kPack<T> == 0, "whole packs only");
  const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
  for (int j = 0; j < N / kPack<T>; ++j) {
    const Pack<T> pack = packs[j];
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) v[j * kPack<T> + k] = ToF(pack.e[k]);
  }
}

template <int N, typename T>
__device__ __forceinline__ void StoreF(T* p, const float (&v)[N]) {
  static_assert(N % kPack<T> == 0, "whole packs only");
  Pack<T>* packs = reinterpret_cast<Pack<T>*>(p);
#pragma unroll
  for (int j = 0; j < N / kPack<T>; ++j) {
    Pack<T> pack;
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) pack.e[k] = FromF<T>(v[j * kPack<T> + k]);
    packs[j] = pack;
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether the 16-byte kernels apply: n is a whole number of packs of `pack`
// elements and every pointer (null ones are unused) is 16-byte aligned.
bool Packed(int64_t n, int pack, const void* a, const void* b = nullptr, const void* c = nullptr) {
  return n % pack == 0 && Aligned16(a) && Aligned16(b) && Aligned16(c);
}


__device__ __forceinline__ int64_t EmbeddingRow(float id, int64_t vocab) {
  if (!(id >= 0.f) || id >= static_cast<float>(vocab)) return -1;
  const int64_t row = static_cast<int64_t>(id);
  return static_cast<float>(row) == id ? row : -1;
}

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

// One warp per example: the first maximum (as the CPU twin picks it) and the
// sum of exponentials by shuffles, double accumulation as on the CPU.
template <typename T>
__global__ void SoftmaxCrossEntropyKernel(int64_t batch, int64_t classes, const T* logits,
                                          const int32_t* labels, T* dlogits, float dlogits_scale,
                                          double* loss_sum, unsigned long long* correct) {
  const float inv_batch = 1.f / static_cast<float>(batch);
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; r < batch;
       r += warps) {
    const T* row = logits + r * classes;
    float best = -INFINITY;
    int64_t argmax = classes;
    for (int64_t j = lane; j < classes; j += 32) {
      const float v = ToF(row[j]);
      if (argmax == classes || v > best) {
        best = v;
        argmax = j;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int64_t other_index = __shfl_xor_sync(0xffffffffu, argmax, offset);
      if (other > best || (other == best && other_index < argmax)) {
        best = other;
        argmax = other_index;
      }
    }
    const float max = best;
    double sum = 0.0;
    for (int64_t j = lane; j < classes; j += 32) {
      sum += exp(static_cast<double>(ToF(row[j]) - max));
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int32_t label = labels[r];
    if (lane == 0) {
      atomicAdd(loss_sum, log(sum) - static_cast<double>(ToF(row[label]) - max));
      if (argmax == label) atomicAdd(correct, 1ULL);
    }
    if (dlogits != nullptr) {
      T* grad = dlogits + r * classes;
      const double inv_sum = 1.0 / sum;
      for (int64_t j = lane; j < classes; j += 32) {
        const double p = exp(static_cast<double>(ToF(row[j]) - max)) * inv_sum;
        const float g = static_cast<float>(p) * inv_batch - (j == label ? inv_batch : 0.f);
        grad[j] = FromF<T>(g * dlogits_scale);
      }
    }
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
__global__ void AddKernel(int64_t n, const T* a, const T* b, T* y) {
  GRID_STRIDE(i, n) { y[i] = FromF<T>(ToF(a[i]) + ToF(b[i])); }
}

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

template <typename T>
__global__ void EmbeddingForwardKernel(int64_t num_ids, int64_t vocab, int64_t dim,
                                       const float* ids, const float* table, T* y) {
  GRID_STRIDE(i, num_ids * dim) {
    const int64_t row = EmbeddingRow(ids[i / dim], vocab);
    y[i] = FromF<T>(row < 0 ? 0.f : table[row * dim + i % dim]);
  }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(int64_t num_ids, int64_t vocab, int64_t dim,
                                        const float* ids, const T* dy, float* dtable) {
  GRID_STRIDE(i, num_ids * dim) {
    const int64_t row = EmbeddingRow(ids[i / dim], vocab);
    if (row >= 0) atomicAdd(dtable + row * dim + i % dim, ToF(dy[i]));
  }
}

// ---- Column reductions. Block (32, 8): threadIdx.x picks the column (so a
// warp reads 32 contiguous elements of one row), threadIdx.y one of 8 row
// lanes; block (bx, by) reduces rows [bx * chunk, (bx + 1) * chunk) of
// columns [by * 32, by * 32 + 32).
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kColumnBlocksTarget = 1024;

struct ColumnGrid {
  int64_t chunk = 0, row_blocks = 0, col_tiles = 0;
};

ColumnGrid ColumnGridOf(int64_t rows, int64_t cols) {
  ColumnGrid g;
  g.col_tiles = (cols + kColumnTile - 1) / kColumnTile;
  const int64_t max_blocks = std::max<int64_t>(1, (rows + kRowLanes - 1) / kRowLanes);
  int64_t want = std::max<int64_t>(1, kColumnBlocksTarget / g.col_tiles);
  want = std::min(want, max_blocks);
  int64_t chunk = (rows + want - 1) / want;
  chunk = (chunk + kRowLanes - 1) / kRowLanes * kRowLanes;
  g.chunk = std::max<int64_t>(chunk, kRowLanes);
  g.row_blocks = (rows + g.chunk - 1) / g.chunk;
  return g;
}

template <typename T>
__global__ void ColumnSumPartialKernel(int64_t rows, int64_t cols, int64_t chunk, const T* x,
                                       float* partials) {
  __shared__ float lane_sum[kRowLanes][kColumnTile];
  const int64_t c = blockIdx.y * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  const int64_t r0 = blockIdx.x * chunk;
  const int64_t r1 = min(r0 + chunk, rows);
  float sum = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) sum += ToF(x[r * cols + c]);
  }
  lane_sum[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
    for (int l = 0; l < kRowLanes; ++l) total += lane_sum[l][threadIdx.x];
    partials[c * gridDim.x + blockIdx.x] = total;
  }
}

// The sum over a block (kFinishThreads threads) of one double per thread;
// every thread gets it.
constexpr int kFinishThreads = 128;

__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kFinishThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // warp_sums may still be read from a previous call.
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kFinishThreads / 32; ++w) total += warp_sums[w];
  return total;
}

// Partials are [quantity][cols][row_blocks]: a block per column reads its
// row_blocks partials coalesced. grid = cols.
__global__ void ColumnSumFinishKernel(int64_t row_blocks, const float* partials, float* y,
                                      bool accumulate) {
  const int64_t c = blockIdx.x;
  double sum = 0.0;
  for (int64_t b = threadIdx.x; b < row_blocks; b += kFinishThreads) {
    sum += partials[c * row_blocks + b];
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0)
    y[c] = accumulate ? y[c] + static_cast<float>(sum) : static_cast<float>(sum);
}

// Statistics of one slab: per column, (mean, M2) from sums shifted by the
// lane's first value (no cancellation when |mean| >> std), merged across
// lanes with Chan's formula. partials: [2][row_blocks][cols].
template <typename T>
__global__ void BatchNormStatsPartialKernel(int64_t rows, int64_t cols, int64_t chunk,
                                            int64_t row_blocks, const T* x, float* partials) {
  __shared__ float lane_n[kRowLanes][kColumnTile];
  __shared__ float lane_mean[kRowLanes][kColumnTile];
  __shared__ float lane_m2[kRowLanes][kColumnTile];
  const int64_t c = blockIdx.y * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  const int64_t r0 = blockIdx.x * chunk;
  const int64_t r1 = min(r0 + chunk, rows);
  float n = 0.f, mean = 0.f, m2 = 0.f;
  if (c < cols && r0 + threadIdx.y < r1) {
    const float shift = ToF(x[(r0 + threadIdx.y) * cols + c]);
    float s1 = 0.f, s2 = 0.f;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float d = ToF(x[r * cols + c]) - shift;
      s1 += d;
      s2 += d * d;
      n += 1.f;
    }
    mean = shift + s1 / n;
    m2 = fmaxf(s2 - s1 * s1 / n, 0.f);
  }
  lane_n[threadIdx.y][threadIdx.x] = n;
  lane_mean[threadIdx.y][threadIdx.x] = mean;
  lane_m2[threadIdx.y][threadIdx.x] = m2;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float na = 0.f, ma = 0.f, qa = 0.f;
    for (int l = 0; l < kRowLanes; ++l) {
      const float nb = lane_n[l][threadIdx.x];
      if (nb == 0.f) continue;
      const float mb = lane_mean[l][threadIdx.x];
      const float n_ab = na + nb;
      const float delta = mb - ma;
      ma += delta * (nb / n_ab);
      qa += lane_m2[l][threadIdx.x] + delta * delta * (na * nb / n_ab);
      na = n_ab;
    }
    partials[c * row_blocks + blockIdx.x] = ma;
    partials[(cols + c) * row_blocks + blockIdx.x] = qa;
  }
}

// Chan's merge of the slabs in two block sums: the mean, then M2 about it.
__global__ void BatchNormStatsFinishKernel(int64_t rows, int64_t cols, int64_t chunk,
                                           int64_t row_blocks, const float* partials, float epsilon,
                                           float momentum, float* running_mean, float* running_var,
                                           float* save_mean, float* save_inv_std) {
  const int64_t c = blockIdx.x;
  const float* slab_mean = partials + c * row_blocks;
  const float* slab_m2 = partials + (cols + c) * row_blocks;
  double sum = 0.0;
  for (int64_t b = threadIdx.x; b < row_blocks; b += kFinishThreads) {
    sum += static_cast<double>(min(chunk, rows - b * chunk)) * slab_mean[b];
  }
  const double mean = BlockSum(sum) / static_cast<double>(rows);
  double m2 = 0.0;
  for (int64_t b = threadIdx.x; b < row_blocks; b += kFinishThreads) {
    const double d = slab_mean[b] - mean;
    m2 += slab_m2[b] + static_cast<double>(min(chunk, rows - b * chunk)) * d * d;
  }
  m2 = BlockSum(m2);
  if (threadIdx.x != 0) return;
  const double var = m2 / static_cast<double>(rows);
  const double unbias = rows > 1 ? static_cast<double>(rows) / (rows - 1) : 1.0;
  save_mean[c] = static_cast<float>(mean);
  save_inv_std[c] = static_cast<float>(1.0 / sqrt(var + epsilon));
  running_mean[c] = momentum * running_mean[c] + (1.f - momentum) * static_cast<float>(mean);
  running_var[c] = momentum * running_var[c] + (1.f - momentum) * static_cast<float>(var * unbias);
}

// y = gamma * (x - mean) * inv_std + beta; the packed version where channels
// is a multiple of the pack (so a pack never wraps past the last channel) and
// x, y are 16-byte aligned.
template <typename T>
__global__ void BatchNormApplyKernel(int64_t n, int64_t cols, const T* x, const float* gamma,
                                     const float* beta, const float* mean, const float* inv_std,
                                     T* y) {
  GRID_STRIDE(i, n) {
    const int64_t c = i % cols;
    y[i] = FromF<T>(gamma[c] * (ToF(x[i]) - mean[c]) * inv_std[c] + beta[c]);
  }
}

template <typename T>
__global__ void BatchNormApplyPackKernel(int64_t packs, int64_t cols, const T* x,
                                         const float* gamma, const float* beta, const float* mean,
                                         const float* inv_std, T* y) {
  constexpr int N = kPack<T>;
  GRID_STRIDE(i, packs) {
    const int64_t c = (i * N) % cols;
    float v[N];
    LoadF(x + i * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      v[k] = gamma[c + k] * (v[k] - mean[c + k]) * inv_std[c + k] + beta[c + k];
    }
    StoreF(y + i * N, v);
  }
}

template <typename T>
__global__ void BatchNormInferenceKernel(int64_t n, int64_t cols, const T* x, const float* gamma,
                                         const float* beta, const float* mean, const float* var,
                                         float epsilon, T* y) {
  GRID_STRIDE(i, n) {
    const int64_t c = i % cols;
    const float scale = gamma[c] / sqrtf(var[c] + epsilon);
    y[i] = FromF<T>(ToF(x[i]) * scale + (beta[c] - mean[c] * scale));
  }
}

// partials: [2][row_blocks][cols], sum(dy) then sum(dy * xhat).
template <typename T>
__global__ void BatchNormBackwardPartialKernel(int64_t rows, int64_t cols, int64_t chunk,
                                               int64_t row_blocks, const T* x, const T* dy,
                                               const float* mean, const float* inv_std,
                                               float* partials) {
  __shared__ float lane_dy[kRowLanes][kColumnTile];
  __shared__ float lane_dyx[kRowLanes][kColumnTile];
  const int64_t c = blockIdx.y * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  const int64_t r0 = blockIdx.x * chunk;
  const int64_t r1 = min(r0 + chunk, rows);
  float s_dy = 0.f, s_dyx = 0.f;
  if (c < cols) {
    const float m = mean[c], is = inv_std[c];
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float g = ToF(dy[r * cols + c]);
      s_dy += g;
      s_dyx += g * ((ToF(x[r * cols + c]) - m) * is);
    }
  }
  lane_dy[threadIdx.y][threadIdx.x] = s_dy;
  lane_dyx[threadIdx.y][threadIdx.x] = s_dyx;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float a = 0.f, b = 0.f;
    for (int l = 0; l < kRowLanes; ++l) {
      a += lane_dy[l][threadIdx.x];
      b += lane_dyx[l][threadIdx.x];
    }
    partials[c * row_blocks + blockIdx.x] = a;
    partials[(cols + c) * row_blocks + blockIdx.x] = b;
  }
}

__global__ void BatchNormBackwardFinishKernel(int64_t cols, int64_t row_blocks,
                                              const float* partials, float* dgamma, float* dbeta,
                                              bool accumulate, float* sums) {
  const int64_t c = blockIdx.x;
  double a = 0.0, b = 0.0;
  for (int64_t k = threadIdx.x; k < row_blocks; k += kFinishThreads) {
    a += partials[c * row_blocks + k];
    b += partials[(cols + c) * row_blocks + k];
  }
  a = BlockSum(a);
  b = BlockSum(b);
  if (threadIdx.x != 0) return;
  const float db = static_cast<float>(a), dg = static_cast<float>(b);
  dbeta[c] = accumulate ? dbeta[c] + db : db;
  dgamma[c] = accumulate ? dgamma[c] + dg : dg;
  sums[c] = db;
  sums[cols + c] = dg;
}

template <typename T>
__global__ void BatchNormBackwardDxKernel(int64_t n, int64_t cols, float inv_rows, const T* x,
                                          const T* dy, const float* gamma, const float* mean,
                                          const float* inv_std, const float* sums, T* dx,
                                          bool accumulate) {
  GRID_STRIDE(i, n) {
    const int64_t c = i % cols;
    const float xhat = (ToF(x[i]) - mean[c]) * inv_std[c];
    const float v =
        gamma[c] * inv_std[c] * (ToF(dy[i]) - (sums[c] + xhat * sums[cols + c]) * inv_rows);
    dx[i] = FromF<T>(accumulate ? ToF(dx[i]) + v : v);
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

// kind values follow OptimizerKind: 0 SGD, 1 momentum, 2 Adagrad, 3 Adam.
__global__ void MultiTensorUpdateKernel(OptimizerArgs a, const OptimizerTensor* tensors,
                                        const int32_t* chunk_tensor, const int64_t* chunk_start) {
  const OptimizerTensor t = tensors[chunk_tensor[blockIdx.x]];
  const int64_t start = chunk_start[blockIdx.x];
  const int64_t end = min(start + kOptimizerChunk, t.n);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float p = t.param[i];
    switch (a.kind) {
      case 0:
        t.param[i] =
            p - a.lr * (a.weight_decay == 0.f ? t.grad[i] : t.grad[i] + a.weight_decay * p);
        break;
      case 1: {
        const float g = t.grad[i] + a.weight_decay * p;
        const float v = a.momentum * t.slot0[i] + g;
        t.slot0[i] = v;
        t.param[i] = p - a.lr * v;
        break;
      }
      case 2: {
        const float g = t.grad[i] + a.weight_decay * p;
        const float acc = t.slot0[i] + g * g;
        t.slot0[i] = acc;
        t.param[i] = p - a.lr * g / (sqrtf(acc) + a.epsilon);
        break;
      }
      default: {
        const float g = t.grad[i] + a.weight_decay * p;
        const float m = a.beta1 * t.slot0[i] + (1.f - a.beta1) * g;
        const float v = a.beta2 * t.slot1[i] + (1.f - a.beta2) * g * g;
        t.slot0[i] = m;
        t.slot1[i] = v;
        t.param[i] = p - a.adam_step_size * m / (sqrtf(v) * a.adam_inv_sqrt_bc2 + a.epsilon);
        break;
      }
    }
  }
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
cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int64_t batch, int64_t classes,
                                const T* logits, const int32_t* labels, T* dlogits,
                                float dlogits_scale, double* loss_sum,
                                unsigned long long* correct) {
  // A warp (32 threads) per example.
  SoftmaxCrossEntropyKernel<<<Blocks(batch * 32), kThreads, 0, stream>>>(
      batch, classes, logits, labels, dlogits, dlogits_scale, loss_sum, correct);
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
cudaError_t Add(cudaStream_t stream, int64_t n, const T* a, const T* b, T* y) {
  constexpr int kN = kPack<T>;
  if (Packed(n, kN, a, b, y)) {
    AddPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(n / kN, a, b, y);
  } else {
    AddKernel<<<Blocks(n), kThreads, 0, stream>>>(n, a, b, y);
  }
  return cudaGetLastError();
}

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

template <typename T>
cudaError_t EmbeddingForward(cudaStream_t stream, int64_t num_ids, int64_t vocab, int64_t dim,
                             const float* ids, const float* table, T* y) {
  EmbeddingForwardKernel<<<Blocks(num_ids * dim), kThreads, 0, stream>>>(num_ids, vocab, dim, ids,
                                                                         table, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbeddingBackward(cudaStream_t stream, int64_t num_ids, int64_t vocab, int64_t dim,
                              const float* ids, const T* dy, float* dtable) {
  EmbeddingBackwardKernel<<<Blocks(num_ids * dim), kThreads, 0, stream>>>(num_ids, vocab, dim, ids,
                                                                          dy, dtable);
  return cudaGetLastError();
}

int64_t ColumnRowBlocks(int64_t rows, int64_t cols) { return ColumnGridOf(rows, cols).row_blocks; }

int64_t ColumnPartialsElements(int64_t rows, int64_t cols) {
  return 2 * ColumnRowBlocks(rows, cols) * cols;
}

template <typename T>
cudaError_t ColumnSumFast(cudaStream_t stream, int64_t rows, int64_t cols, const T* x, float* y,
                          bool accumulate, float* partials) {
  if (cols == 0) return cudaSuccess;
  if (rows == 0) {
    if (!accumulate) return cudaMemsetAsync(y, 0, cols * sizeof(float), stream);
    return cudaSuccess;
  }
  const ColumnGrid g = ColumnGridOf(rows, cols);
  const dim3 grid(static_cast<unsigned>(g.row_blocks), static_cast<unsigned>(g.col_tiles));
  const dim3 block(kColumnTile, kRowLanes);
  ColumnSumPartialKernel<<<grid, block, 0, stream>>>(rows, cols, g.chunk, x, partials);
  ColumnSumFinishKernel<<<static_cast<unsigned>(cols), kFinishThreads, 0, stream>>>(
      g.row_blocks, partials, y, accumulate);
  return cudaGetLastError();
}

template <typename T>
cudaError_t BatchNormForwardTraining(cudaStream_t stream, int64_t rows, int64_t channels,
                                     const T* x, const float* gamma, const float* beta,
                                     float epsilon, float momentum, T* y, float* running_mean,
                                     float* running_var, float* save_mean, float* save_inv_std,
                                     float* partials) {
  if (rows == 0 || channels == 0) return cudaSuccess;
  const ColumnGrid g = ColumnGridOf(rows, channels);
  const dim3 grid(static_cast<unsigned>(g.row_blocks), static_cast<unsigned>(g.col_tiles));
  const dim3 block(kColumnTile, kRowLanes);
  BatchNormStatsPartialKernel<<<grid, block, 0, stream>>>(rows, channels, g.chunk, g.row_blocks, x,
                                                          partials);
  BatchNormStatsFinishKernel<<<static_cast<unsigned>(channels), kFinishThreads, 0, stream>>>(
      rows, channels, g.chunk, g.row_blocks, partials, epsilon, momentum, running_mean, running_var,
      save_mean, save_inv_std);
  const int64_t n = rows * channels;
  constexpr int kN = kPack<T>;
  if (Packed(channels, kN, x, y)) {
    BatchNormApplyPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(
        n / kN, channels, x, gamma, beta, save_mean, save_inv_std, y);
  } else {
    BatchNormApplyKernel<<<Blocks(n), kThreads, 0, stream>>>(n, channels, x, gamma, beta, save_mean,
                                                             save_inv_std, y);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t BatchNormForwardInference(cudaStream_t stream, int64_t rows, int64_t channels,
                                      const T* x, const float* gamma, const float* beta,
                                      const float* mean, const float* var, float epsilon, T* y) {
  const int64_t n = rows * channels;
  if (n == 0) return cudaSuccess;
  BatchNormInferenceKernel<<<Blocks(n), kThreads, 0, stream>>>(n, channels, x, gamma, beta, mean,
                                                               var, epsilon, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t BatchNormBackward(cudaStream_t stream, int64_t rows, int64_t channels, const T* x,
                              const T* dy, const float* gamma, const float* save_mean,
                              const float* save_inv_std, T* dx, bool dx_accumulate, float* dgamma,
                              float* dbeta, bool param_accumulate, float* partials, float* sums) {
  if (channels == 0) return cudaSuccess;
  const ColumnGrid g = ColumnGridOf(std::max<int64_t>(rows, 1), channels);
  const dim3 grid(static_cast<unsigned>(g.row_blocks), static_cast<unsigned>(g.col_tiles));
  const dim3 block(kColumnTile, kRowLanes);
  BatchNormBackwardPartialKernel<<<grid, block, 0, stream>>>(
      rows, channels, g.chunk, g.row_blocks, x, dy, save_mean, save_inv_std, partials);
  BatchNormBackwardFinishKernel<<<static_cast<unsigned>(channels), kFinishThreads, 0, stream>>>(
      channels, g.row_blocks, partials, dgamma, dbeta, param_accumulate, sums);
  if (dx != nullptr && rows > 0) {
    const int64_t n = rows * channels;
    BatchNormBackwardDxKernel<<<Blocks(n), kThreads, 0, stream>>>(
        n, channels, 1.f / static_cast<float>(rows), x, dy, gamma, save_mean, save_inv_std, sums,
        dx, dx_accumulate);
  }
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

cudaError_t MultiTensorUpdate(cudaStream_t stream, const OptimizerArgs& args,
                              const OptimizerTensor* tensors, const int32_t* chunk_tensor,
                              const int64_t* chunk_start, int64_t num_chunks) {
  if (num_chunks == 0) return cudaSuccess;
  MultiTensorUpdateKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(
      args, tensors, chunk_tensor, chunk_start);
  return cudaGetLastError();
}

// ---- Explicit instantiations: every activation template for each element
// type, and Convert for every (source, destination) pair.
#define DOWNPOUR_INSTANTIATE(T)                                                                    \
  template cudaError_t BroadcastRows<T>(cudaStream_t, int64_t, int64_t, const float*, T*);         \
  template cudaError_t ReluForward<T>(cudaStream_t, int64_t, const T*, T*);                        \
  template cudaError_t ReluBackward<T>(cudaStream_t, int64_t, const T*, const T*, T*, bool);       \
  template cudaError_t DropoutForward<T>(cudaStream_t, int64_t, float, uint64_t, const T*, T*,     \
                                         uint8_t*);                                                \
  template cudaError_t DropoutBackward<T>(cudaStream_t, int64_t, float, const uint8_t*, const T*,  \
                                          T*, bool);                                               \
  template cudaError_t SoftmaxCrossEntropy<T>(cudaStream_t, int64_t, int64_t, const T*,            \
                                              const int32_t*, T*, float, double*,                  \
                                              unsigned long long*);                                \
  template cudaError_t CopyOrAdd<T>(cudaStream_t, int64_t, const T*, T*, bool);                    \
  template cudaError_t Add<T>(cudaStream_t, int64_t, const T*, const T*, T*);                      \
  template cudaError_t PadImages<T>(cudaStream_t, const WindowShape&, int64_t, int64_t, const T*,  \
                                    T*);                                                           \
  template cudaError_t CropImages<T>(cudaStream_t, const WindowShape&, int64_t, int64_t, const T*, \
                                     T*, bool);                                                    \
  template cudaError_t MaxPoolForward<T>(cudaStream_t, const WindowShape&, const T*, T*);          \
  template cudaError_t MaxPoolBackward<T>(cudaStream_t, const WindowShape&, const T*, const T*,    \
                                          T*, bool);                                               \
  template cudaError_t AvgPoolForward<T>(cudaStream_t, const WindowShape&, const T*, T*);          \
  template cudaError_t AvgPoolBackward<T>(cudaStream_t, const WindowShape&, const T*, T*, bool);   \
  template cudaError_t GlobalAvgPoolForward<T>(cudaStream_t, int64_t, int64_t, int64_t, const T*,  \
                                               T*);                                                \
  template cudaError_t GlobalAvgPoolBackward<T>(cudaStream_t, int64_t, int64_t, int64_t, const T*, \
                                                T*, bool);                                         \
  template cudaError_t ColumnSumFast<T>(cudaStream_t, int64_t, int64_t, const T*, float*, bool,    \
                                        float*);                                                   \
  template cudaError_t BatchNormForwardTraining<T>(cudaStream_t, int64_t, int64_t, const T*,       \
                                                   const float*, const float*, float, float, T*,   \
                                                   float*, float*, float*, float*, float*);        \
  template cudaError_t BatchNormForwardInference<T>(cudaStream_t, int64_t, int64_t, const T*,      \
                                                    const float*, const float*, const float*,      \
                                                    const float*, float, T*);                      \
  template cudaError_t BatchNormBackward<T>(cudaStream_t, int64_t, int64_t, const T*, const T*,    \
                                            const float*, const float*, const float*, T*, bool,    \
                                            float*, float*, bool, float*, float*);                 \
  template cudaError_t EmbeddingForward<T>(cudaStream_t, int64_t, int64_t, int64_t, const float*,  \
                                           const float*, T*);                                      \
  template cudaError_t EmbeddingBackward<T>(cudaStream_t, int64_t, int64_t, int64_t, const float*, \
                                            const T*, float*);

#define DOWNPOUR_INSTANTIATE_CONVERT(S, D)                                                       \
  template cudaError_t Convert<S, D>(cudaStream_t, int64_t, const S*, D*, const float*, int64_t, \
                                     bool, bool);

DOWNPOUR_INSTANTIATE(float)
DOWNPOUR_INSTANTIATE(__nv_bfloat16)
DOWNPOUR_INSTANTIATE(__half)

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

}  // namespace cuda_internal
}  // namespace kernels
}  // namespace downpour
