// CUDA twin of kernels/cpu.h and kernels/optimizer.h: the same layer math on
// one GPU, over cuBLAS (GEMM, dense), cuDNN (convolution, batch norm) and our
// own kernels (element-wise ops, pooling, dropout, softmax cross-entropy,
// embedding, optimizers).
//
// Each function takes the arguments of its CPU twin, with a CudaContext in
// place of CpuContext; pointers name device memory of ctx.device (labels and
// ids included), except where a comment says host. Conv2d keeps its scratch in
// the context, so it has no workspace argument. Work is queued on ctx.stream
// and is asynchronous unless a comment says otherwise (SoftmaxCrossEntropy
// waits, because it returns the loss on the host).
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
// and weight gradients, statistics and optimizer state stay fp32. Dropout
// draws the same mask as the CPU twin for the same (seed, step).
//
// Thread safety: a CudaContext is used by one host thread at a time (its
// handles and workspace are not shared); distinct contexts are independent.
// A program that links this library starts and runs on a machine without a
// GPU; CudaDeviceCount() is then 0.
#ifndef DOWNPOUR_KERNELS_CUDA_H_
#define DOWNPOUR_KERNELS_CUDA_H_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cuda {

// Number of usable CUDA devices; 0 when there is no driver, no device, or the
// runtime reports any error (which it does on a machine without a GPU).
int CudaDeviceCount();
inline bool CudaAvailable() { return CudaDeviceCount() > 0; }

// Why no device is usable ("no CUDA device: <runtime message>"), or "" when
// one is. For logs and test skips.
std::string CudaUnavailableReason();

// The name of device `device` ("NVIDIA H100 80GB HBM3"), or "" on error.
std::string CudaDeviceName(int device);

// Memory layout GPU convolutions run in. Tensors are NHWC at the API either
// way; kNchw convolves transposed copies in the workspace. kAuto measures
// both per shape (transposes included) and keeps the faster.
enum class ConvLayout { kAuto, kNhwc, kNchw };

// What activations are stored in and dense layers and convolutions multiply
// in (see Numerics above).
enum class ComputePrecision { kFp32, kBf16, kFp16 };

// Per-shape cuDNN convolution plans (descriptors and algorithms), internal
// to cuda.cc.
struct ConvPlanCache;

// Reduced copies of registered weights (RegisterReducedWeights), internal to
// cuda.cc.
struct ReducedWeightCopies;

// One device's execution state: a non-blocking stream, cuBLAS and cuDNN
// handles bound to it, and a device workspace for cuDNN and the fused
// kernels. Owns everything it holds; not copyable.
//
// Convolutions cache a plan per WindowShape and precision: descriptors, and
// the fastest algorithm of each direction that fits the workspace (FMA math
// in fp32, in NHWC and in NCHW, and the faster layout; tensor-op math on the
// reduced NHWC tensors in bf16/fp16, beside the fp32 plan on converted
// copies where that is faster and small), measured by cudnnFind* the first
// time a shape is seen (as PyTorch's cudnn.benchmark; algorithms within 5%
// of the fastest count as ties and the one with the least workspace wins);
// later calls with that shape reuse it.
struct CudaContext {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  // Scratch of every call that needs some: the context's own, grown by
  // calls that need more (a convolution's algorithms are searched within
  // 2 GiB), or memory lent by the caller (LendWorkspace).
  mutable void* workspace = nullptr;
  mutable size_t workspace_bytes = 0;
  // The most workspace any call has asked for since the caller last set
  // this to 0 (callers plan memory with it).
  mutable size_t workspace_peak = 0;
  // Small device scratch for reductions returned to the host (loss, count).
  void* scratch = nullptr;
  // Filled lazily by Conv2dForward/Backward; mutable because those take the
  // context by const reference (it is still one thread's).
  mutable std::unique_ptr<ConvPlanCache> conv_plans;
  // Set by RegisterReducedWeights.
  std::unique_ptr<ReducedWeightCopies> reduced_weights;
  // Set before the first convolution of a shape (its plan keeps the choice).
  ConvLayout conv_layout = ConvLayout::kAuto;
  // Set before the first dense layer or convolution.
  ComputePrecision compute = ComputePrecision::kFp32;
  // Sets up a context on `device` with `workspace_bytes` of workspace.
  // FailedPrecondition when there is no such device.
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(int device,
                                                             size_t workspace_bytes = 64 << 20);
  CudaContext() = default;
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Waits for everything queued on the stream.
  absl::Status Synchronize() const;

  // Makes this context's device the calling thread's current device. The
  // kernels launch on the current device, so a thread other than the one that
  // created the context calls this first (one replica per GPU, each driven
  // from its own thread).
  absl::Status MakeCurrent() const;
  // Drops the cached convolution plans (the next call of a shape measures
  // again, in conv_layout).
  void ForgetConvPlans();

  // Lends `bytes` of device memory as the workspace until ReturnWorkspace:
  // a caller that plans its memory (a model's activation arena) gives each
  // call the scratch it measured. A call that needs more takes the
  // context's own workspace back (and grows it). The memory must stay valid
  // until the work queued with it has run.
  void LendWorkspace(void* memory, size_t bytes) const;
  void ReturnWorkspace() const;
  // Frees the context's own workspace (waits for queued work); the next
  // call that needs one allocates it again.
  absl::Status ReleaseWorkspace();
  // Bytes of the context's own workspace (not counting a lent one).
  size_t owned_workspace_bytes() const;
  bool workspace_is_lent() const { return workspace_lent; }

