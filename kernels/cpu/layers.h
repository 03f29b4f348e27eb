// CPU reference kernels: the layer math of a model as pure functions of
// (context, sizes, pointers), over OpenBLAS for the matrix products.
//
// Every kernel here has a CUDA twin in kernels/cuda/layers.h with the same
// parameters except the context (a stream and cuBLAS/cuDNN handles in
// place of CpuContext), and the tests compare the two. Tensors are dense,
// row-major; activations are [batch, features], images [batch, height,
// width, channels] (NHWC); a dense layer's weight is [in, out], a
// convolution's [out_channels, kernel_h, kernel_w, in_channels]. Pointers name memory of the
// context's device (host memory here).
//
// Thread safety: the kernels keep no state; concurrent calls on disjoint
// outputs are safe. OpenBLAS's thread count is process-wide (SetCpuThreads).
// Ownership: kernels never allocate or free the memory they are given.
//
// Inputs are not checked: the caller validates on the host before the call
// (see each REQUIRES). Sizes must fit in a 32-bit int where BLAS sees them.
#ifndef DOWNPOUR_KERNELS_CPU_LAYERS_H_
#define DOWNPOUR_KERNELS_CPU_LAYERS_H_

#include <cstdint>

#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cpu {

// Where a CPU kernel runs. Empty; it is the slot where the CUDA twin takes
// its context (stream and library handles), so call sites look the same.
struct CpuContext {};

// Sets the number of threads OpenBLAS uses for every later Gemm in the
// process. `num_threads` <= 0 leaves OpenBLAS's choice (all cores).
void SetCpuThreads(int num_threads);

// c[m, n] = alpha * op(a) * op(b) + beta * c, where op(a) is [m, k] (a is
// stored [m, k], or [k, m] when trans_a is kYes) and op(b) is [k, n] (b stored
// [k, n], or [n, k] when trans_b is kYes). With beta == 0, c is not read.
// REQUIRES: m, n, k >= 0 and each fits in int.
void Gemm(const CpuContext& ctx, Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c);

// y[batch, out] = x[batch, in] * w[in, out] + bias[out] (bias may be null).
void DenseForward(const CpuContext& ctx, int64_t batch, int64_t in, int64_t out, const float* x,
                  const float* w, const float* bias, float* y);

// Gradients of DenseForward given dy[batch, out]:
//   dx[batch, in] = dy * w^T            (skipped when dx is null)
//   dw[in, out]   = x^T * dy
//   dbias[out]    = sum over the batch of dy   (skipped when dbias is null)
// `dx_write` applies to dx, `param_write` to dw and dbias.
void DenseBackward(const CpuContext& ctx, int64_t batch, int64_t in, int64_t out, const float* x,
                   const float* w, const float* dy, float* dx, Write dx_write, float* dw,
                   float* dbias, Write param_write);

// y[i] = max(x[i], 0). y may equal x.
void ReluForward(const CpuContext& ctx, int64_t n, const float* x, float* y);

// dx[i] = dy[i] where x[i] > 0, else 0 (x is the forward input).
void ReluBackward(const CpuContext& ctx, int64_t n, const float* x, const float* dy, float* dx,
                  Write dx_write);

// Inverted dropout: each element is kept with probability 1 - rate and scaled
// by 1 / (1 - rate), so inference is the identity. Whether element i is kept
// depends only on (seed, step, i) through a counter-based hash, so a twin on
// another device draws the same mask. mask[i] = 1 if kept, else 0; it is what
// DropoutBackward needs. rate == 0 keeps everything.
// REQUIRES: 0 <= rate < 1.
void DropoutForward(const CpuContext& ctx, int64_t n, float rate, uint64_t seed, uint64_t step,
                    const float* x, float* y, uint8_t* mask);

// dx[i] = dy[i] * mask[i] / (1 - rate), with the mask of DropoutForward.
void DropoutBackward(const CpuContext& ctx, int64_t n, float rate, const uint8_t* mask,
                     const float* dy, float* dx, Write dx_write);

