// CUDA twin of kernels/cpu/optimizer.h: the optimizer updates of
// kernels/optimizer.h on device arrays, fused into one kernel launch over
// many tensors (kernels::TensorUpdate, device pointers). The same update
// per element as the CPU reference, in fp32.
//
// Thread safety: as the context (one host thread at a time). Ownership: the
// updates own nothing they are given; a MultiTensorPlan owns its device
// arrays of descriptors.
#ifndef DOWNPOUR_KERNELS_CUDA_OPTIMIZER_H_
#define DOWNPOUR_KERNELS_CUDA_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/context.h"
#include "kernels/optimizer.h"

namespace downpour {
namespace kernels {
namespace cuda {

// ApplyOptimizer of kernels/cpu/optimizer.h on device arrays; `slots` is a
// host array of NumOptimizerSlots(kind) device pointers.
absl::Status ApplyOptimizer(const CudaContext& ctx, OptimizerKind kind,
                            const OptimizerHyperparams& hp, const float* grad, int64_t n,
                            float* param, float* const* slots);

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

#endif  // DOWNPOUR_KERNELS_CUDA_OPTIMIZER_H_
