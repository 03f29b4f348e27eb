// Our own CUDA kernels behind kernels/cuda (see cuda_kernels.h). Each mirrors
// a loop of kernels/cpu.cc or kernels/optimizer.cc, element for element.
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

// The same SplitMix64 and uniform draw as kernels/cpu.cc, so masks agree.
__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float UniformAt(uint64_t key, int64_t i) {
  return static_cast<float>(Mix(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / (1 << 24));
}

__device__ __forceinline__ int64_t EmbeddingRow(float id, int64_t vocab) {
  if (!(id >= 0.f) || id >= static_cast<float>(vocab)) return -1;
  const int64_t row = static_cast<int64_t>(id);
  return static_cast<float>(row) == id ? row : -1;
}

__global__ void BroadcastRowsKernel(int64_t rows, int64_t cols, const float* bias, float* y) {
  GRID_STRIDE(i, rows * cols) { y[i] = bias[i % cols]; }
}

__global__ void ColumnSumKernel(int64_t rows, int64_t cols, const float* x, float* y,
                                bool accumulate) {
  GRID_STRIDE(c, cols) {
    float sum = 0.f;
    for (int64_t r = 0; r < rows; ++r) sum += x[r * cols + c];
    y[c] = accumulate ? y[c] + sum : sum;
  }
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  GRID_STRIDE(i, n) { x[i] = alpha == 0.f ? 0.f : alpha * x[i]; }
}

__global__ void ReluForwardKernel(int64_t n, const float* x, float* y) {
  GRID_STRIDE(i, n) { y[i] = x[i] > 0.f ? x[i] : 0.f; }
}

__global__ void ReluBackwardKernel(int64_t n, const float* x, const float* dy, float* dx,
                                   bool accumulate) {
  GRID_STRIDE(i, n) {
    const float g = x[i] > 0.f ? dy[i] : 0.f;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void DropoutForwardKernel(int64_t n, float rate, float scale, uint64_t key,
                                     const float* x, float* y, uint8_t* mask) {
  GRID_STRIDE(i, n) {
    const bool keep = rate <= 0.f || UniformAt(key, i) >= rate;
    mask[i] = keep ? 1 : 0;
    y[i] = keep ? (rate <= 0.f ? x[i] : x[i] * scale) : 0.f;
  }
}

__global__ void DropoutBackwardKernel(int64_t n, float scale, const uint8_t* mask, const float* dy,
                                      float* dx, bool accumulate) {
  GRID_STRIDE(i, n) {
    const float g = mask[i] ? dy[i] * scale : 0.f;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

// One thread per example (classes are few); double accumulation as on the CPU.
__global__ void SoftmaxCrossEntropyKernel(int64_t batch, int64_t classes, const float* logits,
                                          const int32_t* labels, float* dlogits, double* loss_sum,
                                          unsigned long long* correct) {
  const float inv_batch = 1.f / static_cast<float>(batch);
  GRID_STRIDE(r, batch) {
    const float* row = logits + r * classes;
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
    }
    const float max = row[argmax];
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += exp(static_cast<double>(row[j] - max));
    const int32_t label = labels[r];
    atomicAdd(loss_sum, log(sum) - static_cast<double>(row[label] - max));
    if (argmax == label) atomicAdd(correct, 1ULL);
    if (dlogits != nullptr) {
      float* grad = dlogits + r * classes;
      const double inv_sum = 1.0 / sum;
      for (int64_t j = 0; j < classes; ++j) {
        const double p = exp(static_cast<double>(row[j] - max)) * inv_sum;
        grad[j] = static_cast<float>(p) * inv_batch;
      }
      grad[label] -= inv_batch;
    }
  }
}

__global__ void CopyOrAddKernel(int64_t n, const float* x, float* y, bool accumulate) {
  GRID_STRIDE(i, n) { y[i] = accumulate ? y[i] + x[i] : x[i]; }
}

__global__ void AddKernel(int64_t n, const float* a, const float* b, float* y) {
  GRID_STRIDE(i, n) { y[i] = a[i] + b[i]; }
}

__global__ void PadImagesKernel(WindowShape s, int64_t ph, int64_t pw, const float* x,
                                float* padded) {
  GRID_STRIDE(i, s.batch * ph * pw * s.in_c) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % pw - s.pad_left;
    rest /= pw;
    const int64_t h = rest % ph - s.pad_top;
    const int64_t n = rest / ph;
    padded[i] = (h >= 0 && h < s.in_h && w >= 0 && w < s.in_w)
                    ? x[((n * s.in_h + h) * s.in_w + w) * s.in_c + c]
                    : 0.f;
  }
}

__global__ void CropImagesKernel(WindowShape s, int64_t ph, int64_t pw, const float* dpadded,
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
    // Rows past the last window (negative bottom padding) get no gradient.
    const float g = (hp < ph && wp < pw) ? dpadded[((n * ph + hp) * pw + wp) * s.in_c + c] : 0.f;
    dx[i] = accumulate ? dx[i] + g : g;
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
// in channel c of image xn, as MaxPoolBackward on the CPU picks it.
__device__ __forceinline__ int64_t ArgMax(const WindowShape& s, const float* xn, int64_t oh,
                                          int64_t ow, int64_t c) {
  const Range r = RangeOf(s, oh, ow);
  int64_t best = r.h0 * s.in_w + r.w0;
  float best_value = xn[best * s.in_c + c];
  for (int64_t h = r.h0; h < r.h1; ++h) {
    for (int64_t w = r.w0; w < r.w1; ++w) {
      const float v = xn[(h * s.in_w + w) * s.in_c + c];
      if (v > best_value) {
        best_value = v;
        best = h * s.in_w + w;
      }
    }
  }
  return best;
}

__global__ void MaxPoolForwardKernel(WindowShape s, const float* x, float* y) {
  GRID_STRIDE(i, s.batch * s.out_elements()) {
    const int64_t c = i % s.out_c;
    int64_t rest = i / s.out_c;
    const int64_t ow = rest % s.out_w;
    rest /= s.out_w;
    const int64_t oh = rest % s.out_h;
    const int64_t n = rest / s.out_h;
    const float* xn = x + n * s.in_elements();
    y[i] = xn[ArgMax(s, xn, oh, ow, c) * s.in_c + c];
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
__global__ void MaxPoolBackwardKernel(WindowShape s, const float* x, const float* dy, float* dx,
                                      bool accumulate) {
  GRID_STRIDE(i, s.batch * s.in_elements()) {
    const int64_t c = i % s.in_c;
    int64_t rest = i / s.in_c;
    const int64_t w = rest % s.in_w;
    rest /= s.in_w;
    const int64_t h = rest % s.in_h;
    const int64_t n = rest / s.in_h;
    const float* xn = x + n * s.in_elements();
    int64_t oh0, oh1, ow0, ow1;
    Covering(h, s.pad_top, s.kernel_h, s.stride_h, s.out_h, &oh0, &oh1);
    Covering(w, s.pad_left, s.kernel_w, s.stride_w, s.out_w, &ow0, &ow1);
    float g = 0.f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        if (ArgMax(s, xn, oh, ow, c) == h * s.in_w + w) {
          g += dy[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + c];
        }
      }
    }
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void AvgPoolForwardKernel(WindowShape s, const float* x, float* y) {
  GRID_STRIDE(i, s.batch * s.out_elements()) {
    const int64_t c = i % s.out_c;
    int64_t rest = i / s.out_c;
    const int64_t ow = rest % s.out_w;
    rest /= s.out_w;
    const int64_t oh = rest % s.out_h;
    const int64_t n = rest / s.out_h;
    const float* xn = x + n * s.in_elements();
    const Range r = RangeOf(s, oh, ow);
    float sum = 0.f;
    for (int64_t h = r.h0; h < r.h1; ++h) {
      for (int64_t w = r.w0; w < r.w1; ++w) sum += xn[(h * s.in_w + w) * s.in_c + c];
    }
    y[i] = sum * (1.f / static_cast<float>((r.h1 - r.h0) * (r.w1 - r.w0)));
  }
}

__global__ void AvgPoolBackwardKernel(WindowShape s, const float* dy, float* dx, bool accumulate) {
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
        g += dy[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + c] *
             (1.f / static_cast<float>((r.h1 - r.h0) * (r.w1 - r.w0)));
      }
    }
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void GlobalAvgPoolForwardKernel(int64_t batch, int64_t spatial, int64_t channels,
                                           const float* x, float* y) {
  const float inv = 1.f / static_cast<float>(spatial);
  GRID_STRIDE(i, batch * channels) {
    const int64_t c = i % channels;
    const int64_t n = i / channels;
    float sum = 0.f;
    for (int64_t p = 0; p < spatial; ++p) sum += x[(n * spatial + p) * channels + c];
    y[i] = sum * inv;
  }
}

__global__ void GlobalAvgPoolBackwardKernel(int64_t batch, int64_t spatial, int64_t channels,
                                            const float* dy, float* dx, bool accumulate) {
  const float inv = 1.f / static_cast<float>(spatial);
  GRID_STRIDE(i, batch * spatial * channels) {
    const int64_t c = i % channels;
    const int64_t n = i / (spatial * channels);
    const float g = dy[n * channels + c] * inv;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void EmbeddingForwardKernel(int64_t num_ids, int64_t vocab, int64_t dim,
                                       const float* ids, const float* table, float* y) {
  GRID_STRIDE(i, num_ids * dim) {
    const int64_t row = EmbeddingRow(ids[i / dim], vocab);
    y[i] = row < 0 ? 0.f : table[row * dim + i % dim];
  }
}

__global__ void EmbeddingBackwardKernel(int64_t num_ids, int64_t vocab, int64_t dim,
                                        const float* ids, const float* dy, float* dtable) {
  GRID_STRIDE(i, num_ids * dim) {
    const int64_t row = EmbeddingRow(ids[i / dim], vocab);
    if (row >= 0) atomicAdd(dtable + row * dim + i % dim, dy[i]);
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

cudaError_t BroadcastRows(cudaStream_t stream, int64_t rows, int64_t cols, const float* bias,
                          float* y) {
  BroadcastRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t ColumnSum(cudaStream_t stream, int64_t rows, int64_t cols, const float* x, float* y,
                      bool accumulate) {
  ColumnSumKernel<<<Blocks(cols), kThreads, 0, stream>>>(rows, cols, x, y, accumulate);
  return cudaGetLastError();
}

cudaError_t Scale(cudaStream_t stream, int64_t n, float alpha, float* x) {
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t ReluForward(cudaStream_t stream, int64_t n, const float* x, float* y) {
  ReluForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t ReluBackward(cudaStream_t stream, int64_t n, const float* x, const float* dy, float* dx,
                         bool accumulate) {
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, x, dy, dx, accumulate);
  return cudaGetLastError();
}

cudaError_t DropoutForward(cudaStream_t stream, int64_t n, float rate, uint64_t key, const float* x,
                           float* y, uint8_t* mask) {
  DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, rate, 1.f / (1.f - rate), key, x, y,
                                                           mask);
  return cudaGetLastError();
}

cudaError_t DropoutBackward(cudaStream_t stream, int64_t n, float rate, const uint8_t* mask,
                            const float* dy, float* dx, bool accumulate) {
  DropoutBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, 1.f / (1.f - rate), mask, dy, dx,
                                                            accumulate);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int64_t batch, int64_t classes,
                                const float* logits, const int32_t* labels, float* dlogits,
                                double* loss_sum, unsigned long long* correct) {
  SoftmaxCrossEntropyKernel<<<Blocks(batch), kThreads, 0, stream>>>(batch, classes, logits, labels,
                                                                    dlogits, loss_sum, correct);
  return cudaGetLastError();
}

cudaError_t CopyOrAdd(cudaStream_t stream, int64_t n, const float* x, float* y, bool accumulate) {
  CopyOrAddKernel<<<Blocks(n), kThreads, 0, stream>>>(n, x, y, accumulate);
  return cudaGetLastError();
}

cudaError_t Add(cudaStream_t stream, int64_t n, const float* a, const float* b, float* y) {
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(n, a, b, y);
  return cudaGetLastError();
}

cudaError_t PadImages(cudaStream_t stream, const WindowShape& s, int64_t padded_h, int64_t padded_w,
                      const float* x, float* padded) {
  PadImagesKernel<<<Blocks(s.batch * padded_h * padded_w * s.in_c), kThreads, 0, stream>>>(
      s, padded_h, padded_w, x, padded);
  return cudaGetLastError();
}

cudaError_t CropImages(cudaStream_t stream, const WindowShape& s, int64_t padded_h,
                       int64_t padded_w, const float* dpadded, float* dx, bool accumulate) {
  CropImagesKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(
      s, padded_h, padded_w, dpadded, dx, accumulate);
  return cudaGetLastError();
}

cudaError_t MaxPoolForward(cudaStream_t stream, const WindowShape& s, const float* x, float* y) {
  MaxPoolForwardKernel<<<Blocks(s.batch * s.out_elements()), kThreads, 0, stream>>>(s, x, y);
  return cudaGetLastError();
}

cudaError_t MaxPoolBackward(cudaStream_t stream, const WindowShape& s, const float* x,
                            const float* dy, float* dx, bool accumulate) {
  MaxPoolBackwardKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(s, x, dy, dx,
                                                                                    accumulate);
  return cudaGetLastError();
}

cudaError_t AvgPoolForward(cudaStream_t stream, const WindowShape& s, const float* x, float* y) {
  AvgPoolForwardKernel<<<Blocks(s.batch * s.out_elements()), kThreads, 0, stream>>>(s, x, y);
  return cudaGetLastError();
}

cudaError_t AvgPoolBackward(cudaStream_t stream, const WindowShape& s, const float* dy, float* dx,
                            bool accumulate) {
  AvgPoolBackwardKernel<<<Blocks(s.batch * s.in_elements()), kThreads, 0, stream>>>(s, dy, dx,
                                                                                    accumulate);
  return cudaGetLastError();
}

cudaError_t GlobalAvgPoolForward(cudaStream_t stream, int64_t batch, int64_t spatial,
                                 int64_t channels, const float* x, float* y) {
  GlobalAvgPoolForwardKernel<<<Blocks(batch * channels), kThreads, 0, stream>>>(batch, spatial,
                                                                                channels, x, y);
  return cudaGetLastError();
}

cudaError_t GlobalAvgPoolBackward(cudaStream_t stream, int64_t batch, int64_t spatial,
                                  int64_t channels, const float* dy, float* dx, bool accumulate) {
  GlobalAvgPoolBackwardKernel<<<Blocks(batch * spatial * channels), kThreads, 0, stream>>>(
      batch, spatial, channels, dy, dx, accumulate);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(cudaStream_t stream, int64_t num_ids, int64_t vocab, int64_t dim,
                             const float* ids, const float* table, float* y) {
  EmbeddingForwardKernel<<<Blocks(num_ids * dim), kThreads, 0, stream>>>(num_ids, vocab, dim, ids,
                                                                         table, y);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(cudaStream_t stream, int64_t num_ids, int64_t vocab, int64_t dim,
                              const float* ids, const float* dy, float* dtable) {
  EmbeddingBackwardKernel<<<Blocks(num_ids * dim), kThreads, 0, stream>>>(num_ids, vocab, dim, ids,
                                                                          dy, dtable);
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

}  // namespace cuda_internal
}  // namespace kernels
}  // namespace downpour
