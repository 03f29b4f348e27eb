// CoordinatorClient: a small blocking client of the Coordinator service for
// operators and scripts (downpourctl is built on it).
//
// Every call carries a deadline (rpc_timeout, default 10s; WatchJob: its own
// timeout plus 5s), so nothing waits forever. gRPC errors come back as
// absl::Status with the coordinator's code and message; transport failures
// (Unavailable, DeadlineExceeded) name the coordinator's address.
//
// Thread-safe: the calls may be made from several threads at once (the
// underlying gRPC stub is thread-safe and the client holds no other state that
// changes after construction, except rpc_timeout, which is set before use).
#ifndef DOWNPOUR_CLIENT_COORDINATOR_CLIENT_H_
#define DOWNPOUR_CLIENT_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/job.pb.h"

namespace downpour {

class CoordinatorClient {
 public:
  // Opens an insecure channel to `address` (HOST:PORT) and waits up to
  // `connect_timeout` for it to connect. An unreachable coordinator gives
  // Unavailable "cannot reach coordinator at HOST:PORT within 5s".
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(
      const std::string& address, absl::Duration connect_timeout = absl::Seconds(5));

  // Wraps an existing stub (a test may pass a fake). `channel` may be null, in
  // which case WaitUntilConnected returns OK at once.
  CoordinatorClient(std::string address, std::shared_ptr<grpc::Channel> channel,
                    std::unique_ptr<Coordinator::StubInterface> stub);

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  const std::string& address() const { return address_; }

  // Deadline of each call other than WatchJob. Default 10s.
  // REQUIRES: no call is in flight.
  void set_rpc_timeout(absl::Duration timeout) { rpc_timeout_ = timeout; }

  // Waits up to `timeout` for the channel to be connected (it reconnects by
  // itself after the coordinator went away). Unavailable when it does not.
  absl::Status WaitUntilConnected(absl::Duration timeout);

  absl::StatusOr<std::vector<NodeInfo>> ListNodes();
  // `job_id` empty: the coordinator picks one. Returns the job as submitted.
  absl::StatusOr<JobStatus> SubmitJob(const JobSpec& spec, const std::string& job_id = "");
  absl::StatusOr<std::vector<JobStatus>> ListJobs();
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id);
  // Long poll: returns once the job's version exceeds `known_version`, or after
  // `timeout` with its current state.
  absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                     absl::Duration timeout);
  absl::StatusOr<JobStatus> StopJob(const std::string& job_id);

 private:
  // Converts a failed call's status; names the address and the call on
  // transport errors.
  absl::Status CallError(const grpc::Status& status, const char* method,
                         absl::Duration timeout) const;

  const std::string address_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<Coordinator::StubInterface> stub_;
  absl::Duration rpc_timeout_ = absl::Seconds(10);
};

// Reads a JobSpec written in protobuf text format from `path`. A missing file
// is NotFound naming it; a parse error is InvalidArgument
// "FILE:LINE:COL: message".
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_COORDINATOR_CLIENT_H_
