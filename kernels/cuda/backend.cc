#include "kernels/cuda/backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/status.h"
#include "kernels/cuda/weights.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

// DownloadAside's tickets in flight at most (a step queues one per layer).
constexpr int64_t kDownloadTickets = 256;

// DeviceMemory's free functions.
void FreeDevice(void* ptr) { cudaFree(ptr); }
void FreeHost(void* ptr) { cudaFreeHost(ptr); }

// f(T{}) with T the activation element type of `precision`.
template <typename F>
absl::Status ForActivationType(ComputePrecision precision, F&& f) {
  switch (precision) {
    case ComputePrecision::kBf16:
      return f(__nv_bfloat16{});
    case ComputePrecision::kFp16:
      return f(__half{});
    case ComputePrecision::kFp32:
      break;
  }
  return f(float{});
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  auto backend = std::unique_ptr<CudaBackend>(new CudaBackend());
  backend->cap_ = CapFor(options, absl::StrCat("cuda:", options.device));
  // Small at first: convolutions grow it to what their fastest algorithms
  // need (conv_plan.h).
  ASSIGN_OR_RETURN(backend->ctx_, CudaContext::Create(options.device, size_t{16} << 20));
  backend->ctx_->conv_layout = options.conv_layout;
  backend->ctx_->conv_graph = options.conv_graph;
  backend->ctx_->compute = options.precision;
  backend->ctx_->tf32 = options.tf32;
  // Loss sum, correct count, then the non-finite flag at byte 16.
  ASSIGN_OR_RETURN(backend->counters_, backend->Allocate(32));
  ASSIGN_OR_RETURN(backend->counters_host_, backend->AllocateHost(32));
  // Input batches go up on their own stream, beside the parameters on the
  // compute stream; JoinUploads makes the compute stream wait for them.
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&backend->copy_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&backend->uploaded_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&backend->download_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&backend->download_mark_, cudaEventDisableTiming));
  // Created up front: WaitDownload reads the ring from other threads, which
  // sleep while they wait (blocking sync) instead of spinning on the cores
  // the thread queueing the step and the exchange need.
  backend->downloaded_.resize(kDownloadTickets);
  for (cudaEvent_t& e : backend->downloaded_) {
    CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
  }
  return backend;
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const BackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

