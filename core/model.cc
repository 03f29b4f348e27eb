#include "core/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "kernels/cuda.h"
#include "kernels/optimizer.h"

namespace downpour {
namespace model_internal {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::Write;

// Owned memory of one kind: plain host, page-locked host (fast, asynchronous
// copies to and from a GPU) or device. Move-only.
class Memory {
 public:
  enum class Kind { kHost, kPinned, kDevice };

  static absl::StatusOr<Memory> Allocate(Kind kind, size_t bytes) {
    Memory m;
    m.kind_ = kind;
    m.bytes_ = bytes;
    if (bytes == 0) return m;
    switch (kind) {
      case Kind::kHost:
        m.ptr_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (m.ptr_ == nullptr) return absl::ResourceExhaustedError("out of host memory");
        break;
      case Kind::kPinned:
        if (cudaMallocHost(&m.ptr_, bytes) != cudaSuccess) {
          cudaGetLastError();
          return absl::ResourceExhaustedError(
              absl::StrCat("cannot allocate ", bytes, " bytes of pinned host memory"));
        }
        break;
      case Kind::kDevice:
        if (cudaMalloc(&m.ptr_, bytes) != cudaSuccess) {
          cudaGetLastError();
          return absl::ResourceExhaustedError(
              absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory"));
        }
        break;
    }
    return m;
  }

  Memory() = default;
  Memory(Memory&& other) noexcept { *this = std::move(other); }
  Memory& operator=(Memory&& other) noexcept {
    if (this != &other) {
      Release();
      kind_ = other.kind_;
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~Memory() { Release(); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Release() {
    if (ptr_ == nullptr) return;
    switch (kind_) {
      case Kind::kHost:
        std::free(ptr_);
        break;
      case Kind::kPinned:
        cudaFreeHost(ptr_);
        break;
      case Kind::kDevice:
        cudaFree(ptr_);
        break;
    }
    ptr_ = nullptr;
  }

  Kind kind_ = Kind::kHost;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// An activation tensor or its gradient in the compute memory: floats on the
// CPU and in fp32, the reduced type on a GPU computing in bf16/fp16 (see
// kernels/cuda.h). The backend knows which (Ops::activation_bytes), so an
// Act converts to whatever element pointer the backend's kernel takes.
class Act {
 public:
  Act() = default;
  Act(std::nullptr_t) {}  // NOLINT: a null activation, as a null pointer.
  explicit Act(const void* p) : p_(const_cast<void*>(p)) {}
  template <typename T>
  operator T*() const {  // NOLINT: the point of the class.
    return static_cast<T*>(p_);
  }
  bool operator==(std::nullptr_t) const { return p_ == nullptr; }
  bool operator!=(std::nullptr_t) const { return p_ != nullptr; }

 private:
  void* p_ = nullptr;
};

// The kernels with the same arguments on both backends (kernels/cpu.h and
// kernels/cuda.h, less the context): X(name, parameters, arguments).
#define DOWNPOUR_MODEL_OPS(X)                                                                      \
  X(DenseForward,                                                                                  \
    (int64_t batch, int64_t in, int64_t out, Act x, const float* w, const float* bias, Act y),     \
    (batch, in, out, x, w, bias, y))                                                               \
  X(DenseBackward,                                                                                 \
    (int64_t batch, int64_t in, int64_t out, Act x, const float* w, Act dy, Act dx,                \
     Write dx_write, float* dw, float* dbias, Write param_write),                                  \
    (batch, in, out, x, w, dy, dx, dx_write, dw, dbias, param_write))                              \
  X(ReluForward, (int64_t n, Act x, Act y), (n, x, y))                                             \
  X(ReluBackward, (int64_t n, Act y, Act dy, Act dx, Write dx_write), (n, y, dy, dx, dx_write))    \
  X(DropoutForward,                                                                                \
    (int64_t n, float rate, uint64_t seed, uint64_t step, Act x, Act y, uint8_t* mask),            \
    (n, rate, seed, step, x, y, mask))                                                             \
  X(DropoutBackward, (int64_t n, float rate, const uint8_t* mask, Act dy, Act dx, Write dx_write), \
    (n, rate, mask, dy, dx, dx_write))                                                             \
  X(CopyOrAdd, (int64_t n, Act x, Act y, Write write), (n, x, y, write))                           \
  X(Zero, (int64_t n, Act x), (n, x))                                                              \
  X(Add, (int64_t n, Act a, Act b, Act y), (n, a, b, y))                                           \
  X(MaxPoolForward, (const kernels::WindowShape& s, Act x, Act y), (s, x, y))                      \
  X(MaxPoolBackward, (const kernels::WindowShape& s, Act x, Act dy, Act dx, Write dx_write),       \
    (s, x, dy, dx, dx_write))                                                                      \
  X(AvgPoolForward, (const kernels::WindowShape& s, Act x, Act y), (s, x, y))                      \
  X(AvgPoolBackward, (const kernels::WindowShape& s, Act dy, Act dx, Write dx_write),              \
    (s, dy, dx, dx_write))                                                                         \
  X(GlobalAvgPoolForward, (int64_t batch, int64_t spatial, int64_t channels, Act x, Act y),        \
    (batch, spatial, channels, x, y))                                                              \
  X(GlobalAvgPoolBackward,                                                                         \
    (int64_t batch, int64_t spatial, int64_t channels, Act dy, Act dx, Write dx_write),            \
    (batch, spatial, channels, dy, dx, dx_write))                                                  \
  X(BatchNormForwardTraining,                                                                      \
    (int64_t rows, int64_t channels, Act x, const float* gamma, const float* beta, float epsilon,  \
     float momentum, Act y, float* running_mean, float* running_var, float* save_mean,             \
     float* save_inv_std),                                                                         \
    (rows, channels, x, gamma, beta, epsilon, momentum, y, running_mean, running_var, save_mean,   \
     save_inv_std))                                                                                \
  X(BatchNormForwardInference,                                                                     \
    (int64_t rows, int64_t channels, Act x, const float* gamma, const float* beta,                 \
     const float* mean, const float* var, float epsilon, Act y),                                   \
    (rows, channels, x, gamma, beta, mean, var, epsilon, y))                                       \
  X(BatchNormBackward,                                                                             \
    (int64_t rows, int64_t channels, Act x, Act dy, const float* gamma, const float* save_mean,    \
     const float* save_inv_std, Act dx, Write dx_write, float* dgamma, float* dbeta,               \
     Write param_write),                                                                           \
    (rows, channels, x, dy, gamma, save_mean, save_inv_std, dx, dx_write, dgamma, dbeta,           \
     param_write))                                                                                 \
  X(EmbeddingForward,                                                                              \
    (int64_t num_ids, int64_t vocab, int64_t dim, const float* ids, const float* table, Act y),    \
    (num_ids, vocab, dim, ids, table, y))                                                          \
  X(EmbeddingBackward,                                                                             \
    (int64_t num_ids, int64_t vocab, int64_t dim, const float* ids, Act dy, float* dtable,         \
     Write param_write),                                                                           \
    (num_ids, vocab, dim, ids, dy, dtable, param_write))

#define DOWNPOUR_UNPAREN(...) __VA_ARGS__

// The kernels of one device, its memory and its copies: what a Model and its
// layers run on. The CPU backend runs everything at once; the CUDA backend
// queues work on its context's stream (see kernels/cuda.h).
class Ops {
 public:
  virtual ~Ops() = default;

#define DOWNPOUR_DECLARE_OP(name, params, args) virtual absl::Status name params = 0;
  DOWNPOUR_MODEL_OPS(DOWNPOUR_DECLARE_OP)
#undef DOWNPOUR_DECLARE_OP

  // `relu`: y = max(0, conv + bias) (the ReLU that follows, fused).
  virtual absl::Status Conv2dForward(const kernels::WindowShape& s, Act x, const float* w,
                                     const float* bias, Act y, bool relu) = 0;
  virtual absl::Status Conv2dBackward(const kernels::WindowShape& s, Act x, const float* w, Act dy,
                                      Act dx, Write dx_write, float* dw, float* dbias,
                                      Write param_write) = 0;
  // The loss counters: reset, added to by SoftmaxCrossEntropy, read (which
  // waits for the device).
  virtual absl::Status ResetLoss() = 0;
  // dlogits (when not null) carry the loss scale `dlogits_scale`.
  virtual absl::Status SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                           const int32_t* labels, Act dlogits,
                                           float dlogits_scale) = 0;
  virtual absl::StatusOr<kernels::LossStats> ReadLoss() = 0;
  // Loss scaling: g *= inv_scale with non-finite values noted in a flag
  // that ResetNonFinite clears and ReadNonFinite reads (waits).
  virtual absl::Status UnscaleCheckFinite(int64_t n, float inv_scale, float* g) = 0;
  virtual absl::Status ResetNonFinite() = 0;
  virtual absl::StatusOr<bool> ReadNonFinite() = 0;

  virtual bool gpu() const = 0;
  // Bytes of one activation element: 4, or 2 where they are bf16/fp16.
  virtual size_t activation_bytes() const = 0;
  // y = the n floats at x in the activation type (the model input).
  virtual absl::Status ToActivations(int64_t n, const float* x, Act y) = 0;
  // n floats (gradients) set to zero.
  virtual absl::Status ZeroFloats(int64_t n, float* x) = 0;
  // Scratch planning (a GPU's workspace; nothing on the CPU): the most any
  // call asked for since the reset; memory lent as the scratch of the calls
  // that follow, until returned; the backend's own scratch freed.
  virtual void ResetWorkspacePeak() = 0;
  virtual int64_t WorkspacePeak() const = 0;
  virtual void LendWorkspace(void* memory, size_t bytes) = 0;
  virtual void ReturnWorkspace() = 0;
  virtual absl::Status ReleaseWorkspace() = 0;
  // The stream work is queued on (null on the CPU).
  virtual cudaStream_t stream() const = 0;
  // Binds the calling thread to this backend's device (a no-op on the CPU).
  virtual absl::Status MakeCurrent() = 0;
  // Compute memory the backend holds for itself: a GPU's scratch, and its
  // reduced weight copies.
  virtual int64_t workspace_bytes() const = 0;
  virtual int64_t weight_copy_bytes() const = 0;
  // Memory the kernels read and write.
  virtual absl::StatusOr<Memory> Allocate(size_t bytes) = 0;
  // Host memory that copies to and from the device fast.
  virtual absl::StatusOr<Memory> AllocateHost(size_t bytes) = 0;
  // Queued copies between host and device memory (plain copies on the CPU).
  virtual absl::Status ToDevice(void* device, const void* host, size_t bytes) = 0;
  virtual absl::Status ToHost(void* host, const void* device, size_t bytes) = 0;
  // Waits for all queued work.
  virtual absl::Status Synchronize() = 0;
  virtual absl::Status ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                                      const std::vector<cuda::TensorUpdate>& tensors) = 0;
  // bf16/fp16 on a GPU: reduced copies of the weights in `ranges` that
  // dense layers and convolutions read, refreshed by CastReducedWeights
  // (once per forward pass); nothing on the CPU or in fp32.
  virtual absl::Status RegisterReducedWeights(
      const std::vector<std::pair<const float*, int64_t>>& ranges) = 0;
  virtual absl::Status CastReducedWeights() = 0;
  // Profiling: Mark(i) notes when the work queued so far ends (at the time
  // it runs); MarkMs(i, j) is the time from mark i to mark j, after a
  // Synchronize.
  virtual absl::Status Mark(int slot) = 0;
  virtual absl::StatusOr<double> MarkMs(int from, int to) = 0;
};

class CpuOps : public Ops {
 public:
#define DOWNPOUR_CPU_OP(name, params, args) \
  absl::Status name params override {       \
    cpu::name(ctx_, DOWNPOUR_UNPAREN args); \
    return absl::OkStatus();                \
  }
  DOWNPOUR_MODEL_OPS(DOWNPOUR_CPU_OP)
#undef DOWNPOUR_CPU_OP

  absl::Status Conv2dForward(const kernels::WindowShape& s, Act x, const float* w,
                             const float* bias, Act y, bool relu) override {
    cpu::Conv2dForward(ctx_, s, x, w, bias, y, Workspace(s));
    if (relu) cpu::ReluForward(ctx_, s.batch * s.out_elements(), y, y);
    return absl::OkStatus();
  }
  absl::Status Conv2dBackward(const kernels::WindowShape& s, Act x, const float* w, Act dy, Act dx,
                              Write dx_write, float* dw, float* dbias, Write param_write) override {
    cpu::Conv2dBackward(ctx_, s, x, w, dy, dx, dx_write, dw, dbias, param_write, Workspace(s));
    return absl::OkStatus();
  }
  absl::Status ResetLoss() override {
    loss_ = kernels::LossStats();
    return absl::OkStatus();
  }
  absl::Status SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                   const int32_t* labels, Act dlogits,
                                   float dlogits_scale) override {
    kernels::LossStats stats;
    float* grad = dlogits;
    cpu::SoftmaxCrossEntropy(ctx_, batch, classes, logits, labels, grad, &stats);
    if (grad != nullptr && dlogits_scale != 1.f) {
      for (int64_t i = 0; i < batch * classes; ++i) grad[i] *= dlogits_scale;
    }
    loss_.loss_sum += stats.loss_sum;
    loss_.correct += stats.correct;
    return absl::OkStatus();
  }
  absl::StatusOr<kernels::LossStats> ReadLoss() override { return loss_; }
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

  bool gpu() const override { return false; }
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
  cudaStream_t stream() const override { return nullptr; }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }
  int64_t workspace_bytes() const override { return 0; }
  int64_t weight_copy_bytes() const override { return 0; }
  absl::StatusOr<Memory> Allocate(size_t bytes) override {
    return Memory::Allocate(Memory::Kind::kHost, bytes);
  }
  absl::StatusOr<Memory> AllocateHost(size_t bytes) override {
    return Memory::Allocate(Memory::Kind::kHost, bytes);
  }
  absl::Status ToDevice(void* device, const void* host, size_t bytes) override {
    if (device != host) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    if (device != host) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                              const std::vector<cuda::TensorUpdate>& tensors) override {
    for (const cuda::TensorUpdate& t : tensors) {
      downpour::ApplyOptimizer(kind, hp, t.grad, t.n, t.param, t.slots);
    }
    return absl::OkStatus();
  }
  absl::Status RegisterReducedWeights(
      const std::vector<std::pair<const float*, int64_t>>& /*ranges*/) override {
    return absl::OkStatus();
  }
  absl::Status CastReducedWeights() override { return absl::OkStatus(); }
  absl::Status Mark(int slot) override {
    if (static_cast<size_t>(slot) >= marks_.size()) marks_.resize(slot + 1);
    marks_[slot] = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }
  absl::StatusOr<double> MarkMs(int from, int to) override {
    return std::chrono::duration<double, std::milli>(marks_.at(to) - marks_.at(from)).count();
  }

 private:
  float* Workspace(const kernels::WindowShape& s) {
    const size_t need = static_cast<size_t>(cpu::Conv2dWorkspaceElements(s));
    if (workspace_.size() < need) workspace_.resize(need);
    return workspace_.data();
  }

  cpu::CpuContext ctx_;
  std::vector<float> workspace_;  // im2col scratch, shared by every conv2d.
  kernels::LossStats loss_;
  bool non_finite_ = false;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

class CudaOps : public Ops {
 public:
  static absl::StatusOr<std::unique_ptr<CudaOps>> Create(int device,
                                                         ModelOptions::ConvLayout conv_layout,
                                                         Precision precision) {
    auto ops = std::unique_ptr<CudaOps>(new CudaOps());
    // Small at first: convolutions grow it to what their fastest
    // algorithms need (kernels/cuda.h).
    ASSIGN_OR_RETURN(ops->ctx_, cuda::CudaContext::Create(device, size_t{16} << 20));
    ops->ctx_->conv_layout =
        conv_layout == ModelOptions::ConvLayout::kNhwc   ? cuda::ConvLayout::kNhwc
        : conv_layout == ModelOptions::ConvLayout::kNchw ? cuda::ConvLayout::kNchw
                                                         : cuda::ConvLayout::kAuto;
    ops->ctx_->compute = precision == BF16   ? cuda::ComputePrecision::kBf16
                         : precision == FP16 ? cuda::ComputePrecision::kFp16
                                             : cuda::ComputePrecision::kFp32;
    // Loss sum, correct count, then the non-finite flag at byte 16.
    ASSIGN_OR_RETURN(ops->counters_, Memory::Allocate(Memory::Kind::kDevice, 32));
    ASSIGN_OR_RETURN(ops->counters_host_, Memory::Allocate(Memory::Kind::kPinned, 32));
    return ops;
  }

#define DOWNPOUR_CUDA_OP(name, params, args)                                                \
  absl::Status name params override {                                                       \
    return ForActivationType(                                                               \
        [&](auto tag) { return cuda::name<decltype(tag)>(*ctx_, DOWNPOUR_UNPAREN args); }); \
  }
  DOWNPOUR_MODEL_OPS(DOWNPOUR_CUDA_OP)
#undef DOWNPOUR_CUDA_OP

  absl::Status Conv2dForward(const kernels::WindowShape& s, Act x, const float* w,
                             const float* bias, Act y, bool relu) override {
    return ForActivationType([&](auto tag) {
      return cuda::Conv2dForward<decltype(tag)>(*ctx_, s, x, w, bias, y, relu);
    });
  }
  absl::Status Conv2dBackward(const kernels::WindowShape& s, Act x, const float* w, Act dy, Act dx,
                              Write dx_write, float* dw, float* dbias, Write param_write) override {
    return ForActivationType([&](auto tag) {
      return cuda::Conv2dBackward<decltype(tag)>(*ctx_, s, x, w, dy, dx, dx_write, dw, dbias,
                                                 param_write);
    });
  }
  absl::Status ResetLoss() override {
    return Check(cudaMemsetAsync(counters_.as<void>(), 0, 16, ctx_->stream), "cudaMemsetAsync");
  }
  absl::Status SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                   const int32_t* labels, Act dlogits,
                                   float dlogits_scale) override {
    return ForActivationType([&](auto tag) {
      return cuda::SoftmaxCrossEntropyAsync<decltype(tag)>(
          *ctx_, batch, classes, logits, labels, dlogits, dlogits_scale, counters_.as<double>(),
          reinterpret_cast<unsigned long long*>(counters_.as<double>() + 1));
    });
  }
  absl::StatusOr<kernels::LossStats> ReadLoss() override {
    RETURN_IF_ERROR(ToHost(counters_host_.as<void>(), counters_.as<void>(), 16));
    RETURN_IF_ERROR(Synchronize());
    kernels::LossStats stats;
    stats.loss_sum = counters_host_.as<double>()[0];
    unsigned long long correct = 0;
    std::memcpy(&correct, counters_host_.as<double>() + 1, sizeof(correct));
    stats.correct = static_cast<int64_t>(correct);
    return stats;
  }
  absl::Status UnscaleCheckFinite(int64_t n, float inv_scale, float* g) override {
    return cuda::UnscaleCheckFinite(*ctx_, n, inv_scale, g, Flag());
  }
  absl::Status ResetNonFinite() override {
    return Check(cudaMemsetAsync(Flag(), 0, sizeof(int), ctx_->stream), "cudaMemsetAsync");
  }
  absl::StatusOr<bool> ReadNonFinite() override {
    int* host = reinterpret_cast<int*>(counters_host_.as<char>() + 16);
    RETURN_IF_ERROR(ToHost(host, Flag(), sizeof(int)));
    RETURN_IF_ERROR(Synchronize());
    return *host != 0;
  }

  bool gpu() const override { return true; }
  size_t activation_bytes() const override {
    return ctx_->compute == cuda::ComputePrecision::kFp32 ? sizeof(float) : 2;
  }
  absl::Status ToActivations(int64_t n, const float* x, Act y) override {
    return ForActivationType(
        [&](auto tag) { return cuda::Convert<float, decltype(tag)>(*ctx_, n, x, y); });
  }
  absl::Status ZeroFloats(int64_t n, float* x) override { return cuda::Zero<float>(*ctx_, n, x); }
  void ResetWorkspacePeak() override { ctx_->workspace_peak = 0; }
  int64_t WorkspacePeak() const override { return static_cast<int64_t>(ctx_->workspace_peak); }
  void LendWorkspace(void* memory, size_t bytes) override { ctx_->LendWorkspace(memory, bytes); }
  void ReturnWorkspace() override { ctx_->ReturnWorkspace(); }
  absl::Status ReleaseWorkspace() override { return ctx_->ReleaseWorkspace(); }
  cudaStream_t stream() const override { return ctx_->stream; }
  absl::Status MakeCurrent() override { return ctx_->MakeCurrent(); }
  int64_t workspace_bytes() const override {
    return static_cast<int64_t>(ctx_->owned_workspace_bytes());
  }
  int64_t weight_copy_bytes() const override {
    return static_cast<int64_t>(cuda::ReducedWeightBytes(*ctx_));
  }
  absl::StatusOr<Memory> Allocate(size_t bytes) override {
    return Memory::Allocate(Memory::Kind::kDevice, bytes);
  }
  absl::StatusOr<Memory> AllocateHost(size_t bytes) override {
    return Memory::Allocate(Memory::Kind::kPinned, bytes);
  }
  absl::Status ToDevice(void* device, const void* host, size_t bytes) override {
    return Check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, ctx_->stream),
                 "cudaMemcpyAsync to the device");
  }
  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    return Check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, ctx_->stream),
                 "cudaMemcpyAsync to the host");
  }
  absl::Status Synchronize() override { return ctx_->Synchronize(); }
  absl::Status ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                              const std::vector<cuda::TensorUpdate>& tensors) override {
    // The tensors of a model never move: their descriptors go up once.
    if (plan_ == nullptr || !SameTensors(tensors)) {
      ASSIGN_OR_RETURN(plan_, cuda::MultiTensorPlan::Create(*ctx_, tensors));
      plan_tensors_ = tensors;
    }
    return plan_->Apply(*ctx_, kind, hp);
  }

  absl::Status RegisterReducedWeights(
      const std::vector<std::pair<const float*, int64_t>>& ranges) override {
    return cuda::RegisterReducedWeights(*ctx_, ranges);
  }
  absl::Status CastReducedWeights() override { return cuda::CastReducedWeights(*ctx_); }
  absl::Status Mark(int slot) override {
    while (static_cast<size_t>(slot) >= marks_.size()) {
      cudaEvent_t e = nullptr;
      RETURN_IF_ERROR(Check(cudaEventCreate(&e), "cudaEventCreate"));
      marks_.push_back(e);
    }
    return Check(cudaEventRecord(marks_[slot], ctx_->stream), "cudaEventRecord");
  }
  absl::StatusOr<double> MarkMs(int from, int to) override {
    float ms = 0.f;
    RETURN_IF_ERROR(
        Check(cudaEventElapsedTime(&ms, marks_.at(from), marks_.at(to)), "cudaEventElapsedTime"));
    return static_cast<double>(ms);
  }
  ~CudaOps() override {
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  }

  cuda::CudaContext& ctx() { return *ctx_; }

 private:
  CudaOps() = default;
  static absl::Status Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
  }

  int* Flag() { return reinterpret_cast<int*>(counters_.as<char>() + 16); }

  // f(T{}) with T the activation element type of the context's precision.
  template <typename F>
  absl::Status ForActivationType(F&& f) {
    switch (ctx_->compute) {
      case cuda::ComputePrecision::kBf16:
        return f(__nv_bfloat16{});
      case cuda::ComputePrecision::kFp16:
        return f(__half{});
      case cuda::ComputePrecision::kFp32:
        break;
    }
    return f(float{});
  }

  std::unique_ptr<cuda::CudaContext> ctx_;
  Memory counters_;       // double loss sum, uint64 correct, int non-finite flag.
  Memory counters_host_;  // Pinned, for ReadLoss.
  bool SameTensors(const std::vector<cuda::TensorUpdate>& tensors) const {
    if (tensors.size() != plan_tensors_.size()) return false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const cuda::TensorUpdate &a = tensors[i], &b = plan_tensors_[i];
      if (a.grad != b.grad || a.param != b.param || a.slots[0] != b.slots[0] ||
          a.slots[1] != b.slots[1] || a.n != b.n) {
        return false;
      }
    }
    return true;
  }

  std::unique_ptr<cuda::MultiTensorPlan> plan_;
  std::vector<cuda::TensorUpdate> plan_tensors_;  // What plan_ was made for.
  std::vector<cudaEvent_t> marks_;
};