 private:
  mutable bool workspace_lent = false;
  mutable void* own_workspace = nullptr;  // Put aside while lent.
  mutable size_t own_workspace_bytes = 0;
};

// bf16/fp16 contexts: keeps one reduced copy of each fp32 device range in
// `ranges` (start, elements), so that DenseForward/Backward and
// Conv2dForward/Backward read the copy of a weight that starts a registered
// range instead of casting it at every op. Replaces an earlier registration;
// does nothing in fp32 contexts.
// REQUIRES: CastReducedWeights after every change of the ranges' values and
// before the next op that reads them; the ranges outlive the registration.
absl::Status RegisterReducedWeights(CudaContext& ctx,
                                    const std::vector<std::pair<const float*, int64_t>>& ranges);
// Refreshes every registered copy from its fp32 range (one kernel).
absl::Status CastReducedWeights(const CudaContext& ctx);
// Device bytes the registered copies take.
size_t ReducedWeightBytes(const CudaContext& ctx);

// Diagnostics: when on, every convolution plan prints its measured
// algorithms (algo, ms, workspace bytes, math type, status) and its choice
// to stderr the first time a shape is seen. Process-wide; off by default.
void SetConvPlanLogging(bool on);

// ------------------------------------------------------- activations
//
// `T` is the element type of activations and their gradients (x, y, dx, dy
// below): float in an fp32 context, __nv_bfloat16 in a bf16 one, __half in
// an fp16 one (the functions that multiply, dense and conv2d, say
// InvalidArgument when T does not match ctx.compute). Weights, biases, their
// gradients and every statistic stay fp32. Each template is instantiated for
// the three types in cuda.cc.

// y = x converted from S to D (any of the three types), n elements.
template <typename S, typename D>
absl::Status Convert(const CudaContext& ctx, int64_t n, const S* x, D* y);

// ------------------------------------------------------- dense and element-wise

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

// `stats` is host memory; waits for the stream.
absl::Status SoftmaxCrossEntropy(const CudaContext& ctx, int64_t batch, int64_t classes,
                                 const float* logits, const int32_t* labels, float* dlogits,
                                 LossStats* stats);

// As SoftmaxCrossEntropy, without waiting: adds the batch's loss sum and
// correct count to the device counters *loss_sum and *correct (which the
// caller zeroes and reads back when it wants them). dlogits (when not null)
// are multiplied by `dlogits_scale` (FP16 loss scaling) before rounding.
template <typename T>
absl::Status SoftmaxCrossEntropyAsync(const CudaContext& ctx, int64_t batch, int64_t classes,
                                      const T* logits, const int32_t* labels, T* dlogits,
                                      float dlogits_scale, double* loss_sum,
                                      unsigned long long* correct);

template <typename T>
absl::Status CopyOrAdd(const CudaContext& ctx, int64_t n, const T* x, T* y, Write write);

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
// fp32: the faster of NHWC and NCHW per shape (see CudaContext). bf16/fp16:
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

// ------------------------------------------------------- optimizers

// ApplyOptimizer of kernels/optimizer.h on device arrays; `slots` is a host
// array of NumOptimizerSlots(kind) device pointers.
absl::Status ApplyOptimizer(const CudaContext& ctx, OptimizerKind kind,
                            const OptimizerHyperparams& hp, const float* grad, int64_t n,
                            float* param, float* const* slots);

// One tensor of a fused update: device pointers, NumOptimizerSlots(kind)
// slots used.
struct TensorUpdate {
  const float* grad = nullptr;
  float* param = nullptr;
  float* slots[2] = {nullptr, nullptr};
  int64_t n = 0;
};

// The same update on every tensor in one kernel launch (the descriptors
// travel through the context's workspace). Same hyperparameters for all.
absl::Status ApplyOptimizerMultiTensor(const CudaContext& ctx, OptimizerKind kind,
                                       const OptimizerHyperparams& hp,
                                       const std::vector<TensorUpdate>& tensors);

// A fused update over a fixed set of tensors (a model's parameters): the
// descriptors are uploaded once at Create, so each Apply is one kernel
// launch with no host-to-device copy and no synchronisation. Owns its device
// arrays; the tensors' memory must outlive it.
class MultiTensorPlan {
 public:
  static absl::StatusOr<std::unique_ptr<MultiTensorPlan>> Create(
      const CudaContext& ctx, const std::vector<TensorUpdate>& tensors);
  ~MultiTensorPlan();
  MultiTensorPlan(const MultiTensorPlan&) = delete;
  MultiTensorPlan& operator=(const MultiTensorPlan&) = delete;

  // Queues the update on ctx.stream. REQUIRES: the slots each tensor needs
  // for `kind` were given at Create.
  absl::Status Apply(const CudaContext& ctx, OptimizerKind kind,
                     const OptimizerHyperparams& hp) const;

 private:
  MultiTensorPlan() = default;
  void* device_ = nullptr;  // Descriptors, chunk starts, chunk tensors.
  size_t desc_bytes_ = 0, start_bytes_ = 0;
  int64_t num_chunks_ = 0;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_H_
