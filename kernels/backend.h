// ComputeBackend: the kernels of one device, its memory and its copies —
// everything a model (model/) runs on, behind one interface, so the model
// never names a device API. kernels/cpu/ implements it over the CPU
// reference kernels (everything runs at once, in host memory); kernels/cuda/
// over one GPU (work is queued on a stream and runs asynchronously; memory is
// the device's). kernels/factory.h creates either from BackendOptions.
//
// The ops take the arguments of the CPU reference kernels
// (kernels/cpu/layers.h), less the context, with activations passed as Act:
// floats on the CPU and in fp32, the reduced type on a GPU computing in
// bf16/fp16. Weights, biases, their gradients and statistics are always
// fp32. Inputs are validated by the caller on the host, as for the kernels.
//
// Every call returns a status: a failed launch or library call surfaces as an
// error naming it, never a crash.
//
// Thread safety: a backend is used by one host thread at a time; distinct
// backends are independent. Ownership: a backend owns its context (stream,
// library handles, workspace, reduced weight copies); DeviceMemory owns what
// it allocated and must not outlive the backend that allocated it.
#ifndef DOWNPOUR_KERNELS_BACKEND_H_
#define DOWNPOUR_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {

class MemoryCaps;  // kernels/memory_cap.h

// What a backend is created for (kernels/factory.h).
struct BackendOptions {
  // -1: the CPU. d >= 0: CUDA device d, numbered as this process sees them
  // (after CUDA_VISIBLE_DEVICES).
  int device = -1;
  // A GPU's compute precision (the CPU computes in fp32 whatever is asked).
  ComputePrecision precision = ComputePrecision::kFp32;
  // A GPU's use of TF32 tensor cores for fp32 products (ignored on the
  // CPU). The default is PyTorch's: convolutions only.
  Tf32Policy tf32 = Tf32Policy::kConvolutions;
  // GPU convolutions: the layout measured fastest per shape, or one forced
  // (diagnostics and tests).
  ConvLayout conv_layout = ConvLayout::kAuto;
  // GPU convolutions: whether cuDNN's graph API may run a direction where
  // one of its engines timed faster than the legacy algorithms
  // (kernels/cuda/conv_graph.h); off for A/B runs and diagnostics.
  bool conv_graph = true;
  // > 0: the most compute memory the backend holds (Allocate's blocks, a
  // GPU's workspace and reduced weight copies), in bytes: an Allocate that
  // would pass it fails with ResourceExhausted naming the device, the size
  // asked for, what is held and the limit (kernels/memory_cap.h). A worker's
  // --device_memory_limit, so that "does not fit one GPU" can be tried on a
  // large one. 0: no limit but the device's own.
  int64_t memory_limit = 0;
  // Non-null: the backend counts its blocks against these caps' cap of its
  // device, together with every other backend made with them, and
  // memory_limit is unused (the caps hold the limit): a worker's replicas
  // of several ranks on one device share its --device_memory_limit.
  std::shared_ptr<MemoryCaps> shared_caps;
};

// Memory a backend allocated: host, page-locked host or device memory, freed
// with the function it was allocated with. Move-only.
class DeviceMemory {
 public:
  using FreeFunction = void (*)(void*);
  // Called with `context` and the size after the memory is freed (a
  // backend's accounting, kernels/memory_cap.h).
  using ReleaseHook = void (*)(void* context, size_t bytes);

