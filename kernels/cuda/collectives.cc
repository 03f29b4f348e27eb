#include "kernels/cuda/collectives.h"

#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/status.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

// Queues one collective on every rank as a single group: `issue(r)` makes
// rank r's call. The group is closed whatever happened inside it (an open
// group would swallow the thread's next NCCL calls); a failed call inside
// makes NCCL drop the whole group at ncclGroupEnd, so no rank is left
// waiting for one that never joined.
absl::Status IssueOnEveryRank(int ranks, absl::string_view call,
                              absl::FunctionRef<ncclResult_t(int)> issue) {
  RETURN_IF_ERROR(FromNccl(ncclGroupStart(), "ncclGroupStart"));
  absl::Status status;
  for (int r = 0; r < ranks && status.ok(); ++r) {
    status = FromNccl(issue(r), absl::StrCat(call, " (rank ", r, ")"));
  }
  absl::Status end = FromNccl(ncclGroupEnd(), absl::StrCat("ncclGroupEnd of ", call));
  return status.ok() ? end : status;
}

// Restores the calling thread's current device when it goes out of scope:
// NCCL switches devices to reach each rank's, and the caller's kernels keep
// launching on the device it had made current.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() { saved_ok_ = cudaGetDevice(&saved_) == cudaSuccess; }
  ~KeepCurrentDevice() {
    if (saved_ok_) cudaSetDevice(saved_);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int saved_ = 0;
  bool saved_ok_ = false;
};

class NcclGroup final : public DeviceGroup {
 public:
  NcclGroup(std::unique_ptr<NcclCommunicators> comms, std::vector<cudaStream_t> streams)
      : comms_(std::move(comms)), streams_(std::move(streams)) {}

  int size() const override { return comms_->size(); }

  absl::Status Broadcast(const std::vector<float*>& buffers,
                         const std::vector<DeviceShare>& shares) override {
    KeepCurrentDevice keep;
    return comms_->Broadcast(buffers, shares, streams_);
  }
  absl::Status WeightedSum(const std::vector<float*>& buffers, const std::vector<float>& weights,
                           const std::vector<DeviceShare>& shares) override {
    KeepCurrentDevice keep;
    return comms_->WeightedSum(buffers, weights, shares, streams_);
  }

 private:
  std::unique_ptr<NcclCommunicators> comms_;
  std::vector<cudaStream_t> streams_;  // Rank r's backend's compute stream.
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicators>> NcclCommunicators::Create(
    const std::vector<int>& devices) {
  const std::string listed = absl::StrJoin(devices, ",");
  if (devices.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicators need two or more CUDA devices, got [", listed, "]"));
  }
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicators need distinct CUDA devices, got [", listed, "]"));
  }
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  RETURN_IF_ERROR(
      FromNccl(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()),
               absl::StrCat("ncclCommInitAll over CUDA devices ", listed)));
  return std::unique_ptr<NcclCommunicators>(new NcclCommunicators(std::move(comms)));
}

NcclCommunicators::~NcclCommunicators() {
  // Destroy flushes the communicator's work, which after a failed call may
  // wait for a peer that never comes; abort does not wait.
  const bool abort = !broken_.ok();
  for (ncclComm_t comm : comms_) {
    absl::Status s = abort ? FromNccl(ncclCommAbort(comm), "ncclCommAbort")
                           : FromNccl(ncclCommDestroy(comm), "ncclCommDestroy");
    if (!s.ok()) Log(s.message());
  }
}

absl::Status NcclCommunicators::CheckArguments(const std::vector<float*>& buffers,
                                               const std::vector<DeviceShare>& shares,
                                               const std::vector<cudaStream_t>& streams) const {
  if (buffers.size() != comms_.size() || streams.size() != comms_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a collective over ", comms_.size(),
                                                   " ranks was given ", buffers.size(),
                                                   " buffers and ", streams.size(), " streams"));
  }
  for (const DeviceShare& share : shares) {
    if (share.offset < 0 || share.count < 0 || share.owner < 0 || share.owner >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a collective over ", comms_.size(), " ranks was given a share of ",
                       share.count, " floats at ", share.offset, " owned by rank ", share.owner));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicators::Broadcast(const std::vector<float*>& buffers,
                                          const std::vector<DeviceShare>& shares,
                                          const std::vector<cudaStream_t>& streams) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckArguments(buffers, shares, streams));
  absl::Status status = IssueOnEveryRank(size(), "ncclBroadcast", [&](int r) {
    for (const DeviceShare& share : shares) {
      if (share.count == 0) continue;
      float* at = buffers[r] + share.offset;
      const ncclResult_t result = ncclBroadcast(at, at, static_cast<size_t>(share.count), ncclFloat,
                                                share.owner, comms_[r], streams[r]);
      if (result != ncclSuccess) return result;
    }
    return ncclSuccess;
  });
  if (!status.ok()) broken_ = status;
  return status;
}

absl::Status NcclCommunicators::WeightedSum(const std::vector<float*>& buffers,
                                            const std::vector<float>& weights,
                                            const std::vector<DeviceShare>& shares,
                                            const std::vector<cudaStream_t>& streams) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckArguments(buffers, shares, streams));
  if (weights.size() != comms_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a weighted sum over ", comms_.size(), " ranks was given ", weights.size(), " weights"));
  }
  // One operator per rank, each multiplying by that rank's weight (read
  // now, from the host: ncclScalarHostImmediate). An operator may go as soon
  // as the last call given it has returned, i.e. after ncclGroupEnd.
  std::vector<ncclRedOp_t> ops;
  ops.reserve(comms_.size());
  absl::Cleanup destroy_ops = [&] {
    for (size_t r = 0; r < ops.size(); ++r) {
      absl::Status s = FromNccl(ncclRedOpDestroy(ops[r], comms_[r]), "ncclRedOpDestroy");
      if (!s.ok()) Log(s.message());
    }
  };
  for (size_t r = 0; r < comms_.size(); ++r) {
    float weight = weights[r];
    ncclRedOp_t op;
    RETURN_IF_ERROR(FromNccl(
        ncclRedOpCreatePreMulSum(&op, &weight, ncclFloat, ncclScalarHostImmediate, comms_[r]),
        "ncclRedOpCreatePreMulSum"));
    ops.push_back(op);
  }
  // In place on each share's owner; the other ranks' receive buffers are
  // not written.
  absl::Status status = IssueOnEveryRank(size(), "ncclReduce", [&](int r) {
    for (const DeviceShare& share : shares) {
      if (share.count == 0) continue;
      float* at = buffers[r] + share.offset;
      const ncclResult_t result = ncclReduce(at, at, static_cast<size_t>(share.count), ncclFloat,
                                             ops[r], share.owner, comms_[r], streams[r]);
      if (result != ncclSuccess) return result;
    }
    return ncclSuccess;
  });
  if (!status.ok()) broken_ = status;
  return status;
}

absl::StatusOr<std::unique_ptr<DeviceGroup>> CreateNcclGroup(
    const std::vector<ComputeBackend*>& backends) {
  std::vector<int> devices;
  std::vector<cudaStream_t> streams;
  for (ComputeBackend* backend : backends) {
    CudaBackend* cuda = static_cast<CudaBackend*>(backend);
    devices.push_back(cuda->device());
    streams.push_back(cuda->context().stream);
  }
  KeepCurrentDevice keep;
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicators> comms, NcclCommunicators::Create(devices));
  return std::unique_ptr<DeviceGroup>(
      std::make_unique<NcclGroup>(std::move(comms), std::move(streams)));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
