// The fused multi-tensor optimizer update behind kernels/cuda/optimizer.h
// (see launch.h): one block per chunk of a tensor, the same update per element
// as kernels/cpu/optimizer.cc.
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

cudaError_t MultiTensorUpdate(cudaStream_t stream, const OptimizerArgs& args,
                              const OptimizerTensor* tensors, const int32_t* chunk_tensor,
                              const int64_t* chunk_start, int64_t num_chunks) {
  if (num_chunks == 0) return cudaSuccess;
  MultiTensorUpdateKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(
      args, tensors, chunk_tensor, chunk_start);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
