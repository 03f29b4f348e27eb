#include "kernels/cuda/stream_link.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/status.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

class CudaStreamLink final : public StreamLink {
 public:
  CudaStreamLink(std::vector<int> devices, std::vector<cudaStream_t> streams)
      : devices_(std::move(devices)), streams_(std::move(streams)), events_(devices_.size()) {}
  ~CudaStreamLink() override {
    for (std::vector<cudaEvent_t>& events : events_) {
      for (cudaEvent_t e : events) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  }
  CudaStreamLink(const CudaStreamLink&) = delete;
  CudaStreamLink& operator=(const CudaStreamLink&) = delete;

  int size() const override { return static_cast<int>(devices_.size()); }

  absl::Status Copy(int on, void* dst, int dst_rank, const void* src, int src_rank,
                    size_t bytes) override {
    RETURN_IF_ERROR(CheckRank(on));
    RETURN_IF_ERROR(CheckRank(dst_rank));
    RETURN_IF_ERROR(CheckRank(src_rank));
    if (bytes == 0) return absl::OkStatus();
    return FromCuda(
        cudaMemcpyPeerAsync(dst, devices_[dst_rank], src, devices_[src_rank], bytes, streams_[on]),
        absl::StrCat("cudaMemcpyPeerAsync from cuda:", devices_[src_rank],
                     " to cuda:", devices_[dst_rank]));
  }

  absl::Status Mark(int rank, int id) override {
    RETURN_IF_ERROR(CheckSignal(rank, id));
    return FromCuda(cudaEventRecord(events_[rank][id], streams_[rank]), "cudaEventRecord");
  }

  absl::Status Wait(int rank, int from, int id) override {
    RETURN_IF_ERROR(CheckRank(rank));
    RETURN_IF_ERROR(CheckSignal(from, id));
    return FromCuda(cudaStreamWaitEvent(streams_[rank], events_[from][id], 0),
                    "cudaStreamWaitEvent");
  }

  // Creates the events and enables peer access; changes the calling
  // thread's current device.
  absl::Status Init(int signals_per_rank);

 private:
  absl::Status CheckRank(int rank) const {
    if (rank < 0 || rank >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream link rank ", rank, " is not in [0, ", size(), ")"));
    }
    return absl::OkStatus();
  }
  absl::Status CheckSignal(int rank, int id) const {
    RETURN_IF_ERROR(CheckRank(rank));
    if (id < 0 || id >= static_cast<int>(events_[rank].size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream link signal ", id, " is not in [0, ", events_[rank].size(), ")"));
    }
    return absl::OkStatus();
  }

  const std::vector<int> devices_;
  const std::vector<cudaStream_t> streams_;
  std::vector<std::vector<cudaEvent_t>> events_;  // [rank][signal]
};

absl::Status CudaStreamLink::Init(int signals_per_rank) {
  for (size_t r = 0; r < devices_.size(); ++r) {
    const int device = devices_[r];
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    events_[r].assign(static_cast<size_t>(signals_per_rank), nullptr);
    for (cudaEvent_t& e : events_[r]) {
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    // Each device reads and writes its peers' memory directly where it can.
    for (const int peer : devices_) {
      if (peer == device) continue;
      int can = 0;
      CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device, peer));
      if (can == 0) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
        continue;
      }
      RETURN_IF_ERROR(FromCuda(
          e, absl::StrCat("cudaDeviceEnablePeerAccess from cuda:", device, " to cuda:", peer)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StreamLink>> CreateCudaStreamLink(
    const std::vector<ComputeBackend*>& backends, int signals_per_rank) {
  std::vector<int> devices;
  std::vector<cudaStream_t> streams;
  for (ComputeBackend* backend : backends) {
    CudaBackend* cuda = static_cast<CudaBackend*>(backend);
    devices.push_back(cuda->device());
    streams.push_back(cuda->context().stream);
  }
  int saved = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&saved));
  auto link = std::make_unique<CudaStreamLink>(std::move(devices), std::move(streams));
  absl::Status status = link->Init(signals_per_rank);
  cudaSetDevice(saved);
  RETURN_IF_ERROR(status);
  return std::unique_ptr<StreamLink>(std::move(link));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
