// RemoteCoordinator: a coordinator on another machine, reached over gRPC (the
// remote client of the three layers): it implements control::Coordinator, so
// a node agent or downpourctl cannot tell it from a local CoordinatorState.
//
// Every call carries a deadline (rpc_timeout, default 10s; WatchJob: its own
// timeout plus 5s), so nothing waits forever. gRPC errors come back as
// absl::Status with the coordinator's code and message; transport failures
// (Unavailable, DeadlineExceeded) name the coordinator's address and the
// call. The channel reconnects by itself, at most 2s apart, after the
// coordinator went away.
//
// Thread-safe: calls may be made from several threads at once (the gRPC stub
// is thread-safe and nothing else changes after construction, except
// rpc_timeout, which is set before use).
#ifndef DOWNPOUR_RPC_REMOTE_COORDINATOR_H_
#define DOWNPOUR_RPC_REMOTE_COORDINATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/coordinator.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "rpc/security.h"

namespace downpour {

class RemoteCoordinator : public control::Coordinator {
 public:
  // A client of the coordinator at `address` (HOST:PORT) that connects when
  // first used, with `credentials` (default: plaintext, no token).
  // InvalidArgument for an empty address.
  static absl::StatusOr<std::unique_ptr<RemoteCoordinator>> Create(
      const std::string& address, const ClientCredentials& credentials = {});
  // As Create, then waits up to `connect_timeout` for the connection: an
  // unreachable coordinator gives Unavailable "cannot reach coordinator at
  // HOST:PORT within 5s".
  static absl::StatusOr<std::unique_ptr<RemoteCoordinator>> Connect(
      const std::string& address, absl::Duration connect_timeout = absl::Seconds(5),
      const ClientCredentials& credentials = {});

  // Wraps an existing stub (a test may pass a fake). `channel` may be null, in
  // which case WaitUntilConnected returns OK at once.
  RemoteCoordinator(std::string address, std::shared_ptr<grpc::Channel> channel,
                    std::unique_ptr<downpour::Coordinator::StubInterface> stub);

  RemoteCoordinator(const RemoteCoordinator&) = delete;
  RemoteCoordinator& operator=(const RemoteCoordinator&) = delete;

  const std::string& address() const { return address_; }

  // Deadline of each call other than WatchJob, ResumeJob and ExportJob.
  // Default 10s. REQUIRES: no call is in flight.
  void set_rpc_timeout(absl::Duration timeout) { rpc_timeout_ = timeout; }

  // Waits up to `timeout` for the channel to be connected. Unavailable when
  // it does not.
  absl::Status WaitUntilConnected(absl::Duration timeout);

  absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override;
  absl::StatusOr<std::vector<NodeInfo>> ListNodes() override;
  using Coordinator::SubmitJob;
  absl::StatusOr<JobStatus> SubmitJob(const SubmitJobRequest& request) override;
  // Placements' partition lists are left out (GetJob has them).
  absl::StatusOr<std::vector<JobStatus>> ListJobs() override;
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id) override;
  absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                     absl::Duration timeout) override;
  absl::StatusOr<JobStatus> StopJob(const std::string& job_id) override;
  absl::StatusOr<JobStatus> CheckpointJob(const std::string& job_id) override;
  // Resume (which reads the checkpoint whole) and export have a deadline of
  // 10 minutes (long_call_timeout_).
  absl::StatusOr<JobStatus> ResumeJob(const std::string& job_id) override;
  absl::StatusOr<std::string> ExportJob(const std::string& job_id, int64_t step,
                                        bool native_layout) override;
  absl::StatusOr<ReportProgressResponse> ReportProgress(
      const ReportProgressRequest& request) override;
  absl::StatusOr<JobDescription> DescribeJob(const std::string& job_id) override;
  absl::Status DeleteJob(const std::string& job_id, bool checkpoints) override;
  absl::StatusOr<NodeInfo> CordonNode(const std::string& node_id, bool cordoned) override;
  // A long poll: its deadline is request.timeout_ms plus 5s.
  absl::StatusOr<JobLogsResponse> JobLogs(const JobLogsRequest& request) override;

 private:
  // Runs one unary call with `timeout` as its deadline and converts a
  // failure (naming the address and the call on transport errors).
  absl::Status CallError(const char* name, const grpc::Status& status,
                         absl::Duration timeout) const;
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Call(const char* name, Method method, const Request& request,
                                absl::Duration timeout);

  // A call's context: its deadline, and the bearer token if there is one.
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;

  const std::string address_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<downpour::Coordinator::StubInterface> stub_;
  absl::Duration rpc_timeout_ = absl::Seconds(10);
  const absl::Duration long_call_timeout_ = absl::Minutes(10);
  // Sent with every call as "authorization: Bearer ..." (empty: none).
  std::string bearer_token_;
  bool tls_ = false;  // For the hint of a failed connection.
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_REMOTE_COORDINATOR_H_