CudaBackend::~CudaBackend() {
  // The memory freed below (counters, optimizer plan) may still be in use by
  // queued work, as may the pages an upload reads.
  if (ctx_ != nullptr && ctx_->stream != nullptr) cudaStreamSynchronize(ctx_->stream);
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  if (uploaded_ != nullptr) cudaEventDestroy(uploaded_);
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (download_stream_ != nullptr) {
    cudaStreamSynchronize(download_stream_);
    cudaStreamDestroy(download_stream_);
  }
  if (download_mark_ != nullptr) cudaEventDestroy(download_mark_);
  for (cudaEvent_t e : downloaded_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

#define DOWNPOUR_CUDA_OP(name, params, args)                          \
  absl::Status CudaBackend::name params {                             \
    return ForActivationType(ctx_->compute, [&](auto tag) {           \
      return cuda::name<decltype(tag)>(*ctx_, DOWNPOUR_UNPAREN args); \
    });                                                               \
  }
DOWNPOUR_BACKEND_OPS(DOWNPOUR_CUDA_OP)
#undef DOWNPOUR_CUDA_OP

absl::Status CudaBackend::Conv2dForward(const WindowShape& s, Act x, const float* w,
                                        const float* bias, Act y, bool relu) {
  return ForActivationType(ctx_->compute, [&](auto tag) {
    return cuda::Conv2dForward<decltype(tag)>(*ctx_, s, x, w, bias, y, relu);
  });
}

absl::Status CudaBackend::Conv2dBackward(const WindowShape& s, Act x, const float* w, Act dy,
                                         Act dx, Write dx_write, float* dw, float* dbias,
                                         Write param_write) {
  return ForActivationType(ctx_->compute, [&](auto tag) {
    return cuda::Conv2dBackward<decltype(tag)>(*ctx_, s, x, w, dy, dx, dx_write, dw, dbias,
                                               param_write);
  });
}

absl::Status CudaBackend::ResetLoss() {
  return FromCuda(cudaMemsetAsync(counters_.as<void>(), 0, 16, ctx_->stream), "cudaMemsetAsync");
}

absl::Status CudaBackend::SoftmaxCrossEntropy(int64_t batch, int64_t classes, Act logits,
                                              const int32_t* labels, Act dlogits,
                                              float dlogits_scale) {
  return ForActivationType(ctx_->compute, [&](auto tag) {
    return cuda::SoftmaxCrossEntropyAsync<decltype(tag)>(
        *ctx_, batch, classes, logits, labels, dlogits, dlogits_scale, counters_.as<double>(),
        reinterpret_cast<unsigned long long*>(counters_.as<double>() + 1));
  });
}

absl::StatusOr<LossStats> CudaBackend::ReadLoss() {
  RETURN_IF_ERROR(ToHost(counters_host_.as<void>(), counters_.as<void>(), 16));
  RETURN_IF_ERROR(Synchronize());
  LossStats stats;
  stats.loss_sum = counters_host_.as<double>()[0];
  unsigned long long correct = 0;
  std::memcpy(&correct, counters_host_.as<double>() + 1, sizeof(correct));
  stats.correct = static_cast<int64_t>(correct);
  return stats;
}

absl::Status CudaBackend::UnscaleCheckFinite(int64_t n, float inv_scale, float* g) {
  return cuda::UnscaleCheckFinite(*ctx_, n, inv_scale, g, Flag());
}

absl::Status CudaBackend::ResetNonFinite() {
  return FromCuda(cudaMemsetAsync(Flag(), 0, sizeof(int), ctx_->stream), "cudaMemsetAsync");
}

absl::StatusOr<bool> CudaBackend::ReadNonFinite() {
  int* host = reinterpret_cast<int*>(counters_host_.as<char>() + 16);
  RETURN_IF_ERROR(ToHost(host, Flag(), sizeof(int)));
  RETURN_IF_ERROR(Synchronize());
  return *host != 0;
}

size_t CudaBackend::activation_bytes() const {
  return ctx_->compute == ComputePrecision::kFp32 ? sizeof(float) : 2;
}

absl::Status CudaBackend::ToActivations(int64_t n, const float* x, Act y) {
  return ForActivationType(
      ctx_->compute, [&](auto tag) { return cuda::Convert<float, decltype(tag)>(*ctx_, n, x, y); });
}

absl::Status CudaBackend::ZeroFloats(int64_t n, float* x) { return cuda::Zero<float>(*ctx_, n, x); }

absl::Status CudaBackend::PoolRows(int64_t batch, int num_tables, const PooledTable* tables,
                                   int64_t most_work, float* features) {
  return cuda::PoolRows(*ctx_, batch, num_tables, tables, most_work, features);
}

absl::Status CudaBackend::PoolRowsBackward(int num_tables, const PooledTable* tables,
                                           int64_t most_work, const float* features_grad) {
  return cuda::PoolRowsBackward(*ctx_, num_tables, tables, most_work, features_grad);
}

int64_t CudaBackend::workspace_bytes() const {
  return static_cast<int64_t>(ctx_->owned_workspace_bytes());
}

int64_t CudaBackend::weight_copy_bytes() const {
  return static_cast<int64_t>(ReducedWeightBytes(*ctx_));
}

absl::StatusOr<DeviceMemory> CudaBackend::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceMemory();
  RETURN_IF_ERROR(cap_->Take(bytes, workspace_bytes() + weight_copy_bytes()));
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
    cudaGetLastError();
    cap_->Give(bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory"));
  }
  return cap_->Track(ptr, bytes, &FreeDevice);
}

absl::StatusOr<DeviceMemory> CudaBackend::AllocateHost(size_t bytes) {
  if (bytes == 0) return DeviceMemory();
  void* ptr = nullptr;
  if (cudaMallocHost(&ptr, bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of pinned host memory"));
  }
  return DeviceMemory(ptr, bytes, &FreeHost);
}

absl::Status CudaBackend::ToDevice(void* device, const void* host, size_t bytes) {
  return FromCuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, ctx_->stream),
                  "cudaMemcpyAsync to the device");
}