#undef DOWNPOUR_UNPAREN
#undef DOWNPOUR_MODEL_OPS

// One activation tensor: per-example size, values and (in training) the
// gradient of the loss with respect to them, in the compute memory. Both
// live in the Model's activation arena (see PlanActivations), which reuses
// memory between tensors whose lifetimes in the step do not overlap.
struct Buffer {
  int64_t elements = 0;
  // >= 1: the values are that buffer's, overwritten in place (a ReLU that is
  // its input's only reader).
  int value_alias = -1;
  void* value_data = nullptr;
  void* grad_data = nullptr;
  Act value_ptr() const { return Act(value_data); }
  Act grad_ptr() const { return Act(grad_data); }
};

struct ForwardArgs {
  int64_t batch = 0;
  bool training = false;
  uint64_t step = 0;
  std::vector<Act> x;  // One per LayerShape::inputs entry.
  Act y;               // Null for the loss and for aliasing layers.
  const int32_t* labels = nullptr;
  // The model input as given (floats), for embeddings' ids.
  const float* model_input = nullptr;
  float loss_scale = 1.f;  // FP16: what the loss's gradient is multiplied by.
};

struct BackwardArgs {
  int64_t batch = 0;
  std::vector<Act> x;
  Act y;
  Act dy;                       // Null for the loss.
  std::vector<Act> dx;          // Null entries: no gradient wanted (model input).
  std::vector<Write> dx_write;  // Overwrite for the first contribution, then add.
  const float* model_input = nullptr;
};

