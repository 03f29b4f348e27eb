#include "kernels/cuda/optimizer.h"

#include <cstring>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/status.h"

namespace downpour {
namespace kernels {
namespace cuda {

absl::Status ApplyOptimizer(const CudaContext& ctx, OptimizerKind kind,
                            const OptimizerHyperparams& hp, const float* grad, int64_t n,
                            float* param, float* const* slots) {
  TensorUpdate t;
  t.grad = grad;
  t.param = param;
  t.n = n;
  for (int i = 0; i < NumOptimizerSlots(kind); ++i) t.slots[i] = slots[i];
  return ApplyOptimizerMultiTensor(ctx, kind, hp, {t});
}

namespace {

namespace k = internal;

k::OptimizerArgs ResolveArgs(OptimizerKind kind, const OptimizerHyperparams& hp) {
  k::OptimizerArgs args;
  args.kind = static_cast<int>(kind);
  args.lr = hp.learning_rate;
  args.momentum = hp.momentum;
  args.beta1 = hp.beta1;
  args.beta2 = hp.beta2;
  args.epsilon = hp.epsilon;
  args.weight_decay = hp.weight_decay;
  const AdamCorrections c = AdamBiasCorrections(hp);
  args.adam_step_size = c.step_size;
  args.adam_inv_sqrt_bc2 = c.inv_sqrt_bc2;
  return args;
}

// The descriptors of `tensors` and their chunks, packed as one host buffer:
// descriptors, then chunk starts, then chunk tensors.
struct PackedUpdate {
  std::vector<char> host;
  size_t desc_bytes = 0, start_bytes = 0;
  int64_t num_chunks = 0;
};

PackedUpdate Pack(const std::vector<TensorUpdate>& tensors) {
  PackedUpdate packed;
  std::vector<k::OptimizerTensor> descs;
  std::vector<int32_t> chunk_tensor;
  std::vector<int64_t> chunk_start;
  for (const TensorUpdate& u : tensors) {
    if (u.n <= 0) continue;
    const int32_t index = static_cast<int32_t>(descs.size());
    descs.push_back({u.grad, u.param, u.slots[0], u.slots[1], u.n});
    for (int64_t start = 0; start < u.n; start += k::kOptimizerChunk) {
      chunk_tensor.push_back(index);
      chunk_start.push_back(start);
    }
  }
  if (descs.empty()) return packed;
  const size_t desc_bytes = Aligned(descs.size() * sizeof(k::OptimizerTensor));
  const size_t start_bytes = Aligned(chunk_start.size() * sizeof(int64_t));
  const size_t tensor_bytes = chunk_tensor.size() * sizeof(int32_t);
  std::vector<char>& host = packed.host;
  host.resize(desc_bytes + start_bytes + tensor_bytes);
  std::memcpy(host.data(), descs.data(), descs.size() * sizeof(k::OptimizerTensor));
  std::memcpy(host.data() + desc_bytes, chunk_start.data(), chunk_start.size() * sizeof(int64_t));
  std::memcpy(host.data() + desc_bytes + start_bytes, chunk_tensor.data(), tensor_bytes);
  packed.desc_bytes = desc_bytes;
  packed.start_bytes = start_bytes;
  packed.num_chunks = static_cast<int64_t>(chunk_start.size());
  return packed;
}

}  // namespace

absl::Status ApplyOptimizerMultiTensor(const CudaContext& ctx, OptimizerKind kind,
                                       const OptimizerHyperparams& hp,
                                       const std::vector<TensorUpdate>& tensors) {
  const k::OptimizerArgs args = ResolveArgs(kind, hp);
  const PackedUpdate packed = Pack(tensors);
  if (packed.num_chunks == 0) return absl::OkStatus();
  const std::vector<char>& host = packed.host;
  const size_t total = host.size();
  const size_t desc_bytes = packed.desc_bytes, start_bytes = packed.start_bytes;
  RETURN_IF_ERROR(EnsureWorkspace(ctx, total));
  char* device = static_cast<char*>(ctx.workspace);
  // From pageable memory the copy has read `host` when it returns.
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host.data(), total, cudaMemcpyHostToDevice, ctx.stream));
  return FromCuda(k::MultiTensorUpdate(
                      ctx.stream, args, reinterpret_cast<const k::OptimizerTensor*>(device),
                      reinterpret_cast<const int32_t*>(device + desc_bytes + start_bytes),
                      reinterpret_cast<const int64_t*>(device + desc_bytes), packed.num_chunks),
                  "MultiTensorUpdate");
}

absl::StatusOr<std::unique_ptr<MultiTensorPlan>> MultiTensorPlan::Create(
    const CudaContext& ctx, const std::vector<TensorUpdate>& tensors) {
  const PackedUpdate packed = Pack(tensors);
  std::unique_ptr<MultiTensorPlan> plan(new MultiTensorPlan());
  plan->desc_bytes_ = packed.desc_bytes;
  plan->start_bytes_ = packed.start_bytes;
  plan->num_chunks_ = packed.num_chunks;
  if (packed.num_chunks == 0) return plan;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx.device));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->device_, packed.host.size()));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(plan->device_, packed.host.data(), packed.host.size(), cudaMemcpyHostToDevice));
  return plan;
}

MultiTensorPlan::~MultiTensorPlan() {
  if (device_ != nullptr) cudaFree(device_);
}

absl::Status MultiTensorPlan::Apply(const CudaContext& ctx, OptimizerKind kind,
                                    const OptimizerHyperparams& hp) const {
  if (num_chunks_ == 0) return absl::OkStatus();
  const char* device = static_cast<const char*>(device_);
  return FromCuda(
      k::MultiTensorUpdate(ctx.stream, ResolveArgs(kind, hp),
                           reinterpret_cast<const k::OptimizerTensor*>(device),
                           reinterpret_cast<const int32_t*>(device + desc_bytes_ + start_bytes_),
                           reinterpret_cast<const int64_t*>(device + desc_bytes_), num_chunks_),
      "MultiTensorUpdate");
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