absl::Status CudaBackend::ToHost(void* host, const void* device, size_t bytes) {
  return FromCuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, ctx_->stream),
                  "cudaMemcpyAsync to the host");
}

absl::Status CudaBackend::UploadAside(void* device, const void* host, size_t bytes) {
  return FromCuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, copy_stream_),
                  "cudaMemcpyAsync on the copy stream");
}

absl::Status CudaBackend::JoinUploads() {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_, copy_stream_));
  return FromCuda(cudaStreamWaitEvent(ctx_->stream, uploaded_, 0), "cudaStreamWaitEvent");
}

absl::StatusOr<int64_t> CudaBackend::DownloadAside(void* host, const void* device, size_t bytes) {
  const int64_t ticket = next_ticket_++;
  if (ticket >= kDownloadTickets) {
    // The ring's event for this ticket was last recorded kDownloadTickets
    // ago; whoever waits on it now must not see that one.
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(downloaded_[ticket % kDownloadTickets]));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(download_mark_, ctx_->stream));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(download_stream_, download_mark_, 0));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, download_stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(downloaded_[ticket % kDownloadTickets], download_stream_));
  return ticket;
}

absl::Status CudaBackend::WaitDownload(int64_t ticket) {
  if (ticket < 0 || ticket >= next_ticket_.load()) {
    return absl::InvalidArgumentError(absl::StrCat("no download ", ticket, " was queued"));
  }
  // A ticket whose event has been recorded again since has landed (the
  // ring waits for it first); waiting on the newer one only waits longer.
  return FromCuda(cudaEventSynchronize(downloaded_[ticket % kDownloadTickets]),
                  "waiting for a download");
}

absl::Status CudaBackend::ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp,
                                         const std::vector<TensorUpdate>& tensors) {
  // The tensors of a model never move: their descriptors go up once.
  if (plan_ == nullptr || !SameTensors(tensors)) {
    ASSIGN_OR_RETURN(plan_, MultiTensorPlan::Create(*ctx_, tensors));
    plan_tensors_ = tensors;
  }
  return plan_->Apply(*ctx_, kind, hp);
}

bool CudaBackend::SameTensors(const std::vector<TensorUpdate>& tensors) const {
  if (tensors.size() != plan_tensors_.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorUpdate &a = tensors[i], &b = plan_tensors_[i];
    if (a.grad != b.grad || a.param != b.param || a.slots[0] != b.slots[0] ||
        a.slots[1] != b.slots[1] || a.n != b.n) {
      return false;
    }
  }
  return true;
}

absl::Status CudaBackend::RegisterReducedWeights(
    const std::vector<std::pair<const float*, int64_t>>& ranges) {
  return cuda::RegisterReducedWeights(*ctx_, ranges);
}

absl::Status CudaBackend::CastReducedWeights() { return cuda::CastReducedWeights(*ctx_); }

absl::Status CudaBackend::CastReducedWeight(const float* w) {
  return cuda::CastReducedWeight(*ctx_, w);
}

absl::Status CudaBackend::Mark(int slot) {
  while (static_cast<size_t>(slot) >= marks_.size()) {
    cudaEvent_t e = nullptr;
    RETURN_IF_ERROR(FromCuda(cudaEventCreate(&e), "cudaEventCreate"));
    marks_.push_back(e);
  }
  return FromCuda(cudaEventRecord(marks_[slot], ctx_->stream), "cudaEventRecord");
}

absl::StatusOr<double> CudaBackend::MarkMs(int from, int to) {
  float ms = 0.f;
  RETURN_IF_ERROR(
      FromCuda(cudaEventElapsedTime(&ms, marks_.at(from), marks_.at(to)), "cudaEventElapsedTime"));
  return static_cast<double>(ms);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