// A layer's computation over the kernels of `ops`. Owns its scratch (dropout
// mask, dlogits, batch statistics) in the compute memory; parameters and
// activations belong to the Model.
class Layer {
 public:
  virtual ~Layer() = default;
  // Grows per-batch scratch to hold `batch` examples.
  virtual absl::Status Reserve(Ops& /*ops*/, int64_t /*batch*/) { return absl::OkStatus(); }
  // True for layers that only reinterpret their input's shape: they share the
  // input's buffer and do nothing in forward or backward.
  virtual bool aliases_input() const { return false; }
  virtual absl::Status Forward(Ops& ops, const ForwardArgs& args) = 0;
  virtual absl::Status Backward(Ops& ops, const BackwardArgs& args) = 0;
};

namespace {

class DenseLayer : public Layer {
 public:
  DenseLayer(int64_t in, int64_t out, const float* w, const float* b, float* dw, float* db)
      : in_(in), out_(out), w_(w), b_(b), dw_(dw), db_(db) {}

  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    return ops.DenseForward(a.batch, in_, out_, a.x[0], w_, b_, a.y);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    return ops.DenseBackward(a.batch, in_, out_, a.x[0], w_, a.dy, a.dx[0], a.dx_write[0], dw_, db_,
                             Write::kOverwrite);
  }

