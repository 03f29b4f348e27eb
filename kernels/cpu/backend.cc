#include "kernels/cpu/backend.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/layers.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/memory_cap.h"

namespace downpour {
namespace kernels {
namespace cpu {
namespace {

void* AlignedOrNull(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }

absl::StatusOr<DeviceMemory> AllocateAligned(size_t bytes) {
  if (bytes == 0) return DeviceMemory();
  void* ptr = AlignedOrNull(bytes);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
  return DeviceMemory(ptr, bytes, &std::free);
}

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(const BackendOptions& options) : cap_(CapFor(options, "cpu")) {}

#define DOWNPOUR_CPU_OP(name, params, args) \
  absl::Status name params override {       \
    cpu::name(ctx_, DOWNPOUR_UNPAREN args); \
    return absl::OkStatus();                \
  }
  DOWNPOUR_BACKEND_OPS(DOWNPOUR_CPU_OP)
#undef DOWNPOUR_CPU_OP

  absl::Status Conv2dForward(const WindowShape& s, Act x, const float* w, const float* bias, Act y,
                             bool relu) override {
    cpu::Conv2dForward(ctx_, s, x, w, bias, y, Workspace(s));
    if (relu) cpu::ReluForward(ctx_, s.batch * s.out_elements(), y, y);
    return absl::OkStatus();
  }
  absl::Status Conv2dBackward(const WindowShape& s, Act x, const float* w, Act dy, Act dx,
                              Write dx_write, float* dw, float* dbias, Write param_write) override {
    cpu::Conv2dBackward(ctx_, s, x, w, dy, dx, dx_write, dw, dbias, param_write, Workspace(s));
    return absl::OkStatus();
  }
  absl::Status ResetLoss() override {
    loss_ = LossStats();
    return absl::OkStatus();
  }
  absl::Status SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                   const int32_t* labels, Act dlogits,
                                   float dlogits_scale) override {
    LossStats stats;
    float* grad = dlogits;
    cpu::SoftmaxCrossEntropy(ctx_, batch, classes, logits, labels, grad, &stats);
    if (grad != nullptr && dlogits_scale != 1.f) {
      for (int64_t i = 0; i < batch * classes; ++i) grad[i] *= dlogits_scale;
    }
    loss_.loss_sum += stats.loss_sum;
    loss_.correct += stats.correct;
    return absl::OkStatus();
  }
  absl::StatusOr<LossStats> ReadLoss() override { return loss_; }
  absl::Status UnscaleCheckFinite(int64_t n, float inv_scale, float* g) override {
    for (int64_t i = 0; i < n; ++i) {
      non_finite_ |= !std::isfinite(g[i]);
      g[i] *= inv_scale;
    }
    return absl::OkStatus();
  }
  absl::Status ResetNonFinite() override {
    non_finite_ = false;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> ReadNonFinite() override { return non_finite_; }

  absl::Status PoolRows(int64_t batch, int num_tables, const PooledTable* tables,
                        int64_t /*most_work*/, float* features) override {
    cpu::PoolRows(ctx_, batch, num_tables, tables, features);
    return absl::OkStatus();
  }
  absl::Status PoolRowsBackward(int num_tables, const PooledTable* tables, int64_t /*most_work*/,
                                const float* features_grad) override {
    cpu::PoolRowsBackward(ctx_, num_tables, tables, features_grad);
    return absl::OkStatus();
  }
  int device() const override { return -1; }
  size_t activation_bytes() const override { return sizeof(float); }
  absl::Status ToActivations(int64_t n, const float* x, Act y) override {
    float* out = y;
    if (out != x) std::memcpy(out, x, sizeof(float) * n);
    return absl::OkStatus();
  }
  absl::Status ZeroFloats(int64_t n, float* x) override {
    cpu::Zero(ctx_, n, x);
    return absl::OkStatus();
  }
  void ResetWorkspacePeak() override {}
  int64_t WorkspacePeak() const override { return 0; }
  void LendWorkspace(void* /*memory*/, size_t /*bytes*/) override {}
  void ReturnWorkspace() override {}
  absl::Status ReleaseWorkspace() override { return absl::OkStatus(); }
  int64_t workspace_bytes() const override { return 0; }
  int64_t weight_copy_bytes() const override { return 0; }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }
  // Counted against the memory limit; AllocateHost's blocks (staging) are not.
  absl::StatusOr<DeviceMemory> Allocate(size_t bytes) override {
    if (bytes == 0) return DeviceMemory();
    RETURN_IF_ERROR(cap_->Take(bytes, 0));
    void* ptr = AlignedOrNull(bytes);
    if (ptr == nullptr) {
      cap_->Give(bytes);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    }
    return cap_->Track(ptr, bytes, &std::free);
  }
  absl::StatusOr<DeviceMemory> AllocateHost(size_t bytes) override {
    return AllocateAligned(bytes);
  }
  absl::Status ToDevice(void* device, const void* host, size_t bytes) override {
    if (device != host) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    if (device != host) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status UploadAside(void* device, const void* host, size_t bytes) override {
    return ToDevice(device, host, bytes);
  }
  absl::Status JoinUploads() override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> DownloadAside(void* host, const void* device, size_t bytes) override {
    if (device != host) std::memcpy(host, device, bytes);
    return 0;
  }
  absl::Status WaitDownload(int64_t) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                              const std::vector<TensorUpdate>& tensors) override {
    for (const TensorUpdate& t : tensors) {
      cpu::ApplyOptimizer(kind, hp, t.grad, t.n, t.param, t.slots);
    }
    return absl::OkStatus();
  }
  absl::Status RegisterReducedWeights(
      const std::vector<std::pair<const float*, int64_t>>& /*ranges*/) override {
    return absl::OkStatus();
  }
  absl::Status CastReducedWeights() override { return absl::OkStatus(); }
  absl::Status CastReducedWeight(const float*) override { return absl::OkStatus(); }
  absl::Status Mark(int slot) override {
    if (static_cast<size_t>(slot) >= marks_.size()) marks_.resize(slot + 1);
    marks_[slot] = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }
  absl::StatusOr<double> MarkMs(int from, int to) override {
    return std::chrono::duration<double, std::milli>(marks_.at(to) - marks_.at(from)).count();
  }

 private:
  float* Workspace(const WindowShape& s) {
    const size_t need = static_cast<size_t>(cpu::Conv2dWorkspaceElements(s));
    if (workspace_.size() < need) workspace_.resize(need);
    return workspace_.data();
  }

  const std::shared_ptr<MemoryCap> cap_;
  CpuContext ctx_;
  std::vector<float> workspace_;  // im2col scratch, shared by every conv2d.
  LossStats loss_;
  bool non_finite_ = false;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<ComputeBackend> CreateCpuBackend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour
