// The CUDA devices of this process and the execution state of one of them.
//
// CudaContext: a non-blocking stream, cuBLAS and cuDNN handles bound to it,
// and a device workspace for cuDNN and our fused kernels; every op of
// kernels/cuda (layers.h, optimizer.h) takes one and queues its work on the
// stream. It also keeps what the ops cache per device: the convolution plans
// (conv_plan.h) and the reduced weight copies (weights.h).
//
// Thread safety: a CudaContext is used by one host thread at a time (its
// handles and workspace are not shared); distinct contexts are independent.
// The device queries are thread-safe. A program that links this library
// starts and runs on a machine without a GPU; CudaDeviceCount() is then 0.
//
// Ownership: a context owns its stream, handles, workspace (not a lent one)
// and caches, and frees them when destroyed, after its queued work has run.
#ifndef DOWNPOUR_KERNELS_CUDA_CONTEXT_H_
#define DOWNPOUR_KERNELS_CUDA_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cuda {

// Number of usable CUDA devices; 0 when there is no driver, no device, or the
// runtime reports any error (which it does on a machine without a GPU).
int CudaDeviceCount();

// Why no device is usable ("no CUDA device: <runtime message>"), or "" when
// one is. For logs and test skips.
std::string CudaUnavailableReason();

// The name of device `device` ("NVIDIA H100 80GB HBM3"), or "" on error.
std::string CudaDeviceName(int device);

// Per-shape cuDNN convolution plans (conv_plan.h).
struct ConvPlanCache;

// Reduced copies of registered weights (weights.h).
struct ReducedWeightCopies;

// Convolutions cache a plan per WindowShape, precision and TF32 policy:
// descriptors, and the fastest algorithm of each direction that fits the
// workspace (fp32: FMA math, or FMA and TF32 tensor-op math where `tf32`
// allows convolutions, in NHWC and in NCHW, and the faster layout; tensor-op
// math on the reduced NHWC tensors in bf16/fp16, beside the fp32 plan on
// converted copies where that is faster and small), measured by cudnnFind*
// the first time a shape is seen (as PyTorch's cudnn.benchmark; algorithms
// within 5% of the fastest count as ties and the one with the least
// workspace wins), then timed beside the engines of cuDNN's graph API where
// conv_graph allows (conv_graph.h; not for fp16 tensors), the faster kept
// per direction; later calls with that shape reuse it.
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
  // The caches are held through shared_ptr only so that their types can
  // stay incomplete here (the deleter is bound where each is made); the
  // context is their one owner.
  // Filled lazily by Conv2dForward/Backward; mutable because those take the
  // context by const reference (it is still one thread's).
  mutable std::shared_ptr<ConvPlanCache> conv_plans;
  // Set by RegisterReducedWeights.
  std::shared_ptr<ReducedWeightCopies> reduced_weights;
  // Set before the first convolution of a shape (its plan keeps the choice).
  ConvLayout conv_layout = ConvLayout::kAuto;
  // Set before the first convolution of a shape: whether its plan may run
  // a direction through cuDNN's graph API where that timed faster than the
  // legacy algorithms (conv_graph.h). Off: the legacy API only.
  bool conv_graph = true;
  // Set before the first dense layer or convolution.
  ComputePrecision compute = ComputePrecision::kFp32;
  // Where fp32 products may use TF32 tensor cores: convolutions (read when
  // a shape's plan is made; plans are kept per policy) and GEMMs (read by
  // each call). The default is PyTorch's; tests that compare fp32 results
  // with the CPU twin set kOff.
  Tf32Policy tf32 = Tf32Policy::kConvolutions;
  // Sets up a context on `device` with `workspace_bytes` of workspace, and
  // leaves `device` the calling thread's current device. FailedPrecondition
  // when there is no such device.
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

// Grows ctx's workspace to at least `bytes` (waiting for queued work, which
// may still use the old one); a lent one too small is given back first.
// Notes `bytes` in ctx.workspace_peak either way.
absl::Status EnsureWorkspace(const CudaContext& ctx, size_t bytes);

// Bytes rounded up so that sub-buffers of the workspace stay aligned.
inline size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Aligned bytes of `elements` bf16/fp16 values.
inline size_t Reduced16Bytes(int64_t elements) {
  return Aligned(2 * static_cast<size_t>(elements));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_CONTEXT_H_