 private:
  const int64_t in_, out_;
  const float* const w_;
  const float* const b_;  // Null without bias.
  float* const dw_;
  float* const db_;
};

class ReluLayer : public Layer {
 public:
  explicit ReluLayer(int64_t elements) : elements_(elements) {}

  // The convolution before it applies it (it runs in place on that
  // convolution's output): the forward has nothing left to do.
  void set_forward_fused() { forward_fused_ = true; }
  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    if (forward_fused_) return absl::OkStatus();
    return ops.ReluForward(a.batch * elements_, a.x[0], a.y);
  }
  // From the output (y > 0 exactly where x > 0), so the forward may run in
  // place.
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.ReluBackward(a.batch * elements_, a.y, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t elements_;
  bool forward_fused_ = false;
};

class FlattenLayer : public Layer {
 public:
  bool aliases_input() const override { return true; }
  absl::Status Forward(Ops&, const ForwardArgs&) override { return absl::OkStatus(); }
  absl::Status Backward(Ops&, const BackwardArgs&) override { return absl::OkStatus(); }
};

class DropoutLayer : public Layer {
 public:
  DropoutLayer(int64_t elements, float rate, uint64_t seed)
      : elements_(elements), rate_(rate), seed_(seed) {}

  absl::Status Reserve(Ops& ops, int64_t batch) override {
    ASSIGN_OR_RETURN(mask_, ops.Allocate(batch * elements_));
    return absl::OkStatus();
  }
  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    const int64_t n = a.batch * elements_;
    if (a.training) {
      return ops.DropoutForward(n, rate_, seed_, a.step, a.x[0], a.y, mask_.as<uint8_t>());
    }
    return ops.CopyOrAdd(n, a.x[0], a.y, Write::kOverwrite);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.DropoutBackward(a.batch * elements_, rate_, mask_.as<uint8_t>(), a.dy, a.dx[0],
                               a.dx_write[0]);
  }

 private:
  const int64_t elements_;
  const float rate_;
  const uint64_t seed_;
  Memory mask_;
};

class SoftmaxCrossEntropyLayer : public Layer {
 public:
  explicit SoftmaxCrossEntropyLayer(int64_t classes) : classes_(classes) {}

  absl::Status Reserve(Ops& ops, int64_t batch) override {
    ASSIGN_OR_RETURN(dlogits_, ops.Allocate(ops.activation_bytes() * batch * classes_));
    return absl::OkStatus();
  }
  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    return ops.SoftmaxCrossEntropy(a.batch, classes_, a.x[0], a.labels,
                                   a.training ? Act(dlogits_.as<void>()) : nullptr, a.loss_scale);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.CopyOrAdd(a.batch * classes_, Act(dlogits_.as<void>()), a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t classes_;
  Memory dlogits_;  // Written by a training forward, read by backward.
};

kernels::WindowShape Batched(kernels::WindowShape s, int64_t batch) {
  s.batch = batch;
  return s;
}

class Conv2dLayer : public Layer {
 public:
  Conv2dLayer(const kernels::WindowShape& window, const float* w, const float* b, float* dw,
              float* db)
      : window_(window), w_(w), b_(b), dw_(dw), db_(db) {}

  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    return ops.Conv2dForward(Batched(window_, a.batch), a.x[0], w_, b_, a.y, fused_relu_);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    return ops.Conv2dBackward(Batched(window_, a.batch), a.x[0], w_, a.dy, a.dx[0], a.dx_write[0],
                              dw_, db_, Write::kOverwrite);
  }

  // Applies the in-place ReLU that follows (see ReluLayer::set_forward_fused).
  void set_fused_relu() { fused_relu_ = true; }

 private:
  const kernels::WindowShape window_;
  const float* const w_;
  const float* const b_;  // Null without bias.
  float* const dw_;
  float* const db_;
  bool fused_relu_ = false;
};

class PoolLayer : public Layer {
 public:
  PoolLayer(const kernels::WindowShape& window, bool max) : window_(window), max_(max) {}

  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    const kernels::WindowShape s = Batched(window_, a.batch);
    return max_ ? ops.MaxPoolForward(s, a.x[0], a.y) : ops.AvgPoolForward(s, a.x[0], a.y);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    const kernels::WindowShape s = Batched(window_, a.batch);
    return max_ ? ops.MaxPoolBackward(s, a.x[0], a.dy, a.dx[0], a.dx_write[0])
                : ops.AvgPoolBackward(s, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const kernels::WindowShape window_;
  const bool max_;
};

class GlobalAvgPoolLayer : public Layer {
 public:
  GlobalAvgPoolLayer(int64_t spatial, int64_t channels) : spatial_(spatial), channels_(channels) {}

  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    return ops.GlobalAvgPoolForward(a.batch, spatial_, channels_, a.x[0], a.y);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.GlobalAvgPoolBackward(a.batch, spatial_, channels_, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t spatial_, channels_;
};

// Normalises over the last axis; rows = batch * (elements / channels).
class BatchNormLayer : public Layer {
 public:
  BatchNormLayer(int64_t elements, int64_t channels, float momentum, float epsilon,
                 const float* gamma, const float* beta, float* dgamma, float* dbeta,
                 float* running_mean, float* running_var)
      : positions_(elements / channels),
        channels_(channels),
        momentum_(momentum),
        epsilon_(epsilon),
        gamma_(gamma),
        beta_(beta),
        dgamma_(dgamma),
        dbeta_(dbeta),
        running_mean_(running_mean),
        running_var_(running_var) {}

  absl::Status Reserve(Ops& ops, int64_t /*batch*/) override {
    if (saved_.bytes() != 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(saved_, ops.Allocate(2 * sizeof(float) * channels_));
    return absl::OkStatus();
  }
  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    const int64_t rows = a.batch * positions_;
    if (a.training) {
      return ops.BatchNormForwardTraining(rows, channels_, a.x[0], gamma_, beta_, epsilon_,
                                          momentum_, a.y, running_mean_, running_var_, save_mean(),
                                          save_inv_std());
    }
    return ops.BatchNormForwardInference(rows, channels_, a.x[0], gamma_, beta_, running_mean_,
                                         running_var_, epsilon_, a.y);
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    return ops.BatchNormBackward(a.batch * positions_, channels_, a.x[0], a.dy, gamma_, save_mean(),
                                 save_inv_std(), a.dx[0], a.dx_write[0], dgamma_, dbeta_,
                                 Write::kOverwrite);
  }

 private:
  float* save_mean() const { return saved_.as<float>(); }
  float* save_inv_std() const { return saved_.as<float>() + channels_; }

  const int64_t positions_, channels_;
  const float momentum_, epsilon_;
  const float* const gamma_;
  const float* const beta_;
  float* const dgamma_;
  float* const dbeta_;
  float* const running_mean_;
  float* const running_var_;
  // The last training forward's batch mean and inverse std, read by backward.
  Memory saved_;
};

class AddLayer : public Layer {
 public:
  explicit AddLayer(int64_t elements) : elements_(elements) {}

  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    const int64_t n = a.batch * elements_;
    RETURN_IF_ERROR(ops.Add(n, a.x[0], a.x[1], a.y));
    for (size_t i = 2; i < a.x.size(); ++i) RETURN_IF_ERROR(ops.Add(n, a.y, a.x[i], a.y));
    return absl::OkStatus();
  }
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    for (size_t i = 0; i < a.dx.size(); ++i) {
      if (a.dx[i] != nullptr) {
        RETURN_IF_ERROR(ops.CopyOrAdd(a.batch * elements_, a.dy, a.dx[i], a.dx_write[i]));
      }
    }
    return absl::OkStatus();
  }

 private:
  const int64_t elements_;
};

class EmbeddingLayer : public Layer {
 public:
  // `ids_from_input`: the ids are the model input (read as given, never in
  // a reduced activation type); otherwise a float activation.
  EmbeddingLayer(int64_t ids_per_example, int64_t vocab, int64_t dim, const float* table,
                 float* dtable, bool ids_from_input)
      : ids_per_example_(ids_per_example),
        vocab_(vocab),
        dim_(dim),
        table_(table),
        dtable_(dtable),
        ids_from_input_(ids_from_input) {}

  absl::Status Forward(Ops& ops, const ForwardArgs& a) override {
    const float* ids = ids_from_input_ ? a.model_input : a.x[0];
    return ops.EmbeddingForward(a.batch * ids_per_example_, vocab_, dim_, ids, table_, a.y);
  }
  // Ids have no gradient: dx is left alone.
  absl::Status Backward(Ops& ops, const BackwardArgs& a) override {
    const float* ids = ids_from_input_ ? a.model_input : a.x[0];
    RETURN_IF_ERROR(ops.EmbeddingBackward(a.batch * ids_per_example_, vocab_, dim_, ids, a.dy,
                                          dtable_, Write::kOverwrite));
    if (a.dx[0] != nullptr && a.dx_write[0] == Write::kOverwrite) {
      return ops.Zero(a.batch * ids_per_example_, a.dx[0]);
    }
    return absl::OkStatus();
  }

