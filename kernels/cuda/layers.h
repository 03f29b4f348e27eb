// CUDA twin of kernels/cpu/layers.h: the same layer math on one GPU, over
// cuBLAS (GEMM, dense), cuDNN (convolution) and our own kernels (element-wise
// ops, pooling, batch norm, dropout, softmax cross-entropy, embedding).
//
// Each function takes the arguments of its CPU twin, with a CudaContext in
// place of CpuContext; pointers name device memory of ctx.device (labels and
// ids included). Conv2d keeps its scratch in the context, so it has no
// workspace argument. Work is queued on ctx.stream and is asynchronous.
//
// Every function returns a status instead of void: the launch is checked with
// cudaGetLastError() and each library call's result is converted, so a bad
// launch surfaces as an Internal error naming the call, never a crash.
// Inputs are validated by the caller on the host, as for the CPU kernels.
//
// Numerics: fp32 throughout and no TF32 (cuBLAS default math, cuDNN FMA
// math), so results agree with the CPU twin within float rounding, unless
// the context's `compute` asks for bf16 or fp16: then activations and their
// gradients are stored in that type (see "activations" below), dense layers
// and convolutions multiply on tensor cores with fp32 accumulation, and
// every other op computes in fp32 between a reduced load and a reduced
// store, as PyTorch's autocast does; weights are read from reduced copies
// (weights.h) and weight gradients, statistics and optimizer state stay
// fp32. Dropout draws the same mask as the CPU twin for the same (seed,
// step).
//
// Thread safety: as the context's (one host thread at a time per context).
// Ownership: the ops never allocate or free the tensors they are given; the
// scratch they need is the context's workspace.
#ifndef DOWNPOUR_KERNELS_CUDA_LAYERS_H_
#define DOWNPOUR_KERNELS_CUDA_LAYERS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/context.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cuda {

// ------------------------------------------------------- activations
//
// `T` is the element type of activations and their gradients (x, y, dx, dy
// below): float in an fp32 context, __nv_bfloat16 in a bf16 one, __half in
// an fp16 one (the functions that multiply, dense and conv2d, say
// InvalidArgument when T does not match ctx.compute). Weights, biases, their
// gradients and every statistic stay fp32. Each template is instantiated for
// the three types in the .cc file that defines it.

// y = x converted from S to D (any of the three types), n elements.
template <typename S, typename D>
absl::Status Convert(const CudaContext& ctx, int64_t n, const S* x, D* y);

// ------------------------------------------------------- dense and element-wise

// Row-major C = alpha op(A) op(B) + beta C in fp32, on TF32 tensor cores
// where ctx.tf32 allows GEMMs.
absl::Status Gemm(const CudaContext& ctx, Transpose trans_a, Transpose trans_b, int64_t m,
                  int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta,
                  float* c);

template <typename T>
absl::Status DenseForward(const CudaContext& ctx, int64_t batch, int64_t in, int64_t out,
                          const T* x, const float* w, const float* bias, T* y);

template <typename T>
absl::Status DenseBackward(const CudaContext& ctx, int64_t batch, int64_t in, int64_t out,
                           const T* x, const float* w, const T* dy, T* dx, Write dx_write,
                           float* dw, float* dbias, Write param_write);

template <typename T>
absl::Status ReluForward(const CudaContext& ctx, int64_t n, const T* x, T* y);

// `y` is the forward's output (or its input: the sign test is the same).
template <typename T>
absl::Status ReluBackward(const CudaContext& ctx, int64_t n, const T* y, const T* dy, T* dx,
                          Write dx_write);

template <typename T>
absl::Status DropoutForward(const CudaContext& ctx, int64_t n, float rate, uint64_t seed,
                            uint64_t step, const T* x, T* y, uint8_t* mask);

template <typename T>
absl::Status DropoutBackward(const CudaContext& ctx, int64_t n, float rate, const uint8_t* mask,
                             const T* dy, T* dx, Write dx_write);

// SoftmaxCrossEntropy of the CPU twin without waiting: adds the batch's loss
// sum and correct count to the device counters *loss_sum and *correct
// (which the caller zeroes and reads back when it wants them). dlogits
// (when not null) are multiplied by `dlogits_scale` (FP16 loss scaling)
// before rounding.
template <typename T>
absl::Status SoftmaxCrossEntropyAsync(const CudaContext& ctx, int64_t batch, int64_t classes,
                                      const T* logits, const int32_t* labels, T* dlogits,
                                      float dlogits_scale, double* loss_sum,
                                      unsigned long long* correct);

template <typename T>
absl::Status CopyOrAdd(const CudaContext& ctx, int64_t n, const T* x, T* y, Write write);

// As cpu::CopyBlock (a block of columns of one matrix into another).
template <typename T>
absl::Status CopyBlock(const CudaContext& ctx, int64_t rows, int64_t width, const T* x,
                       int64_t x_stride, int64_t x_offset, T* y, int64_t y_stride, int64_t y_offset,
                       Write write);

// Loss scaling: g *= inv_scale over n gradients, and *flag (device int) set
// to 1 when any of them was inf or NaN (never cleared here; the caller
// zeroes it before the step).
absl::Status UnscaleCheckFinite(const CudaContext& ctx, int64_t n, float inv_scale, float* g,
                                int* flag);

template <typename T>
absl::Status Zero(const CudaContext& ctx, int64_t n, T* x);

template <typename T>
absl::Status Add(const CudaContext& ctx, int64_t n, const T* a, const T* b, T* y);

// ------------------------------------------------------- images (NHWC)

// cuDNN with NHWC tensors and [out_c, kernel_h, kernel_w, in_c] filters.
// Asymmetric padding (TensorFlow's SAME with an odd total), which cuDNN
// cannot express, goes through an explicitly padded copy in the workspace.
// `relu`: y = max(0, conv + bias), in the pass that adds the bias (or one
// pass after).
// fp32: the faster of NHWC and NCHW per shape (see conv_plan.h). bf16/fp16:
// NHWC tensor-core convolutions straight on the reduced tensors, except per
// direction where cudnnFind measures the fp32 plan on converted copies
// faster, conversions included, and the copies and that plan's workspace
// stay under 64 MiB (a small 1-channel input), or where cuDNN cannot run
// the shape in the reduced type at all.
template <typename T>
absl::Status Conv2dForward(const CudaContext& ctx, const WindowShape& s, const T* x, const float* w,
                           const float* bias, T* y, bool relu = false);

template <typename T>
absl::Status Conv2dBackward(const CudaContext& ctx, const WindowShape& s, const T* x,
                            const float* w, const T* dy, T* dx, Write dx_write, float* dw,
                            float* dbias, Write param_write);

// Pooling is ours, not cuDNN's: cuDNN has no asymmetric padding, and the
// backward must pick the same maximum as the CPU twin (the first in the
// window).
template <typename T>
absl::Status MaxPoolForward(const CudaContext& ctx, const WindowShape& s, const T* x, T* y);
template <typename T>
absl::Status MaxPoolBackward(const CudaContext& ctx, const WindowShape& s, const T* x, const T* dy,
                             T* dx, Write dx_write);
template <typename T>
absl::Status AvgPoolForward(const CudaContext& ctx, const WindowShape& s, const T* x, T* y);
template <typename T>
absl::Status AvgPoolBackward(const CudaContext& ctx, const WindowShape& s, const T* dy, T* dx,
                             Write dx_write);
template <typename T>
absl::Status GlobalAvgPoolForward(const CudaContext& ctx, int64_t batch, int64_t spatial,
                                  int64_t channels, const T* x, T* y);
template <typename T>
absl::Status GlobalAvgPoolBackward(const CudaContext& ctx, int64_t batch, int64_t spatial,
                                   int64_t channels, const T* dy, T* dx, Write dx_write);

// ------------------------------------------------------- batch norm (ours)

template <typename T>
absl::Status BatchNormForwardTraining(const CudaContext& ctx, int64_t rows, int64_t channels,
                                      const T* x, const float* gamma, const float* beta,
                                      float epsilon, float momentum, T* y, float* running_mean,
                                      float* running_var, float* save_mean, float* save_inv_std);

template <typename T>
absl::Status BatchNormForwardInference(const CudaContext& ctx, int64_t rows, int64_t channels,
                                       const T* x, const float* gamma, const float* beta,
                                       const float* mean, const float* var, float epsilon, T* y);

template <typename T>
absl::Status BatchNormBackward(const CudaContext& ctx, int64_t rows, int64_t channels, const T* x,
                               const T* dy, const float* gamma, const float* save_mean,
                               const float* save_inv_std, T* dx, Write dx_write, float* dgamma,
                               float* dbeta, Write param_write);

// ------------------------------------------------------- embedding

// Ids are fp32 (exact integers; never reduced).
template <typename T>
absl::Status EmbeddingForward(const CudaContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                              const float* ids, const float* table, T* y);

// Scatter-add with atomics: the sum is the CPU twin's up to the order of
// float additions.
template <typename T>
absl::Status EmbeddingBackward(const CudaContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                               const float* ids, const T* dy, float* dtable, Write param_write);

// As cpu::PoolRows / PoolRowsBackward, the same sums in the same order (no
// fused multiply-adds): bit for bit the CPU's. `tables` in device memory;
// `most_work` as ComputeBackend's.
absl::Status PoolRows(const CudaContext& ctx, int64_t batch, int num_tables,
                      const PooledTable* tables, int64_t most_work, float* features);
absl::Status PoolRowsBackward(const CudaContext& ctx, int num_tables, const PooledTable* tables,
                              int64_t most_work, const float* features_grad);

// As cpu::PairwiseDotForward / PairwiseDotBackward (accumulated in fp32).
template <typename T>
absl::Status PairwiseDotForward(const CudaContext& ctx, int64_t batch, int64_t vectors, int64_t dim,
                                const T* x, T* y);
template <typename T>
absl::Status PairwiseDotBackward(const CudaContext& ctx, int64_t batch, int64_t vectors,
                                 int64_t dim, const T* x, const T* dy, T* dx);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_LAYERS_H_
