// The fused softmax cross-entropy kernel behind kernels/cuda (see launch.h),
// the twin of SoftmaxCrossEntropy in kernels/cpu/layers.cc. Templated over
// the activation element type T (float, __nv_bfloat16, __half): logits are
// read into fp32 and the sums accumulate in double, as on the CPU.
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

}  // namespace

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

#define DOWNPOUR_INSTANTIATE(T)                                                         \
  template cudaError_t SoftmaxCrossEntropy<T>(cudaStream_t, int64_t, int64_t, const T*, \
                                              const int32_t*, T*, float, double*,       \
                                              unsigned long long*);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