 private:
  const int64_t ids_per_example_, vocab_, dim_;
  const float* const table_;
  float* const dtable_;
  const bool ids_from_input_;
};

}  // namespace
}  // namespace model_internal

namespace model_internal {

// Every block of memory a Model owns besides its layers' scratch.
struct Storage {
  Memory params, grads, state;                 // Compute memory.
  Memory params_host, grads_host, state_host;  // GPU only: page-locked copies.
  Memory features, labels;                     // GPU only: the staged batch.
  Memory input_activations;                    // Reduced activations: the input in their type.
  Memory features_host, labels_host;           // GPU only: page-locked staging.
  Memory slots;                                // ApplyOptimizerOnDevice's.
  int num_slots = 0;
  std::vector<Buffer> buffers;       // Activations; [0] is the model input (no memory).
  Memory arena;                      // Every buffer's values and gradients.
  std::vector<int> buffer_of_layer;  // -1 for the loss (scalar output).
  int64_t capacity = 0;              // Largest batch the buffers hold.
  int64_t staged_capacity = 0;       // Largest batch features/labels hold.
  // GPU only: the copy stream for batches, and its event.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t copied = nullptr;

  ~Storage() {
    if (copied != nullptr) cudaEventDestroy(copied);
    if (copy_stream != nullptr) {
      cudaStreamSynchronize(copy_stream);
      cudaStreamDestroy(copy_stream);
    }
  }
};

}  // namespace model_internal

absl::StatusOr<std::string> DescribeDevice(int device) {
  if (device < 0) return std::string("cpu");
  const int count = kernels::cuda::CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError(kernels::cuda::CudaUnavailableReason());
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist; this process sees ", count));
  }
  return absl::StrCat("cuda:", device, " ", kernels::cuda::CudaDeviceName(device));
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec, uint64_t seed,
                                                     const ModelOptions& options) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec));
  ASSIGN_OR_RETURN(std::string name, DescribeDevice(options.device));
  std::unique_ptr<model_internal::Ops> ops;
  Precision precision = options.precision;
  if (!Precision_IsValid(precision)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown precision ", precision));
  }
  if (options.device < 0) {
    ops = std::make_unique<model_internal::CpuOps>();
    if (precision != FP32) {
      std::fprintf(stderr, "model on the cpu: precision %s runs in fp32 there\n",
                   Precision_Name(precision).c_str());
      precision = FP32;
    }
  } else {
    // An embedding's ids are floats; fed by another layer they would be
    // activations, which a reduced type cannot hold exactly.
    for (const LayerShape& layer : shape.layers) {
      if (precision != FP32 && layer.kind == LayerKind::kEmbedding &&
          layer.inputs[0] != LayerShape::kModelInput) {
        std::fprintf(stderr,
                     "model: embedding \"%s\" reads ids from another layer; precision %s runs in "
                     "fp32\n",
                     layer.name.c_str(), Precision_Name(precision).c_str());
        precision = FP32;
      }
    }
    ASSIGN_OR_RETURN(
        ops, model_internal::CudaOps::Create(options.device, options.conv_layout, precision));
  }
  if (!(options.initial_loss_scale >= 1.0) || !std::isfinite(options.initial_loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial loss scale must be finite and >= 1, got ", options.initial_loss_scale));
  }
  std::unique_ptr<Model> model(new Model(std::move(shape), seed, std::max(options.device, -1),
                                         std::move(name), precision, options.initial_loss_scale));
  RETURN_IF_ERROR(model->Init(std::move(ops)));
  return model;
}

void DynamicLossScale::Update(bool overflow) {
  if (overflow) {
    scale_ = std::max(1.0, scale_ / 2);
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ >= kGrowthInterval) {
    scale_ = std::min(kMaxScale, scale_ * 2);
    clean_steps_ = 0;
  }
}

Model::Model(ModelShape shape, uint64_t seed, int device, std::string device_name,
             Precision precision, double initial_loss_scale)
    : shape_(std::move(shape)),
      seed_(seed),
      device_(device),
      device_name_(std::move(device_name)),
      precision_(precision),
      loss_scaling_(precision == FP16),
      loss_scale_(initial_loss_scale),
      storage_(std::make_unique<model_internal::Storage>()) {}