// Fused, numerically stable softmax cross-entropy over logits[batch, classes]
// (log-sum-exp taken after subtracting each row's maximum). Writes the batch's
// loss sum and number of correct predictions to *stats and, unless dlogits is
// null, dlogits = (softmax(logits) - onehot(labels)) / batch, the gradient of
// the mean loss.
// REQUIRES: batch > 0, classes > 0, 0 <= labels[i] < classes.
void SoftmaxCrossEntropy(const CpuContext& ctx, int64_t batch, int64_t classes, const float* logits,
                         const int32_t* labels, float* dlogits, LossStats* stats);

// y[i] = x[i] (kOverwrite) or y[i] += x[i] (kAccumulate): how a gradient is
// handed to a tensor read by several layers.
void CopyOrAdd(const CpuContext& ctx, int64_t n, const float* x, float* y, Write write);

// For r < rows, c < width: y[r * y_stride + y_offset + c] = (kOverwrite) or
// += (kAccumulate) x[r * x_stride + x_offset + c]: a block of columns of a
// row-major matrix into another (concatenation along the last axis).
void CopyBlock(const CpuContext& ctx, int64_t rows, int64_t width, const float* x, int64_t x_stride,
               int64_t x_offset, float* y, int64_t y_stride, int64_t y_offset, Write write);

// Sets x[0, n) to zero.
void Zero(const CpuContext& ctx, int64_t n, float* x);

// y[i] = a[i] + b[i]. y may equal a or b.
void Add(const CpuContext& ctx, int64_t n, const float* a, const float* b, float* y);

// ------------------------------------------------------- images (NHWC)
// Shapes are described by WindowShape (common/window_shape.h); tensors are
// [batch, height, width, channels] with the channels innermost.

// Floats of scratch Conv2dForward and Conv2dBackward need: one image's patch
// matrix, out_h * out_w * patch_elements(). (The CUDA twin keeps its scratch
// in its context instead.)
int64_t Conv2dWorkspaceElements(const WindowShape& s);

// y[n, oh, ow, f] = bias[f] + sum over (i, j, c) of
//   w[f, i, j, c] * x[n, oh * stride_h - pad_top + i, ow * stride_w - pad_left + j, c]
// with zeros outside the image. w is [out_c, kernel_h, kernel_w, in_c]; bias
// (null for none) is [out_c]. Image by image: im2col into `workspace`, then
// one GEMM.
// REQUIRES: workspace holds Conv2dWorkspaceElements(s) floats.
void Conv2dForward(const CpuContext& ctx, const WindowShape& s, const float* x, const float* w,
                   const float* bias, float* y, float* workspace);

// Gradients of Conv2dForward given dy: dx (skipped when null), dw and dbias
// (skipped when null). `dx_write` applies to dx, `param_write` to dw and
// dbias.
void Conv2dBackward(const CpuContext& ctx, const WindowShape& s, const float* x, const float* w,
                    const float* dy, float* dx, Write dx_write, float* dw, float* dbias,
                    Write param_write, float* workspace);

// y = the maximum of each window, per channel; padding never wins.
// REQUIRES: s.out_c == s.in_c, and every window covers at least one input.
void MaxPoolForward(const CpuContext& ctx, const WindowShape& s, const float* x, float* y);

// Each dy goes to the first maximum of its window (row-major window order),
// found again from x.
void MaxPoolBackward(const CpuContext& ctx, const WindowShape& s, const float* x, const float* dy,
                     float* dx, Write dx_write);

// y = the mean of each window over the inputs it covers (padding not
// counted). REQUIRES as MaxPoolForward.
void AvgPoolForward(const CpuContext& ctx, const WindowShape& s, const float* x, float* y);

void AvgPoolBackward(const CpuContext& ctx, const WindowShape& s, const float* dy, float* dx,
                     Write dx_write);

