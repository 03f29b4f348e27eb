// Embedding lookup and its scatter-add gradient behind kernels/cuda (see
// launch.h), the twins of kernels/cpu/layers.cc's: ids are fp32 integers read
// through EmbeddingRow (kernels/types.h), the same test on both backends.
// Templated over the activation element type T (float, __nv_bfloat16, __half).
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

}  // namespace

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

#define DOWNPOUR_INSTANTIATE(T)                                                                    \
  template cudaError_t EmbeddingForward<T>(cudaStream_t, int64_t, int64_t, int64_t, const float*,  \
                                           const float*, T*);                                      \
  template cudaError_t EmbeddingBackward<T>(cudaStream_t, int64_t, int64_t, int64_t, const float*, \
                                            const T*, float*);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