absl::Status Model::Init(std::unique_ptr<model_internal::Ops> ops) {
  using model_internal::Buffer;
  ops_ = std::move(ops);
  model_internal::Storage& st = *storage_;
  const bool gpu = ops_->gpu();
  int64_t& param_total = param_total_;
  int64_t& state_total = state_total_;
  for (const ParamInfo& p : shape_.params) {
    param_offset_.push_back(param_total);
    param_total += p.num_elements;
  }
  for (const ParamInfo& p : shape_.local_state) {
    state_offset_.push_back(state_total);
    state_total += p.num_elements;
  }
  const size_t param_bytes = sizeof(float) * param_total;
  const size_t state_bytes = sizeof(float) * state_total;
  ASSIGN_OR_RETURN(st.params, ops_->Allocate(param_bytes));
  ASSIGN_OR_RETURN(st.grads, ops_->Allocate(param_bytes));
  ASSIGN_OR_RETURN(st.state, ops_->Allocate(state_bytes));
  param_compute_ = st.params.as<float>();
  grad_compute_ = st.grads.as<float>();
  state_compute_ = st.state.as<float>();
  if (gpu) {
    ASSIGN_OR_RETURN(st.params_host, ops_->AllocateHost(param_bytes));
    ASSIGN_OR_RETURN(st.grads_host, ops_->AllocateHost(param_bytes));
    ASSIGN_OR_RETURN(st.state_host, ops_->AllocateHost(state_bytes));
    param_host_ = st.params_host.as<float>();
    grad_host_ = st.grads_host.as<float>();
    state_host_ = st.state_host.as<float>();
    if (cudaStreamCreateWithFlags(&st.copy_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError("cannot create the batch copy stream");
    }
  } else {
    param_host_ = param_compute_;
    grad_host_ = grad_compute_;
    state_host_ = state_compute_;
  }
  for (const ParamInfo& p : shape_.params) {
    InitParamRange(p, seed_, 0, p.num_elements, param(p.id));
  }
  if (param_total > 0) std::memset(grad_host_, 0, param_bytes);
  for (const ParamInfo& p : shape_.local_state) {
    InitParamRange(p, seed_, 0, p.num_elements, local_state_data(p.id));
  }
  RETURN_IF_ERROR(ops_->ToDevice(param_compute_, param_host_, param_bytes));
  RETURN_IF_ERROR(ops_->ToDevice(grad_compute_, grad_host_, param_bytes));
  RETURN_IF_ERROR(ops_->ToDevice(state_compute_, state_host_, state_bytes));
  RETURN_IF_ERROR(ops_->Synchronize());
  if (gpu && precision_ != FP32) {
    std::vector<std::pair<const float*, int64_t>> weights;
    for (const LayerShape& layer : shape_.layers) {
      if ((layer.kind == LayerKind::kDense || layer.kind == LayerKind::kConv2d) &&
          !layer.param_ids.empty()) {
        const int id = layer.param_ids[0];
        weights.emplace_back(param_compute_ + param_offset_[id], shape_.params[id].num_elements);
      }
    }
    RETURN_IF_ERROR(ops_->RegisterReducedWeights(weights));
  }

  std::vector<Buffer>& buffers = st.buffers;
  std::vector<int>& buffer_of_layer = st.buffer_of_layer;
  // Reduced activations: layers other than embeddings read a converted copy
  // of the input.
  if (ops_->activation_bytes() != sizeof(float)) {
    for (const LayerShape& layer : shape_.layers) {
      for (int input : layer.inputs) {
        input_to_activations_ |=
            input == LayerShape::kModelInput && layer.kind != LayerKind::kEmbedding;
      }
    }
  }

  buffers.emplace_back();
  buffers[0].elements = shape_.input_size;
  for (size_t i = 0; i < shape_.layers.size(); ++i) {
    const LayerShape& layer = shape_.layers[i];
    const int input = layer.inputs[0];
    const int in_buffer = input == LayerShape::kModelInput ? 0 : buffer_of_layer[input];
    const int64_t elements = CheckedProduct(layer.output_shape);
    int buffer = -1;
    if (layer.kind == LayerKind::kFlatten) {
      buffer = in_buffer;
    } else if (layer.kind != LayerKind::kSoftmaxCrossEntropy) {
      buffer = static_cast<int>(buffers.size());
      buffers.emplace_back();
      buffers.back().elements = elements;
    }
    buffer_of_layer.push_back(buffer);

    auto p = [this, &layer](size_t k) {
      return k < layer.param_ids.size() ? param_compute_ + param_offset_[layer.param_ids[k]]
                                        : nullptr;
    };
    auto g = [this, &layer](size_t k) {
      return k < layer.param_ids.size() ? grad_compute_ + param_offset_[layer.param_ids[k]]
                                        : nullptr;
    };
    auto s = [this, &layer](size_t k) {
      return state_compute_ + state_offset_[layer.local_state_ids[k]];
    };
    std::unique_ptr<model_internal::Layer> impl;
    switch (layer.kind) {
      case LayerKind::kDense: {
        const int64_t in = shape_.params[layer.param_ids[0]].shape[0];
        impl =
            std::make_unique<model_internal::DenseLayer>(in, layer.units, p(0), p(1), g(0), g(1));
        break;
      }
      case LayerKind::kRelu:
        impl = std::make_unique<model_internal::ReluLayer>(elements);
        break;
      case LayerKind::kFlatten:
        impl = std::make_unique<model_internal::FlattenLayer>();
        break;
      case LayerKind::kDropout:
        impl = std::make_unique<model_internal::DropoutLayer>(
            elements, layer.dropout_rate, kernels::SplitMix64(seed_ ^ kernels::SplitMix64(i + 1)));
        break;
      case LayerKind::kSoftmaxCrossEntropy:
        impl = std::make_unique<model_internal::SoftmaxCrossEntropyLayer>(shape_.num_classes);
        break;
      case LayerKind::kConv2d:
        impl = std::make_unique<model_internal::Conv2dLayer>(layer.window, p(0), p(1), g(0), g(1));
        break;
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
        impl = std::make_unique<model_internal::PoolLayer>(layer.window,
                                                           layer.kind == LayerKind::kMaxPool);
        break;
      case LayerKind::kGlobalAvgPool: {
        const std::vector<int64_t>& in = input == LayerShape::kModelInput
                                             ? shape_.input_shape
                                             : shape_.layers[input].output_shape;
        impl = std::make_unique<model_internal::GlobalAvgPoolLayer>(in[0] * in[1], in[2]);
        break;
      }
      case LayerKind::kBatchNorm:
        impl = std::make_unique<model_internal::BatchNormLayer>(elements, layer.output_shape.back(),
                                                                layer.bn_momentum, layer.bn_epsilon,
                                                                p(0), p(1), g(0), g(1), s(0), s(1));
        break;
      case LayerKind::kAdd:
        impl = std::make_unique<model_internal::AddLayer>(elements);
        break;
      case LayerKind::kEmbedding:
        impl = std::make_unique<model_internal::EmbeddingLayer>(
            elements / layer.embedding_dim, layer.vocab_size, layer.embedding_dim, p(0), g(0),
            input == LayerShape::kModelInput);
        break;
    }
    layers_.push_back(std::move(impl));
  }
  // A ReLU that is the only reader of its input overwrites it (its backward
  // needs only its output).
  std::vector<int> readers(buffers.size(), 0);
  for (const LayerShape& layer : shape_.layers) {
    if (layer.kind == LayerKind::kFlatten) continue;
    for (int input : layer.inputs) {
      if (input != LayerShape::kModelInput) ++readers[buffer_of_layer[input]];
    }
  }
  for (size_t i = 0; i < shape_.layers.size(); ++i) {
    const LayerShape& layer = shape_.layers[i];
    if (layer.kind != LayerKind::kRelu || layer.inputs[0] == LayerShape::kModelInput) continue;
    const int input = layer.inputs[0];
    const int in_buffer = buffer_of_layer[input];
    if (in_buffer <= 0 || readers[in_buffer] != 1) continue;
    // The input's own producer: a flatten's is further up; keep it simple.
    const LayerKind producer = shape_.layers[input].kind;
    if (producer == LayerKind::kRelu || producer == LayerKind::kFlatten) continue;
    buffers[buffer_of_layer[i]].value_alias = in_buffer;
    // Nothing else reads the convolution's output before the ReLU: the
    // convolution applies it in the pass that writes its output (one pass
    // over the activation fewer; the ReLU's backward is unchanged).
    if (producer == LayerKind::kConv2d) {
      static_cast<model_internal::Conv2dLayer*>(layers_[input].get())->set_fused_relu();
      static_cast<model_internal::ReluLayer*>(layers_[i].get())->set_forward_fused();
    }
  }
  return absl::OkStatus();
}

Model::~Model() {
  if (ops_ != nullptr) ops_->Synchronize().IgnoreError();
  // Layers and storage free compute memory; the ops (and the GPU context)
  // go last.
  layers_.clear();
  storage_.reset();
}

float* Model::device_param(int id) { return param_compute_ + param_offset_[id]; }
float* Model::device_grad(int id) { return grad_compute_ + param_offset_[id]; }

absl::Status Model::CheckBatch(const float* features, const int32_t* labels, int64_t batch) const {
  if (batch <= 0)
    return absl::InvalidArgumentError(absl::StrCat("batch must be positive, got ", batch));
  if (features == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("features and labels must not be null");
  }
  int64_t widest = 0;
  for (const model_internal::Buffer& b : storage_->buffers) widest = std::max(widest, b.elements);
  if (batch > kMaxTensorElements / std::max<int64_t>(widest, shape_.num_classes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " examples is too large for this model"));
  }
  for (int64_t i = 0; i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= shape_.num_classes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("labels[%d] = %d is outside [0, %d)", i, labels[i], shape_.num_classes));
    }
  }
  // Ids read straight from the features; an embedding fed by another layer
  // reads an id that is not in its table as zeros.
  for (const LayerShape& layer : shape_.layers) {
    if (layer.kind != LayerKind::kEmbedding || layer.inputs[0] != LayerShape::kModelInput) {
      continue;
    }
    for (int64_t i = 0; i < batch * shape_.input_size; ++i) {
      if (kernels::cpu::EmbeddingRow(features[i], layer.vocab_size) < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "features[%d] = %g is not an id of embedding \"%s\" (an integer in [0, %d))", i,
            features[i], layer.name, layer.vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// One block of the activation arena: live (inclusive) from step `first` to
// `last` of the step's schedule (forward of layer i at i, backward of layer
// i at 2 * layers - 1 - i).
struct ArenaBlock {
  size_t bytes = 0;
  int first = 0, last = 0;
  size_t offset = 0;
};

// Offsets for `blocks` such that blocks live at the same time never share
// bytes: largest first, each at the lowest offset that fits among the blocks
// already placed that it meets in time. Returns the arena's size.
size_t PlaceBlocks(std::vector<ArenaBlock>& blocks) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
  std::vector<size_t> placed;
  size_t total = 0;
  for (size_t i : order) {
    ArenaBlock& block = blocks[i];
    std::vector<std::pair<size_t, size_t>> taken;  // [offset, end) of overlapping blocks.
    for (size_t j : placed) {
      const ArenaBlock& other = blocks[j];
      if (other.first <= block.last && block.first <= other.last) {
        taken.emplace_back(other.offset, other.offset + other.bytes);
      }
    }
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [start, end] : taken) {
      if (offset + block.bytes <= start) break;
      offset = std::max(offset, end);
    }
    block.offset = offset;
    total = std::max(total, offset + block.bytes);
    placed.push_back(i);
  }
  return total;
}

// Layers whose backward reads their input values (the rest need only the
// output gradient, their own output, or their scratch).
bool BackwardReadsInput(LayerKind kind) {
  switch (kind) {
    case LayerKind::kDense:
    case LayerKind::kConv2d:
    case LayerKind::kBatchNorm:
    case LayerKind::kMaxPool:
    case LayerKind::kEmbedding:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status Model::Reserve(int64_t batch) {
  model_internal::Storage& st = *storage_;
  if (batch <= st.capacity) return absl::OkStatus();
  // A failure below leaves no capacity (nothing half-placed is used).
  st.capacity = 0;
  // The layers' scratch needs depend on the batch: measured again.
  scratch_need_.assign(2 * layers_.size(), 0);
  scratch_at_.assign(2 * layers_.size(), nullptr);
  scratch_planned_ = false;
  RETURN_IF_ERROR(PlanArena(batch));
  if (input_to_activations_) {
    st.input_activations = {};
    ASSIGN_OR_RETURN(st.input_activations,
                     ops_->Allocate(ops_->activation_bytes() * batch * shape_.input_size));
  }
  for (auto& layer : layers_) RETURN_IF_ERROR(layer->Reserve(*ops_, batch));
  st.capacity = batch;
  return absl::OkStatus();
}

absl::Status Model::PlanScratch() {
  model_internal::Storage& st = *storage_;
  const int64_t batch = st.capacity;
  // Until the arena is placed again nothing points anywhere valid: a
  // failure here leaves the next step to Reserve from scratch.
  st.capacity = 0;
  scratch_planned_ = false;
  // The calls measured now take their scratch from the arena; the backend's
  // own goes first, so the two are never held together.
  RETURN_IF_ERROR(ops_->ReleaseWorkspace());
  RETURN_IF_ERROR(PlanArena(batch));
  st.capacity = batch;
  scratch_planned_ = true;
  return absl::OkStatus();
}

bool Model::ScratchToPlan() const {
  // The first training step of a capacity measured every layer; later, a
  // call that outgrew its planned block (another batch size, an Evaluate)
  // grew the backend's own scratch back, and the arena takes its need too.
  return ops_->gpu() && !profiling_ && (!scratch_planned_ || ops_->workspace_bytes() > 0);
}

absl::Status Model::PlanArena(int64_t batch) {
  model_internal::Storage& st = *storage_;
  // Outstanding work may still read the old buffers.
  RETURN_IF_ERROR(ops_->Synchronize());
  const int n = static_cast<int>(shape_.layers.size());
  const int buffers = static_cast<int>(st.buffers.size());
  auto backward_time = [n](int layer) { return 2 * n - 1 - layer; };
  // The layer that writes each buffer, and the step's first and last use of
  // its values and of its gradient.
  std::vector<int> producer(buffers, -1);
  for (int i = 0; i < n; ++i) {
    const int out = st.buffer_of_layer[i];
    if (out > 0 && shape_.layers[i].kind != LayerKind::kFlatten) producer[out] = i;
  }
  std::vector<int> value_last(buffers, -1), grad_first(buffers, -1);
  for (int b = 1; b < buffers; ++b) {
    const int p = producer[b];
    value_last[b] = p;
    if (shape_.layers[p].kind == LayerKind::kRelu) value_last[b] = backward_time(p);
    grad_first[b] = backward_time(p);
  }
  for (int i = 0; i < n; ++i) {
    if (shape_.layers[i].kind == LayerKind::kFlatten) continue;
    for (int input : shape_.layers[i].inputs) {
      const int b = input == LayerShape::kModelInput ? 0 : st.buffer_of_layer[input];
      if (b <= 0) continue;
      value_last[b] = std::max(value_last[b], i);
      if (BackwardReadsInput(shape_.layers[i].kind)) {
        value_last[b] = std::max(value_last[b], backward_time(i));
      }
      grad_first[b] = std::min(grad_first[b], backward_time(i));
    }
  }
  // In-place ReLUs: one block holds the input's and the output's values, for
  // both lifetimes.
  std::vector<ArenaBlock> blocks;
  std::vector<int> value_block(buffers, -1), grad_block(buffers, -1);
  for (int b = 1; b < buffers; ++b) {
    const size_t bytes =
        (ops_->activation_bytes() * batch * st.buffers[b].elements + 255) / 256 * 256;
    const int alias = st.buffers[b].value_alias;
    if (alias > 0) {
      ArenaBlock& shared = blocks[value_block[alias]];
      shared.last = std::max(shared.last, value_last[b]);
      value_block[b] = value_block[alias];
    } else {
      value_block[b] = static_cast<int>(blocks.size());
      blocks.push_back({bytes, producer[b], value_last[b], 0});
    }
    grad_block[b] = static_cast<int>(blocks.size());
    blocks.push_back({bytes, grad_first[b], backward_time(producer[b]), 0});
  }
  // Each layer's measured scratch, live during its own forward or backward
  // (where it mostly fits in room the activations leave free then, as a
  // caching allocator would find it).
  std::vector<int> scratch_block(scratch_need_.size(), -1);
  for (int i = 0; i < static_cast<int>(scratch_need_.size()); ++i) {
    if (scratch_need_[i] == 0) continue;
    const int time = i % 2 == 0 ? i / 2 : backward_time(i / 2);
    scratch_block[i] = static_cast<int>(blocks.size());
    blocks.push_back({(static_cast<size_t>(scratch_need_[i]) + 255) / 256 * 256, time, time, 0});
  }
  const size_t arena_bytes = PlaceBlocks(blocks);
  st.arena = {};
  ASSIGN_OR_RETURN(st.arena, ops_->Allocate(arena_bytes));
  char* base = st.arena.as<char>();
  for (int b = 1; b < buffers; ++b) {
    st.buffers[b].value_data = base + blocks[value_block[b]].offset;
    st.buffers[b].grad_data = base + blocks[grad_block[b]].offset;
  }
  for (size_t i = 0; i < scratch_block.size(); ++i) {
    scratch_at_[i] = scratch_block[i] < 0 ? nullptr : base + blocks[scratch_block[i]].offset;
  }
  return absl::OkStatus();
}

absl::Status Model::RunLayer(size_t i, bool forward, const model_internal::ForwardArgs* f,
                             const model_internal::BackwardArgs* b) {
  const size_t slot = 2 * i + (forward ? 0 : 1);
  ops_->ResetWorkspacePeak();
  if (scratch_planned_ && scratch_at_[slot] != nullptr) {
    ops_->LendWorkspace(scratch_at_[slot], static_cast<size_t>(scratch_need_[slot]));
  }
  absl::Status s = forward ? layers_[i]->Forward(*ops_, *f) : layers_[i]->Backward(*ops_, *b);
  ops_->ReturnWorkspace();
  scratch_need_[slot] = std::max(scratch_need_[slot], ops_->WorkspacePeak());
  return s;
}

absl::Status Model::StageBatch(const float* features, const int32_t* labels, int64_t batch) {
  if (!ops_->gpu()) {
    input_ = features;
    labels_ = labels;
    return absl::OkStatus();
  }
  model_internal::Storage& st = *storage_;
  const size_t feature_bytes = sizeof(float) * batch * shape_.input_size;
  const size_t label_bytes = sizeof(int32_t) * batch;
  if (batch > st.staged_capacity) {
    RETURN_IF_ERROR(ops_->Synchronize());
    st.features = {};
    st.labels = {};
    ASSIGN_OR_RETURN(st.features, ops_->Allocate(feature_bytes));
    ASSIGN_OR_RETURN(st.labels, ops_->Allocate(label_bytes));
    ASSIGN_OR_RETURN(st.features_host, ops_->AllocateHost(feature_bytes));
    ASSIGN_OR_RETURN(st.labels_host, ops_->AllocateHost(label_bytes));
    st.staged_capacity = batch;
  }
  // The staging buffers are free: the previous step waited for its copies.
  std::memcpy(st.features_host.as<void>(), features, feature_bytes);
  std::memcpy(st.labels_host.as<void>(), labels, label_bytes);
  // The batch goes up on its own stream, beside the parameters on the
  // compute stream; the forward waits for both.
  cudaStream_t compute = static_cast<model_internal::CudaOps&>(*ops_).ctx().stream;
  if (cudaMemcpyAsync(st.features.as<void>(), st.features_host.as<void>(), feature_bytes,
                      cudaMemcpyHostToDevice, st.copy_stream) != cudaSuccess ||
      cudaMemcpyAsync(st.labels.as<void>(), st.labels_host.as<void>(), label_bytes,
                      cudaMemcpyHostToDevice, st.copy_stream) != cudaSuccess ||
      cudaEventRecord(st.copied, st.copy_stream) != cudaSuccess ||
      cudaStreamWaitEvent(compute, st.copied, 0) != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("copying a batch to the GPU: ", cudaGetErrorString(cudaGetLastError())));
  }
  input_ = st.features.as<float>();
  labels_ = st.labels.as<int32_t>();
  return absl::OkStatus();
}

model_internal::Act Model::Activation(int buffer) const {
  if (buffer != 0) return storage_->buffers[buffer].value_ptr();
  return model_internal::Act(input_to_activations_ ? storage_->input_activations.as<void>()
                                                   : static_cast<const void*>(input_));
}

absl::Status Model::Forward(int64_t batch, bool training, int64_t step) {
  const model_internal::Storage& st = *storage_;
  model_internal::ForwardArgs args;
  args.batch = batch;
  args.training = training;
  args.step = static_cast<uint64_t>(step);
  args.labels = labels_;
  args.model_input = input_;
  if (training && loss_scaling_) args.loss_scale = static_cast<float>(step_scale_);
  RETURN_IF_ERROR(ops_->ResetLoss());
  if (input_to_activations_) {
    RETURN_IF_ERROR(ops_->ToActivations(batch * shape_.input_size, input_,
                                        model_internal::Act(st.input_activations.as<void>())));
  }
  // The weights changed since the last pass (shards' values or the device
  // optimizer): one cast for the whole step instead of one per op.
  RETURN_IF_ERROR(ops_->CastReducedWeights());
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->aliases_input()) continue;
    args.x.clear();
    for (int input : shape_.layers[i].inputs) {
      args.x.push_back(
          Activation(input == LayerShape::kModelInput ? 0 : st.buffer_of_layer[input]));
    }
    const int out = st.buffer_of_layer[i];
    args.y = out > 0 ? st.buffers[out].value_ptr() : nullptr;
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i));
    RETURN_IF_ERROR(RunLayer(i, /*forward=*/true, &args, nullptr));
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i + 1));
  }
  return absl::OkStatus();
}

