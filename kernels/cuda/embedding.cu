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

// Grid row per table; thread per (fresh row, column): a stored table's
// fresh rows written to their places.
__global__ void StoreFreshRowsKernel(const PooledTable* tables) {
  const PooledTable& table = tables[blockIdx.y];
  const int64_t dim = table.dim;
  GRID_STRIDE(i, int64_t{table.fresh} * dim) {
    table.store[int64_t{table.fresh_places[i / dim]} * dim + i % dim] = table.fresh_values[i];
  }
}

// Grid row per table; thread per (example, column): the example's rows
// summed in id order from zero, then scaled (cpu::PoolRows, no FMA).
__global__ void PoolRowsKernel(int64_t batch, const PooledTable* tables, float* features) {
  const PooledTable& table = tables[blockIdx.y];
  const int64_t dim = table.dim;
  GRID_STRIDE(i, batch * dim) {
    const int64_t b = i / dim, d = i % dim;
    const int32_t begin = table.offsets[b], end = table.offsets[b + 1];
    float sum = 0.f;
    for (int32_t k = begin; k < end; ++k) {
      sum = __fadd_rn(sum, PooledRow(table, table.index[k])[d]);
    }
    const float scale = PoolScale(table.mean != 0, end - begin);
    features[table.slot + i] = scale != 1.f ? __fmul_rn(sum, scale) : sum;
  }
}

// Grid row per table; a warp per row (a hot row of a skewed table has
// thousands of readers): lane l sums the reads l, l + 32, ... in order, and
// the lanes' sums meet in a fixed tree (cpu::PoolRowsBackward's order).
__global__ void PoolRowsBackwardKernel(const PooledTable* tables, const float* features_grad) {
  const PooledTable& table = tables[blockIdx.y];
  const int64_t dim = table.dim;
  const int lane = static_cast<int>(threadIdx.x % kPoolLanes);
  const int64_t warps = static_cast<int64_t>(blockDim.x / kPoolLanes) * gridDim.x;
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kPoolLanes;
       r < table.rows; r += warps) {
    const int32_t begin = table.row_reads[r], end = table.row_reads[r + 1];
    for (int64_t d = 0; d < dim; ++d) {
      float sum = 0.f;
      for (int32_t k = begin + lane; k < end; k += kPoolLanes) {
        const int32_t b = table.readers[k];
        const float g = features_grad[table.slot + int64_t{b} * dim + d];
        sum = __fadd_rn(sum,
                        table.mean != 0
                            ? __fmul_rn(PoolScale(true, table.offsets[b + 1] - table.offsets[b]), g)
                            : g);
      }
      for (int offset = kPoolLanes / 2; offset > 0; offset /= 2) {
        sum = __fadd_rn(sum, __shfl_down_sync(0xffffffffu, sum, offset));
      }
      if (lane == 0) table.grads[r * dim + d] = sum;
    }
  }
}

// Thread per (example, i, j), j > i: one pair's dot product.
template <typename T>
__global__ void PairwiseDotForwardKernel(int64_t batch, int64_t vectors, int64_t dim, const T* x,
                                         T* y) {
  const int64_t pairs = vectors * (vectors - 1) / 2;
  GRID_STRIDE(n, batch * vectors * vectors) {
    const int64_t b = n / (vectors * vectors);
    const int64_t i = (n / vectors) % vectors;
    const int64_t j = n % vectors;
    if (j <= i) continue;
    const T* xb = x + b * vectors * dim;
    float dot = 0.f;
    for (int64_t t = 0; t < dim; ++t) dot += ToF(xb[i * dim + t]) * ToF(xb[j * dim + t]);
    const int64_t p = i * vectors - i * (i + 1) / 2 + (j - i - 1);
    y[b * pairs + p] = FromF<T>(dot);
  }
}

// Thread per (example, i, t): dx_i[t] = sum over j != i of dy(i,j) x_j[t].
template <typename T>
__global__ void PairwiseDotBackwardKernel(int64_t batch, int64_t vectors, int64_t dim, const T* x,
                                          const T* dy, T* dx) {
  const int64_t pairs = vectors * (vectors - 1) / 2;
  GRID_STRIDE(n, batch * vectors * dim) {
    const int64_t b = n / (vectors * dim);
    const int64_t i = (n / dim) % vectors;
    const int64_t t = n % dim;
    const T* xb = x + b * vectors * dim;
    const T* g = dy + b * pairs;
    float sum = 0.f;
    for (int64_t j = 0; j < vectors; ++j) {
      if (j == i) continue;
      const int64_t lo = j < i ? j : i, hi = j < i ? i : j;
      const int64_t p = lo * vectors - lo * (lo + 1) / 2 + (hi - lo - 1);
      sum += ToF(g[p]) * ToF(xb[j * dim + t]);
    }
    dx[n] = FromF<T>(sum);
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

template <typename T>
cudaError_t PairwiseDotForward(cudaStream_t stream, int64_t batch, int64_t vectors, int64_t dim,
                               const T* x, T* y) {
  if (batch * vectors * vectors == 0) return cudaSuccess;
  PairwiseDotForwardKernel<<<Blocks(batch * vectors * vectors), kThreads, 0, stream>>>(
      batch, vectors, dim, x, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t PairwiseDotBackward(cudaStream_t stream, int64_t batch, int64_t vectors, int64_t dim,
                                const T* x, const T* dy, T* dx) {
  if (batch * vectors * dim == 0) return cudaSuccess;
  PairwiseDotBackwardKernel<<<Blocks(batch * vectors * dim), kThreads, 0, stream>>>(batch, vectors,
                                                                                    dim, x, dy, dx);
  return cudaGetLastError();
}

cudaError_t PoolRows(cudaStream_t stream, int64_t batch, int num_tables, const PooledTable* tables,
                     int64_t most_work, float* features) {
  if (num_tables == 0 || most_work == 0) return cudaSuccess;
  // Grid-strided: a table's fresh rows may outnumber the batch's columns.
  StoreFreshRowsKernel<<<dim3(Blocks(most_work), num_tables), kThreads, 0, stream>>>(tables);
  PoolRowsKernel<<<dim3(Blocks(most_work), num_tables), kThreads, 0, stream>>>(batch, tables,
                                                                               features);
  return cudaGetLastError();
}

cudaError_t PoolRowsBackward(cudaStream_t stream, int num_tables, const PooledTable* tables,
                             int64_t most_work, const float* features_grad) {
  if (num_tables == 0 || most_work == 0) return cudaSuccess;
  PoolRowsBackwardKernel<<<dim3(Blocks(most_work * kPoolLanes), num_tables), kThreads, 0, stream>>>(
      tables, features_grad);
  return cudaGetLastError();
}

#define DOWNPOUR_INSTANTIATE(T)                                                                    \
  template cudaError_t PairwiseDotForward<T>(cudaStream_t, int64_t, int64_t, int64_t, const T*,    \
                                             T*);                                                  \
  template cudaError_t PairwiseDotBackward<T>(cudaStream_t, int64_t, int64_t, int64_t, const T*,   \
                                              const T*, T*);                                       \
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
