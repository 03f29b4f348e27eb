// CPU reference kernels: the layer math of a model as pure functions of
// (context, sizes, pointers), over OpenBLAS for the matrix products.
//
// Every kernel here has, or will have, a CUDA twin in kernels::cuda with the
// same parameters except the context (a stream and cuBLAS/cuDNN handles in
// place of CpuContext), and the tests compare the two. Tensors are dense,
// row-major; activations are [batch, features]; a dense layer's weight is
// [in, out]. Pointers name memory of the context's device (host memory here).
//
// Thread safety: the kernels keep no state; concurrent calls on disjoint
// outputs are safe. OpenBLAS's thread count is process-wide (SetCpuThreads).
// Ownership: kernels never allocate or free the memory they are given.
//
// Inputs are not checked: the caller validates on the host before the call
// (see each REQUIRES). Sizes must fit in a 32-bit int where BLAS sees them.
#ifndef DOWNPOUR_KERNELS_CPU_H_
#define DOWNPOUR_KERNELS_CPU_H_

#include <cstdint>

#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cpu {

// Where a CPU kernel runs. Empty today; it is the slot where the CUDA twin
// takes its stream and library handles, so call sites look the same.
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

// Sets x[0, n) to zero.
void Zero(const CpuContext& ctx, int64_t n, float* x);

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CPU_H_