absl::Status Model::Backward(int64_t batch) {
  const model_internal::Storage& st = *storage_;
  // A buffer's gradient is overwritten by the first layer that contributes to
  // it (in reverse order) and added to by the others.
  std::vector<bool> written(st.buffers.size(), false);
  model_internal::BackwardArgs args;
  args.batch = batch;
  args.model_input = input_;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    if (layers_[i]->aliases_input()) continue;
    const int out = st.buffer_of_layer[i];
    args.y = nullptr;
    args.dy = nullptr;
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i + 2));
    if (out > 0) {
      const model_internal::Buffer& b = st.buffers[out];
      if (!written[out]) {
        // Nothing reads this output: its gradient is zero.
        RETURN_IF_ERROR(ops_->Zero(batch * b.elements, b.grad_ptr()));
        written[out] = true;
      }
      args.y = b.value_ptr();
      args.dy = b.grad_ptr();
    }
    args.x.clear();
    args.dx.clear();
    args.dx_write.clear();
    for (int input : shape_.layers[i].inputs) {
      const int in = input == LayerShape::kModelInput ? 0 : st.buffer_of_layer[input];
      args.x.push_back(Activation(in));
      args.dx.push_back(in > 0 ? st.buffers[in].grad_ptr() : model_internal::Act());
      args.dx_write.push_back(written[in] ? kernels::Write::kAccumulate
                                          : kernels::Write::kOverwrite);
      written[in] = true;
    }
    RETURN_IF_ERROR(RunLayer(i, /*forward=*/false, nullptr, &args));
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i + 3));
  }
  return absl::OkStatus();
}