// y[n, c] = mean over `spatial` positions of x[n, p, c].
void GlobalAvgPoolForward(const CpuContext& ctx, int64_t batch, int64_t spatial, int64_t channels,
                          const float* x, float* y);

void GlobalAvgPoolBackward(const CpuContext& ctx, int64_t batch, int64_t spatial, int64_t channels,
                           const float* dy, float* dx, Write dx_write);

// ------------------------------------------------------- batch norm
// Over x[rows, channels] (rows = batch * height * width for an image), per
// channel: y = gamma * (x - mean) * inv_std + beta, inv_std = 1 / sqrt(var +
// epsilon). Training uses the batch's mean and (biased) variance, stores them
// as save_mean / save_inv_std for the backward, and moves the running
// statistics: running = momentum * running + (1 - momentum) * batch value,
// with the unbiased variance (rows / (rows - 1)) for running_var, as cuDNN and
// PyTorch do.
// REQUIRES: rows > 0, epsilon >= 1e-5 (cuDNN's floor).
void BatchNormForwardTraining(const CpuContext& ctx, int64_t rows, int64_t channels, const float* x,
                              const float* gamma, const float* beta, float epsilon, float momentum,
                              float* y, float* running_mean, float* running_var, float* save_mean,
                              float* save_inv_std);

// y with the given (running) mean and variance.
void BatchNormForwardInference(const CpuContext& ctx, int64_t rows, int64_t channels,
                               const float* x, const float* gamma, const float* beta,
                               const float* mean, const float* var, float epsilon, float* y);

// Gradients of BatchNormForwardTraining given dy and its saved statistics:
// dx (skipped when null), dgamma and dbeta.
void BatchNormBackward(const CpuContext& ctx, int64_t rows, int64_t channels, const float* x,
                       const float* dy, const float* gamma, const float* save_mean,
                       const float* save_inv_std, float* dx, Write dx_write, float* dgamma,
                       float* dbeta, Write param_write);

// ------------------------------------------------------- embedding
// y[i, :] = table[ids[i], :] for i < num_ids, table [vocab, dim]. Ids are
// integers stored as floats; one that is not an integer in [0, vocab) reads
// as a row of zeros (the caller reports it; see Model).
void EmbeddingForward(const CpuContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                      const float* ids, const float* table, float* y);

// dtable[ids[i], :] += dy[i, :] (after zeroing dtable for kOverwrite); ids
// outside the table contribute nothing.
void EmbeddingBackward(const CpuContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                       const float* ids, const float* dy, float* dtable, Write param_write);

// Sparse embeddings' pooling (kernels/types.h PooledTable): each table's
// slot of `features` (slot-major, `batch` examples) is the sum of the rows
// its examples read (times PoolScale), summed in id order from zero; and
// each row's gradient the sum over its reads of PoolScale times the reading
// example's slot gradient in `features_grad`, in kPoolLanes partial sums
// (kernels/types.h). The CUDA twins compute the same sums in the same order.
void PoolRows(const CpuContext& ctx, int64_t batch, int num_tables, const PooledTable* tables,
              float* features);
void PoolRowsBackward(const CpuContext& ctx, int num_tables, const PooledTable* tables,
                      const float* features_grad);

// x is [batch, vectors, dim]; y [batch, vectors * (vectors - 1) / 2] holds
// every pair's dot product <x_i, x_j>, i < j, in order (0,1), (0,2), ...,
// (0,v-1), (1,2), ... (DLRM's interaction). Backward overwrites dx:
// dx_i = sum over j != i of dy(i,j) x_j.
void PairwiseDotForward(const CpuContext& ctx, int64_t batch, int64_t vectors, int64_t dim,
                        const float* x, float* y);
void PairwiseDotBackward(const CpuContext& ctx, int64_t batch, int64_t vectors, int64_t dim,
                         const float* x, const float* dy, float* dx);

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CPU_LAYERS_H_
