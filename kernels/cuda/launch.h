// Internal to kernels/cuda: the launchers of our own CUDA kernels, compiled
// by nvcc (one .cu file per family, named in each section below) and called
// from the host ops (layers.h, optimizer.h, weights.h), which do the library
// calls (cuBLAS, cuDNN) and the status conversion. This header sees neither
// Abseil nor the CUDA libraries, so nvcc compiles only device code and plain
// C++. Each launcher queues work on `stream` and returns the launch's
// cudaGetLastError(). Pointers are device memory; sizes as in
// kernels/cpu/layers.h. Launchers keep no state (thread-safe) and own nothing
// they are given.
//
// Activation element types: `T` below is float, __nv_bfloat16 or __half
// (each template is instantiated for the three in its .cu file). Values are
// read into fp32, computed in fp32 and rounded once when stored; sums (batch
// norm statistics, column sums, pooling windows) accumulate in fp32.
#ifndef DOWNPOUR_KERNELS_CUDA_LAUNCH_H_
#define DOWNPOUR_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/types.h"

// Applies X to each activation element type: the explicit instantiations of
// every template over T, in launch.h's .cu files and layers.h's .cc files.
#define DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(X) X(float) X(__nv_bfloat16) X(__half)

namespace downpour {
namespace kernels {
namespace cuda {
namespace internal {

// ---- elementwise.cu

// y[r, c] = bias[c].
template <typename T>
cudaError_t BroadcastRows(cudaStream_t stream, int64_t rows, int64_t cols, const float* bias, T* y);
// x[i] *= alpha.
cudaError_t Scale(cudaStream_t stream, int64_t n, float alpha, float* x);
// y[i] (+)= max(0, x[i] + bias[i % channels]) converted from S to D: the bias
// only when not null, the clamp only when `relu`, the add when `accumulate`.
// x == y (S == D) is allowed. S and D are any of the three types.
template <typename S, typename D>
cudaError_t Convert(cudaStream_t stream, int64_t n, const S* x, D* y, const float* bias,
                    int64_t channels, bool accumulate, bool relu);
// For each range r < num_ranges (device arrays): y[dst_begin[r] + i] =
// x[src_begin[r] + i] cast to the reduced type, i < count[r] <= max_count.
cudaError_t CastRangesToReduced(cudaStream_t stream, int num_ranges, const int64_t* src_begin,
                                const int64_t* dst_begin, const int64_t* count, int64_t max_count,
                                const float* x, void* y, bool fp16);
// g *= inv_scale; *flag = 1 if any g was inf or NaN before (flag is set,
// never cleared).
cudaError_t UnscaleCheckFinite(cudaStream_t stream, int64_t n, float inv_scale, float* g,
                               int* flag);
template <typename T>
cudaError_t ReluForward(cudaStream_t stream, int64_t n, const T* x, T* y);
// dx (+)= dy where y > 0 (y is the forward's output or input: same sign).
template <typename T>
cudaError_t ReluBackward(cudaStream_t stream, int64_t n, const T* y, const T* dy, T* dx,
                         bool accumulate);
template <typename T>
cudaError_t DropoutForward(cudaStream_t stream, int64_t n, float rate, uint64_t key, const T* x,
                           T* y, uint8_t* mask);
template <typename T>
cudaError_t DropoutBackward(cudaStream_t stream, int64_t n, float rate, const uint8_t* mask,
                            const T* dy, T* dx, bool accumulate);
template <typename T>
cudaError_t CopyOrAdd(cudaStream_t stream, int64_t n, const T* x, T* y, bool accumulate);
// y[r * y_stride + c] += x[r * x_stride + c] for r < rows, c < width.
template <typename T>
cudaError_t AddBlock(cudaStream_t stream, int64_t rows, int64_t width, const T* x, int64_t x_stride,
                     T* y, int64_t y_stride);
template <typename T>
cudaError_t Add(cudaStream_t stream, int64_t n, const T* a, const T* b, T* y);

// ---- loss.cu

// Adds each row's loss to *loss_sum and its correctness to *correct; when
// dlogits is not null writes dlogits_scale * (softmax - onehot) / batch
// (the loss scale folded in before rounding to T).
template <typename T>
cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int64_t batch, int64_t classes,
                                const T* logits, const int32_t* labels, T* dlogits,
                                float dlogits_scale, double* loss_sum, unsigned long long* correct);

// ---- layout.cu

// The images of `s` copied into `padded`, [batch, padded_h, padded_w, in_c]
// with padded_h = (out_h - 1) * stride_h + kernel_h (likewise w): input row
// h lands at h + pad_top; the rest is zero.
template <typename T>
cudaError_t PadImages(cudaStream_t stream, const WindowShape& s, int64_t padded_h, int64_t padded_w,
                      const T* x, T* padded);
// The adjoint: dx (+)= the image part of dpadded.
template <typename T>
cudaError_t CropImages(cudaStream_t stream, const WindowShape& s, int64_t padded_h,
                       int64_t padded_w, const T* dpadded, T* dx, bool accumulate);

// fp32 only (the NCHW convolution path):
// out[b, j, i] (+)= in[b, i, j] (+ bias[i] when bias is not null): a batch of
// [rows, cols] -> [cols, rows] transposes through shared-memory tiles. NHWC
// <-> NCHW activations (rows = H * W, cols = C, or back) and
// [K, R, S, C] <-> [K, C, R, S] filters.
cudaError_t BatchedTranspose(cudaStream_t stream, int64_t batch, int64_t rows, int64_t cols,
                             const float* in, float* out, const float* bias, bool accumulate);
// NHWC x (the images of `s`) -> NCHW [batch, in_c, ph, pw] with the image
// at (pad_top, pad_left) and zeros around it.
cudaError_t PadToNchw(cudaStream_t stream, const WindowShape& s, int64_t ph, int64_t pw,
                      const float* x, float* padded);
// The adjoint: NHWC dx (+)= the image part of NCHW dpadded.
cudaError_t CropFromNchw(cudaStream_t stream, const WindowShape& s, int64_t ph, int64_t pw,
                         const float* dpadded, float* dx, bool accumulate);

// ---- pool.cu

template <typename T>
cudaError_t MaxPoolForward(cudaStream_t stream, const WindowShape& s, const T* x, T* y);
template <typename T>
cudaError_t MaxPoolBackward(cudaStream_t stream, const WindowShape& s, const T* x, const T* dy,
                            T* dx, bool accumulate);
template <typename T>
cudaError_t AvgPoolForward(cudaStream_t stream, const WindowShape& s, const T* x, T* y);
template <typename T>
cudaError_t AvgPoolBackward(cudaStream_t stream, const WindowShape& s, const T* dy, T* dx,
                            bool accumulate);
template <typename T>
cudaError_t GlobalAvgPoolForward(cudaStream_t stream, int64_t batch, int64_t spatial,
                                 int64_t channels, const T* x, T* y);
template <typename T>
cudaError_t GlobalAvgPoolBackward(cudaStream_t stream, int64_t batch, int64_t spatial,
                                  int64_t channels, const T* dy, T* dx, bool accumulate);

// ---- batch_norm.cu

// Per-column reductions over a row-major [rows, cols] matrix (NHWC
// activations seen as [batch * H * W, channels]). Two launches: blocks of
// 32 columns x 8 row lanes each reduce a slab of rows into partials
// [row_blocks, cols], and one thread per column finishes. `partials` is
// device scratch of ColumnPartialsElements(rows, cols) floats.
int64_t ColumnRowBlocks(int64_t rows, int64_t cols);
int64_t ColumnPartialsElements(int64_t rows, int64_t cols);
// y[c] (+)= sum over rows of x[r, c] (fp32 sums and output).
template <typename T>
cudaError_t ColumnSumFast(cudaStream_t stream, int64_t rows, int64_t cols, const T* x, float* y,
                          bool accumulate, float* partials);

// Batch norm over [rows, channels] (kernels/cpu/layers.cc's math; statistics
// merged with Chan's formula from per-slab shifted sums). x, y, dy, dx are T;
// gamma, beta, the statistics and their gradients fp32.
template <typename T>
cudaError_t BatchNormForwardTraining(cudaStream_t stream, int64_t rows, int64_t channels,
                                     const T* x, const float* gamma, const float* beta,
                                     float epsilon, float momentum, T* y, float* running_mean,
                                     float* running_var, float* save_mean, float* save_inv_std,
                                     float* partials);
template <typename T>
cudaError_t BatchNormForwardInference(cudaStream_t stream, int64_t rows, int64_t channels,
                                      const T* x, const float* gamma, const float* beta,
                                      const float* mean, const float* var, float epsilon, T* y);
// `sums` is device scratch of 2 * channels floats.
template <typename T>
cudaError_t BatchNormBackward(cudaStream_t stream, int64_t rows, int64_t channels, const T* x,
                              const T* dy, const float* gamma, const float* save_mean,
                              const float* save_inv_std, T* dx, bool dx_accumulate, float* dgamma,
                              float* dbeta, bool param_accumulate, float* partials, float* sums);

// ---- embedding.cu

// Ids are fp32 (exact integers); the table and its gradient fp32.
template <typename T>
cudaError_t EmbeddingForward(cudaStream_t stream, int64_t num_ids, int64_t vocab, int64_t dim,
                             const float* ids, const float* table, T* y);
// dtable must already be zeroed for an overwrite.
template <typename T>
cudaError_t EmbeddingBackward(cudaStream_t stream, int64_t num_ids, int64_t vocab, int64_t dim,
                              const float* ids, const T* dy, float* dtable);
// Sparse embeddings' pooling and its row gradients (see cpu::PoolRows):
// one grid row per table.
cudaError_t PoolRows(cudaStream_t stream, int64_t batch, int num_tables, const PooledTable* tables,
                     int64_t most_work, float* features);
cudaError_t PoolRowsBackward(cudaStream_t stream, int num_tables, const PooledTable* tables,
                             int64_t most_work, const float* features_grad);
// Pairwise dot products of [batch, vectors, dim] (see cpu::PairwiseDot*).
template <typename T>
cudaError_t PairwiseDotForward(cudaStream_t stream, int64_t batch, int64_t vectors, int64_t dim,
                               const T* x, T* y);
template <typename T>
cudaError_t PairwiseDotBackward(cudaStream_t stream, int64_t batch, int64_t vectors, int64_t dim,
                                const T* x, const T* dy, T* dx);

// ---- optimizer.cu

// One tensor of a fused optimizer update (device pointers).
struct OptimizerTensor {
  const float* grad;
  float* param;
  float* slot0;
  float* slot1;
  int64_t n;
};

// Hyperparameters resolved on the host (Adam's bias corrections by
// AdamBiasCorrections of kernels/optimizer.h).
struct OptimizerArgs {
  int kind;  // OptimizerKind as int.
  float lr, momentum, beta1, beta2, epsilon, weight_decay;
  float adam_step_size, adam_inv_sqrt_bc2;  // lr / (1 - b1^t), 1 / sqrt(1 - b2^t).
};

// Elements per block of the fused update.
constexpr int64_t kOptimizerChunk = 1 << 16;

// `tensors` (num_tensors) and `chunk_tensor`/`chunk_start` (num_chunks: the
// tensor and first element of each chunk) are device arrays.
cudaError_t MultiTensorUpdate(cudaStream_t stream, const OptimizerArgs& args,
                              const OptimizerTensor* tensors, const int32_t* chunk_tensor,
                              const int64_t* chunk_start, int64_t num_chunks);

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_LAUNCH_H_