absl::Status Model::ParamsToDevice() {
  return ops_->ToDevice(param_compute_, param_host_, sizeof(float) * param_total_);
}

absl::StatusOr<StepResult> Model::TrainStep(const float* features, const int32_t* labels,
                                            int64_t batch, int64_t step,
                                            const TrainStepOptions& options) {
  RETURN_IF_ERROR(ops_->MakeCurrent());
  RETURN_IF_ERROR(CheckBatch(features, labels, batch));
  RETURN_IF_ERROR(Reserve(batch));
  RETURN_IF_ERROR(StageBatch(features, labels, batch));
  if (options.params_from_host) RETURN_IF_ERROR(ParamsToDevice());
  RETURN_IF_ERROR(BeginLossScaling());
  RETURN_IF_ERROR(Forward(batch, /*training=*/true, step));
  RETURN_IF_ERROR(Backward(batch));
  if (ScratchToPlan()) RETURN_IF_ERROR(PlanScratch());
  RETURN_IF_ERROR(UnscaleGradients());
  bool skipped = false;
  if (loss_scaling_) {
    ASSIGN_OR_RETURN(skipped, FinishLossScaling());  // Waits; zeroes a skipped step's grads.
  }
  if (options.grads_to_host) {
    RETURN_IF_ERROR(ops_->ToHost(grad_host_, grad_compute_, sizeof(float) * param_total_));
  }
  RETURN_IF_ERROR(ops_->ToHost(state_host_, state_compute_, sizeof(float) * state_total_));
  ASSIGN_OR_RETURN(kernels::LossStats loss, ops_->ReadLoss());  // Waits.
  StepResult result{loss.loss_sum / static_cast<double>(batch), loss.correct};
  result.skipped = skipped;
  result.loss_scale = step_scale_;
  return result;
}

absl::Status Model::GradsToHost() {
  RETURN_IF_ERROR(ops_->MakeCurrent());
  RETURN_IF_ERROR(ops_->ToHost(grad_host_, grad_compute_, sizeof(float) * param_total_));
  return ops_->Synchronize();
}

cudaStream_t Model::stream() const { return ops_->stream(); }

absl::Status Model::BeginLossScaling() {
  if (!loss_scaling_) return absl::OkStatus();
  step_scale_ = loss_scale_.scale();
  return ops_->ResetNonFinite();
}

absl::Status Model::UnscaleGradients() {
  if (!loss_scaling_) return absl::OkStatus();
  return ops_->UnscaleCheckFinite(param_total_, static_cast<float>(1.0 / step_scale_),
                                  grad_compute_);
}

absl::StatusOr<bool> Model::FinishLossScaling() {
  ASSIGN_OR_RETURN(bool overflow, ops_->ReadNonFinite());
  loss_scale_.Update(overflow);
  if (overflow) RETURN_IF_ERROR(ops_->ZeroFloats(param_total_, grad_compute_));
  return overflow;
}

absl::StatusOr<EvalResult> Model::Evaluate(const float* features, const int32_t* labels,
                                           int64_t batch) {
  RETURN_IF_ERROR(ops_->MakeCurrent());
  RETURN_IF_ERROR(CheckBatch(features, labels, batch));
  RETURN_IF_ERROR(Reserve(batch));
  RETURN_IF_ERROR(StageBatch(features, labels, batch));
  RETURN_IF_ERROR(ParamsToDevice());
  RETURN_IF_ERROR(Forward(batch, /*training=*/false, /*step=*/0));
  ASSIGN_OR_RETURN(kernels::LossStats loss, ops_->ReadLoss());
  return EvalResult{loss.loss_sum, loss.correct};
}

absl::Status Model::TrainStepOnDevice(const float* features, const int32_t* labels, int64_t batch,
                                      int64_t step) {
  if (batch <= 0 || features == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("TrainStepOnDevice needs a batch and its labels");
  }
  RETURN_IF_ERROR(Reserve(batch));
  input_ = features;
  labels_ = labels;
  last_batch_ = batch;
  RETURN_IF_ERROR(BeginLossScaling());
  RETURN_IF_ERROR(Forward(batch, /*training=*/true, step));
  RETURN_IF_ERROR(Backward(batch));
  if (ScratchToPlan()) RETURN_IF_ERROR(PlanScratch());
  return UnscaleGradients();
}

absl::Status Model::MarkLayer(int slot) {
  if (static_cast<size_t>(slot) >= host_marks_.size()) host_marks_.resize(slot + 1);
  host_marks_[slot] =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return ops_->Mark(slot);
}

absl::StatusOr<std::vector<LayerTime>> Model::ProfileStepOnDevice(const float* features,
                                                                  const int32_t* labels,
                                                                  int64_t batch, int64_t step) {
  profiling_ = true;
  absl::Status s = TrainStepOnDevice(features, labels, batch, step);
  profiling_ = false;
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(ops_->Synchronize());
  std::vector<LayerTime> times;
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerTime t;
    t.name = shape_.layers[i].name;
    if (!layers_[i]->aliases_input()) {
      const int k = static_cast<int>(4 * i);
      ASSIGN_OR_RETURN(t.forward_ms, ops_->MarkMs(k, k + 1));
      ASSIGN_OR_RETURN(t.backward_ms, ops_->MarkMs(k + 2, k + 3));
      if (2 * i + 1 < scratch_need_.size()) {
        t.forward_scratch_bytes = scratch_need_[2 * i];
        t.backward_scratch_bytes = scratch_need_[2 * i + 1];
      }
      t.host_forward_ms = 1e3 * (host_marks_[k + 1] - host_marks_[k]);
      t.host_backward_ms = 1e3 * (host_marks_[k + 3] - host_marks_[k + 2]);
    }
    times.push_back(std::move(t));
  }
  return times;
}

absl::StatusOr<StepResult> Model::LastStepResult() {
  ASSIGN_OR_RETURN(kernels::LossStats loss, ops_->ReadLoss());
  StepResult result{loss.loss_sum / static_cast<double>(std::max<int64_t>(last_batch_, 1)),
                    loss.correct};
  result.loss_scale = step_scale_;
  if (loss_scaling_) {
    ASSIGN_OR_RETURN(result.skipped, FinishLossScaling());
    last_skipped_ = result.skipped;
  }
  return result;
}

absl::Status Model::ApplyOptimizerOnDevice(OptimizerKind kind, const OptimizerHyperparams& hp) {
  if (last_skipped_) {
    last_skipped_ = false;
    return absl::OkStatus();
  }
  model_internal::Storage& st = *storage_;
  const int slots = NumOptimizerSlots(kind);
  const int64_t total = param_total_;
  if (slots > st.num_slots) {
    RETURN_IF_ERROR(ops_->Synchronize());
    ASSIGN_OR_RETURN(st.slots, ops_->Allocate(sizeof(float) * slots * total));
    // Zeros: the host copy is zeroed and sent up once.
    ASSIGN_OR_RETURN(model_internal::Memory zeros,
                     model_internal::Memory::Allocate(model_internal::Memory::Kind::kHost,
                                                      sizeof(float) * slots * total));
    if (total > 0) std::memset(zeros.as<void>(), 0, zeros.bytes());
    RETURN_IF_ERROR(ops_->ToDevice(st.slots.as<void>(), zeros.as<void>(), zeros.bytes()));
    RETURN_IF_ERROR(ops_->Synchronize());
    st.num_slots = slots;
  }
  std::vector<kernels::cuda::TensorUpdate> tensors;
  for (const ParamInfo& p : shape_.params) {
    kernels::cuda::TensorUpdate t;
    t.grad = device_grad(p.id);
    t.param = device_param(p.id);
    for (int k = 0; k < st.num_slots; ++k) {
      t.slots[k] = st.slots.as<float>() + k * total + param_offset_[p.id];
    }
    t.n = p.num_elements;
    tensors.push_back(t);
  }
  return ops_->ApplyOptimizer(kind, hp, tensors);
}

absl::Status Model::Synchronize() { return ops_->Synchronize(); }

Model::ComputeMemory Model::compute_memory() const {
  const model_internal::Storage& st = *storage_;
  ComputeMemory m;
  m.parameters = st.params.bytes() + st.grads.bytes() + st.state.bytes() + st.slots.bytes();
  m.activations =
      st.arena.bytes() + st.input_activations.bytes() + st.features.bytes() + st.labels.bytes();
  m.workspace = ops_->workspace_bytes();
  m.weight_copies = ops_->weight_copy_bytes();
  return m;
}

}  // namespace downpour