  DeviceMemory() = default;
  DeviceMemory(void* ptr, size_t bytes, FreeFunction free)
      : ptr_(ptr), bytes_(bytes), free_(free) {}
  DeviceMemory(void* ptr, size_t bytes, FreeFunction free, ReleaseHook hook, void* hook_context)
      : ptr_(ptr), bytes_(bytes), free_(free), hook_(hook), hook_context_(hook_context) {}
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      Release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      free_ = std::exchange(other.free_, nullptr);
      hook_ = std::exchange(other.hook_, nullptr);
      hook_context_ = std::exchange(other.hook_context_, nullptr);
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { Release(); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Release() {
    if (ptr_ != nullptr && free_ != nullptr) free_(ptr_);
    if (ptr_ != nullptr && hook_ != nullptr) hook_(hook_context_, bytes_);
    ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  FreeFunction free_ = nullptr;
  ReleaseHook hook_ = nullptr;
  void* hook_context_ = nullptr;
};

// An activation tensor or its gradient in the backend's memory, of the
// backend's activation type (activation_bytes() per element): it converts
// to whatever element pointer the backend's kernel takes.
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

// The ops with the same arguments on every backend (kernels/cpu/layers.h
// and kernels/cuda/layers.h, less the context): X(name, parameters,
// arguments). Backends implement each with the X-macro too.
#define DOWNPOUR_BACKEND_OPS(X)                                                                    \
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
  X(CopyBlock,                                                                                     \
    (int64_t rows, int64_t width, Act x, int64_t x_stride, int64_t x_offset, Act y,                \
     int64_t y_stride, int64_t y_offset, Write write),                                             \
    (rows, width, x, x_stride, x_offset, y, y_stride, y_offset, write))                            \
  X(Zero, (int64_t n, Act x), (n, x))                                                              \
  X(Add, (int64_t n, Act a, Act b, Act y), (n, a, b, y))                                           \
  X(MaxPoolForward, (const WindowShape& s, Act x, Act y), (s, x, y))                               \
  X(MaxPoolBackward, (const WindowShape& s, Act x, Act dy, Act dx, Write dx_write),                \
    (s, x, dy, dx, dx_write))                                                                      \
  X(AvgPoolForward, (const WindowShape& s, Act x, Act y), (s, x, y))                               \
  X(AvgPoolBackward, (const WindowShape& s, Act dy, Act dx, Write dx_write),                       \
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
    (num_ids, vocab, dim, ids, dy, dtable, param_write))                                           \
  X(PairwiseDotForward, (int64_t batch, int64_t vectors, int64_t dim, Act x, Act y),               \
    (batch, vectors, dim, x, y))                                                                   \
  X(PairwiseDotBackward, (int64_t batch, int64_t vectors, int64_t dim, Act x, Act dy, Act dx),     \
    (batch, vectors, dim, x, dy, dx))

#define DOWNPOUR_UNPAREN(...) __VA_ARGS__

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

#define DOWNPOUR_DECLARE_OP(name, params, args) virtual absl::Status name params = 0;
  DOWNPOUR_BACKEND_OPS(DOWNPOUR_DECLARE_OP)
#undef DOWNPOUR_DECLARE_OP

  // `relu`: y = max(0, conv + bias) (the ReLU that follows, fused).
  virtual absl::Status Conv2dForward(const WindowShape& s, Act x, const float* w, const float* bias,
                                     Act y, bool relu) = 0;
  virtual absl::Status Conv2dBackward(const WindowShape& s, Act x, const float* w, Act dy, Act dx,
                                      Write dx_write, float* dw, float* dbias,
                                      Write param_write) = 0;

  // The loss counters: reset, added to by SoftmaxCrossEntropy, read (which
  // waits for the device). dlogits (when not null) carry the loss scale
  // `dlogits_scale`.
  virtual absl::Status ResetLoss() = 0;
  virtual absl::Status SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                           const int32_t* labels, Act dlogits,
                                           float dlogits_scale) = 0;
  virtual absl::StatusOr<LossStats> ReadLoss() = 0;

  // Loss scaling: g *= inv_scale with non-finite values noted in a flag
  // that ResetNonFinite clears and ReadNonFinite reads (waits).
  virtual absl::Status UnscaleCheckFinite(int64_t n, float inv_scale, float* g) = 0;
  virtual absl::Status ResetNonFinite() = 0;
  virtual absl::StatusOr<bool> ReadNonFinite() = 0;

  // Sparse embeddings pooled where the model computes (the worker's
  // SparseBatch::Pool and RowGradients moved to the device): each table's
  // slot of `features` (fp32, slot-major, `batch` examples; Pool's sums bit
  // for bit), then after backward each row's gradient (PooledTable::grads)
  // from the features' gradient (in kPoolLanes partial sums, so within
  // rounding of RowGradients'). `tables`: num_tables PooledTable in the
  // compute memory; `most_work`: the largest batch * dim (PoolRows) or the
  // most rows (PoolRowsBackward) among them.
  virtual absl::Status PoolRows(int64_t batch, int num_tables, const PooledTable* tables,
                                int64_t most_work, float* features) = 0;
  virtual absl::Status PoolRowsBackward(int num_tables, const PooledTable* tables,
                                        int64_t most_work, const float* features_grad) = 0;

  // -1 for the CPU, else the CUDA device.
  virtual int device() const = 0;
  bool gpu() const { return device() >= 0; }
  // Bytes of one activation element: 4, or 2 where they are bf16/fp16.
  virtual size_t activation_bytes() const = 0;
  // y = the n floats at x in the activation type (the model input).
  virtual absl::Status ToActivations(int64_t n, const float* x, Act y) = 0;
  // n floats (gradients) set to zero.
  virtual absl::Status ZeroFloats(int64_t n, float* x) = 0;

  // Scratch planning (a GPU's workspace; nothing on the CPU): the most any
  // call asked for since the reset; memory lent as the scratch of the calls
  // that follow, until returned (it must stay valid until the work queued
  // with it has run; a call that needs more takes the backend's own back);
  // the backend's own scratch freed.
  virtual void ResetWorkspacePeak() = 0;
  virtual int64_t WorkspacePeak() const = 0;
  virtual void LendWorkspace(void* memory, size_t bytes) = 0;
  virtual void ReturnWorkspace() = 0;
  virtual absl::Status ReleaseWorkspace() = 0;
  // Compute memory the backend holds for itself: a GPU's scratch, and its
  // reduced weight copies.
  virtual int64_t workspace_bytes() const = 0;
  virtual int64_t weight_copy_bytes() const = 0;

