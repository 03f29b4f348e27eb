// Collectives between the GPUs of one process over NCCL: the DeviceGroup of
// kernels/backend.h over CUDA backends, and the communicators beneath it.
//
// NcclCommunicators: one NCCL communicator per local GPU of a worker,
// created together (ncclCommInitAll) so that one host thread can drive
// collectives over all of them. Rank r is the r-th device given to Create.
//
// Every collective is issued for all ranks at once, inside one
// ncclGroupStart/ncclGroupEnd, from the calling thread: NCCL's rule for one
// thread driving several devices, and the reason a caller cannot issue a
// collective on some ranks and not on others (which would leave the issued
// ones waiting forever). The work is queued on the streams given and the
// calls return without waiting for it.
//
// After a collective fails the communicators are not trusted again: every
// later one returns that error, and destruction aborts them (ncclCommAbort)
// instead of waiting for work that may never finish.
//
// Thread safety: thread-compatible (one thread at a time). Owns the
// communicators; the buffers and streams passed in stay the caller's.
#ifndef DOWNPOUR_KERNELS_CUDA_COLLECTIVES_H_
#define DOWNPOUR_KERNELS_CUDA_COLLECTIVES_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace downpour {
namespace kernels {
namespace cuda {

class NcclCommunicators {
 public:
  // One communicator per entry of `devices` (CUDA device numbers, distinct).
  // InvalidArgument for fewer than two devices or a repeated one; the NCCL
  // error otherwise.
  static absl::StatusOr<std::unique_ptr<NcclCommunicators>> Create(const std::vector<int>& devices);

  ~NcclCommunicators();
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }

  // DeviceGroup::Broadcast and WeightedSum over these communicators: every
  // share's call for rank r is queued on streams[r], all inside one group.
  // REQUIRES: buffers and streams have size() entries, streams[r] belongs
  // to rank r's device, and as DeviceGroup's.
  absl::Status Broadcast(const std::vector<float*>& buffers, const std::vector<DeviceShare>& shares,
                         const std::vector<cudaStream_t>& streams);
  absl::Status WeightedSum(const std::vector<float*>& buffers, const std::vector<float>& weights,
                           const std::vector<DeviceShare>& shares,
                           const std::vector<cudaStream_t>& streams);

 private:
  explicit NcclCommunicators(std::vector<ncclComm_t> comms) : comms_(std::move(comms)) {}
  absl::Status CheckArguments(const std::vector<float*>& buffers,
                              const std::vector<DeviceShare>& shares,
                              const std::vector<cudaStream_t>& streams) const;

  std::vector<ncclComm_t> comms_;
  // The first failed collective; OK while every one has succeeded.
  absl::Status broken_;
};

// The DeviceGroup over `backends` (CUDA backends on distinct devices, not
// owned; they must outlive the group): rank r is backends[r], and its part
// of every collective is queued on that backend's compute stream, in order
// with its ops. The calling thread's current device is left as it was, so a
// caller makes no CUDA call around a collective. kernels/factory.h's
// CreateDeviceGroup checks the backends and calls this.
// REQUIRES: every backend is a CudaBackend (backend.h).
absl::StatusOr<std::unique_ptr<DeviceGroup>> CreateNcclGroup(
    const std::vector<ComputeBackend*>& backends);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_COLLECTIVES_H_
