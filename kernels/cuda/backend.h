// The CUDA compute backend: ComputeBackend (kernels/backend.h) over one GPU,
// its ops those of layers.h and optimizer.h on a CudaContext. Work is queued
// on the context's stream and runs asynchronously; input batches go up on a
// second, copy stream (UploadAside) that the compute stream waits for at
// JoinUploads. Activations are fp32, or bf16/fp16 where the options ask for
// that precision (weights, gradients and statistics stay fp32).
//
// Created through kernels/factory.h (or CreateCudaBackend on a device that
// exists). Thread-compatible, as every backend: one host thread at a time,
// and a thread other than the creating one calls MakeCurrent first.
// Ownership: the backend owns its context, its copy stream, its loss and
// non-finite counters and its cached optimizer plan; memory it allocates is
// the caller's (DeviceMemory) and must not outlive it.
#ifndef DOWNPOUR_KERNELS_CUDA_BACKEND_H_
#define DOWNPOUR_KERNELS_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/memory_cap.h"

namespace downpour {
namespace kernels {
namespace cuda {

class CudaBackend final : public ComputeBackend {
 public:
  // A backend on options.device, with a 16 MiB workspace to start with
  // (convolutions grow it to what their fastest algorithms need), and
  // options.device left the calling thread's current device.
  // FailedPrecondition when there is no such device.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

#define DOWNPOUR_CUDA_DECLARE_OP(name, params, args) absl::Status name params override;
  DOWNPOUR_BACKEND_OPS(DOWNPOUR_CUDA_DECLARE_OP)
#undef DOWNPOUR_CUDA_DECLARE_OP

  absl::Status Conv2dForward(const WindowShape& s, Act x, const float* w, const float* bias, Act y,
                             bool relu) override;
  absl::Status Conv2dBackward(const WindowShape& s, Act x, const float* w, Act dy, Act dx,
                              Write dx_write, float* dw, float* dbias, Write param_write) override;
  absl::Status ResetLoss() override;
  absl::Status SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                   const int32_t* labels, Act dlogits,
                                   float dlogits_scale) override;
  absl::StatusOr<LossStats> ReadLoss() override;
  absl::Status UnscaleCheckFinite(int64_t n, float inv_scale, float* g) override;
  absl::Status ResetNonFinite() override;
  absl::StatusOr<bool> ReadNonFinite() override;

  int device() const override { return ctx_->device; }
  size_t activation_bytes() const override;
  absl::Status ToActivations(int64_t n, const float* x, Act y) override;
  absl::Status ZeroFloats(int64_t n, float* x) override;
  absl::Status PoolRows(int64_t batch, int num_tables, const PooledTable* tables, int64_t most_work,
                        float* features) override;
  absl::Status PoolRowsBackward(int num_tables, const PooledTable* tables, int64_t most_work,
                                const float* features_grad) override;
  void ResetWorkspacePeak() override { ctx_->workspace_peak = 0; }
  int64_t WorkspacePeak() const override { return static_cast<int64_t>(ctx_->workspace_peak); }
  void LendWorkspace(void* memory, size_t bytes) override { ctx_->LendWorkspace(memory, bytes); }
  void ReturnWorkspace() override { ctx_->ReturnWorkspace(); }
  absl::Status ReleaseWorkspace() override { return ctx_->ReleaseWorkspace(); }
  int64_t workspace_bytes() const override;
  int64_t weight_copy_bytes() const override;
  absl::Status MakeCurrent() override { return ctx_->MakeCurrent(); }
  absl::StatusOr<DeviceMemory> Allocate(size_t bytes) override;
  absl::StatusOr<DeviceMemory> AllocateHost(size_t bytes) override;
  absl::Status ToDevice(void* device, const void* host, size_t bytes) override;
  absl::Status ToHost(void* host, const void* device, size_t bytes) override;
  absl::Status UploadAside(void* device, const void* host, size_t bytes) override;
  absl::Status JoinUploads() override;
  absl::StatusOr<int64_t> DownloadAside(void* host, const void* device, size_t bytes) override;
  absl::Status WaitDownload(int64_t ticket) override;
  absl::Status Synchronize() override { return ctx_->Synchronize(); }
  absl::Status ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                              const std::vector<TensorUpdate>& tensors) override;
  absl::Status RegisterReducedWeights(
      const std::vector<std::pair<const float*, int64_t>>& ranges) override;
  absl::Status CastReducedWeights() override;
  absl::Status CastReducedWeight(const float* w) override;
  absl::Status Mark(int slot) override;
  absl::StatusOr<double> MarkMs(int from, int to) override;

  // The context the ops run on: its stream is where collectives
  // (collectives.h) queue this device's part, in order with the ops.
  CudaContext& context() { return *ctx_; }
  const CudaContext& context() const { return *ctx_; }

 private:
  CudaBackend() = default;
  int* Flag() { return reinterpret_cast<int*>(counters_.as<char>() + 16); }
  bool SameTensors(const std::vector<TensorUpdate>& tensors) const;

  // BackendOptions::memory_limit's accounting; declared before every block
  // it counts.
  std::shared_ptr<MemoryCap> cap_;
  std::unique_ptr<CudaContext> ctx_;
  DeviceMemory counters_;       // double loss sum, uint64 correct, int non-finite flag.
  DeviceMemory counters_host_;  // Page-locked, for ReadLoss and ReadNonFinite.
  // UploadAside's stream, and the event JoinUploads records on it.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;
  // DownloadAside's stream; the event marking the compute stream's place
  // for it; a ring of events recorded after each download (ticket t is
  // downloaded_[t % size], waited for before the ring comes round again).
  cudaStream_t download_stream_ = nullptr;
  cudaEvent_t download_mark_ = nullptr;
  std::vector<cudaEvent_t> downloaded_;
  std::atomic<int64_t> next_ticket_{0};
  std::unique_ptr<MultiTensorPlan> plan_;
  std::vector<TensorUpdate> plan_tensors_;  // What plan_ was made for.
  std::vector<cudaEvent_t> marks_;
};

// CudaBackend::Create as the interface kernels/factory.h returns.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_BACKEND_H_