  // Binds the calling thread to this backend's device (a no-op on the CPU).
  // The kernels run on the current device, so a thread other than the one
  // that created the backend calls this first.
  virtual absl::Status MakeCurrent() = 0;

  // Memory the kernels read and write (ResourceExhausted naming the size
  // when there is none left).
  virtual absl::StatusOr<DeviceMemory> Allocate(size_t bytes) = 0;
  // Host memory that copies to and from the device fast.
  virtual absl::StatusOr<DeviceMemory> AllocateHost(size_t bytes) = 0;
  // Queued copies between host and device memory, in order with the ops
  // (plain copies on the CPU).
  virtual absl::Status ToDevice(void* device, const void* host, size_t bytes) = 0;
  virtual absl::Status ToHost(void* host, const void* device, size_t bytes) = 0;
  // A host-to-device copy queued beside the ops (a GPU's copy stream), so an
  // input batch goes up while other work runs; ops queued after
  // JoinUploads() wait for every upload queued before it. `host` is
  // AllocateHost memory, untouched until the upload has run.
  virtual absl::Status UploadAside(void* device, const void* host, size_t bytes) = 0;
  virtual absl::Status JoinUploads() = 0;
  // A device-to-host copy queued after every op queued so far, on a stream
  // of its own (a GPU's download stream), so the ops queued after it do not
  // wait for it: a layer's gradient goes down while backward goes on.
  // Returns a ticket for WaitDownload; `host` is AllocateHost memory.
  virtual absl::StatusOr<int64_t> DownloadAside(void* host, const void* device, size_t bytes) = 0;
  // Blocks until download `ticket` (and every one queued before it) has
  // landed. Thread-safe: any thread may wait while another queues work.
  virtual absl::Status WaitDownload(int64_t ticket) = 0;
  // Waits for all queued work.
  virtual absl::Status Synchronize() = 0;

  // The same optimizer update on every tensor (one fused launch on a GPU;
  // the tensors of a model never move, so a backend may keep their
  // descriptors between calls).
  virtual absl::Status ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                                      const std::vector<TensorUpdate>& tensors) = 0;

  // bf16/fp16 on a GPU: reduced copies of the weights in `ranges` (start,
  // elements) that dense layers and convolutions read, refreshed by
  // CastReducedWeights (once per forward pass); nothing on the CPU or in
  // fp32.
  virtual absl::Status RegisterReducedWeights(
      const std::vector<std::pair<const float*, int64_t>>& ranges) = 0;
  virtual absl::Status CastReducedWeights() = 0;
  // The same for the one registered range that starts at `w` (nothing when
  // none does): a forward that starts on its first layers before the later
  // layers' weights have arrived refreshes each layer's copy as it goes.
  virtual absl::Status CastReducedWeight(const float* w) = 0;

  // Profiling: Mark(i) notes when the work queued so far ends (at the time
  // it runs); MarkMs(i, j) is the time from mark i to mark j, after a
  // Synchronize.
  virtual absl::Status Mark(int slot) = 0;
  virtual absl::StatusOr<double> MarkMs(int from, int to) = 0;
};

// A range of floats of every rank's buffer in a DeviceGroup collective, and
// the rank that owns it (the source of a broadcast, the root of a reduce).
struct DeviceShare {
  int64_t offset = 0;
  int64_t count = 0;
  int owner = 0;
};

// Collectives over backends on distinct GPUs (NCCL): a worker's replicas
// move parameters and gradients between their devices without the host.
// Every collective is issued for all ranks at once from the calling thread
// and queued on each rank's backend stream, in order with its ops; calls
// return without waiting. Rank r is the r-th backend given to
// CreateDeviceGroup. After a collective fails the group is not trusted
// again: every later one returns that error.
//
// Thread-compatible. Owns the communicators; buffers stay the caller's.
class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  virtual int size() const = 0;
  // For each share: copies its floats from the owner's buffer into every
  // other rank's, at the same place (one share owned by rank 0 is a plain
  // broadcast; one per rank, an all-gather).
  // REQUIRES: buffers has size() entries, buffers[r] in rank r's memory
  // holds every share's floats; shares lie inside them, owners < size().
  virtual absl::Status Broadcast(const std::vector<float*>& buffers,
                                 const std::vector<DeviceShare>& shares) = 0;
  // For each share: its floats in the owner's buffer become the sum over r
  // of weights[r] * rank r's (a reduce, or over one share per rank a
  // reduce-scatter); the other ranks' are left as they were. Each rank's
  // weight is applied on its own device by the reduction itself.
  // REQUIRES: as Broadcast, and weights has size() entries.
  virtual absl::Status WeightedSum(const std::vector<float*>& buffers,
                                   const std::vector<float>& weights,
                                   const std::vector<DeviceShare>& shares) = 0;
};

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_BACKEND_H_
