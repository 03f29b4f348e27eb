// Per-column reductions and the batch norm kernels built on them, behind
// kernels/cuda (see launch.h): column sums (bias gradients), batch norm
// statistics, normalisation and gradients, the twins of kernels/cpu/layers.cc's
// batch norm.
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

// The packed version: channels a multiple of the pack, x, dy and dx 16-byte
// aligned; the same arithmetic per element.
template <typename T>
__global__ void BatchNormBackwardDxPackKernel(int64_t packs, int64_t cols, float inv_rows,
                                              const T* x, const T* dy, const float* gamma,
                                              const float* mean, const float* inv_std,
                                              const float* sums, T* dx, bool accumulate) {
  constexpr int N = kPack<T>;
  GRID_STRIDE(i, packs) {
    const int64_t c = (i * N) % cols;
    float xv[N], g[N], old[N];
    LoadF(x + i * N, xv);
    LoadF(dy + i * N, g);
    if (accumulate) LoadF(dx + i * N, old);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float xhat = (xv[k] - mean[c + k]) * inv_std[c + k];
      const float v = gamma[c + k] * inv_std[c + k] *
                      (g[k] - (sums[c + k] + xhat * sums[cols + c + k]) * inv_rows);
      xv[k] = accumulate ? old[k] + v : v;
    }
    StoreF(dx + i * N, xv);
  }
}

}  // namespace

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
    const float inv_rows = 1.f / static_cast<float>(rows);
    constexpr int kN = kPack<T>;
    if (Packed(channels, kN, x, dy, dx)) {
      BatchNormBackwardDxPackKernel<<<Blocks(n / kN), kThreads, 0, stream>>>(
          n / kN, channels, inv_rows, x, dy, gamma, save_mean, save_inv_std, sums, dx,
          dx_accumulate);
    } else {
      BatchNormBackwardDxKernel<<<Blocks(n), kThreads, 0, stream>>>(
          n, channels, inv_rows, x, dy, gamma, save_mean, save_inv_std, sums, dx, dx_accumulate);
    }
  }
  return cudaGetLastError();
}

#define DOWNPOUR_INSTANTIATE(T)                                                                  \
  template cudaError_t ColumnSumFast<T>(cudaStream_t, int64_t, int64_t, const T*, float*, bool,  \
                                        float*);                                                 \
  template cudaError_t BatchNormForwardTraining<T>(cudaStream_t, int64_t, int64_t, const T*,     \
                                                   const float*, const float*, float, float, T*, \
                                                   float*, float*, float*, float*, float*);      \
  template cudaError_t BatchNormForwardInference<T>(cudaStream_t, int64_t, int64_t, const T*,    \
                                                    const float*, const float*, const float*,    \
                                                    const float*, float, T*);                    \
  template cudaError_t BatchNormBackward<T>(cudaStream_t, int64_t, int64_t, const T*, const T*,  \
                                            const float*, const float*, const float*, T*, bool,  \
                                            float*, float*, bool, float*, float*);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
