// Coordinator: what nodes and operators ask of the control plane —
// membership (register, heartbeat), the job queue and each job's state
// machine (PENDING -> RUNNING -> SUCCEEDED / FAILED / STOPPED), and workers'
// progress reports.
//
// CoordinatorState (control/coordinator_state.h) implements it in process;
// rpc/ adapts it to gRPC (CoordinatorService) and back (RemoteCoordinator),
// so a node agent or downpourctl cannot tell a local coordinator from a
// remote one, and their tests need no sockets. It lives in namespace
// downpour::control because the gRPC service generated from
// proto/coordinator_service.proto is downpour::Coordinator.
//
// Thread-safety: implementations are thread-safe.
#ifndef DOWNPOUR_CONTROL_COORDINATOR_H_
#define DOWNPOUR_CONTROL_COORDINATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

class Coordinator {
 public:
  virtual ~Coordinator() = default;

  virtual absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node) = 0;
  virtual absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) = 0;
  virtual absl::StatusOr<std::vector<NodeInfo>> ListNodes() = 0;

  // `job_id` empty: the coordinator picks one. Returns the job as submitted;
  // InvalidArgument naming the field for a bad spec.
  // With request.init_from, the job starts from those weights
  // (InvalidArgument naming a tensor that does not fit the model).
  virtual absl::StatusOr<JobStatus> SubmitJob(const SubmitJobRequest& request) = 0;
  absl::StatusOr<JobStatus> SubmitJob(const JobSpec& spec, const std::string& job_id) {
    SubmitJobRequest request;
    *request.mutable_spec() = spec;
    request.set_job_id(job_id);
    return SubmitJob(request);
  }
  // In submission order, each job a summary: the lists that grow with the
  // model, the data and the job's history — placement.partitions,
  // data_files, the workers' data, events, restore and all evaluations but
  // the newest — are left out (GetJob has them), so a long job history
  // lists within a message.
  virtual absl::StatusOr<std::vector<JobStatus>> ListJobs() = 0;
  virtual absl::StatusOr<JobStatus> GetJob(const std::string& job_id) = 0;
  // Long poll: returns once the job's version exceeds `known_version`, or
  // after `timeout` with its current state.
  virtual absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                             absl::Duration timeout) = 0;
  virtual absl::StatusOr<JobStatus> StopJob(const std::string& job_id) = 0;
  virtual absl::StatusOr<ReportProgressResponse> ReportProgress(
      const ReportProgressRequest& request) = 0;

  // Checkpoints. CheckpointJob asks for one of a running job now (taken at
  // rank 0's next step boundary); FailedPrecondition when the job is not
  // running or its state is not saved (no --checkpoint_root). Returns the
  // job with checkpoint_requested_ms set.
  virtual absl::StatusOr<JobStatus> CheckpointJob(const std::string& job_id) = 0;
  // Starts a FAILED or STOPPED job again from its newest complete checkpoint
  // (a damaged one is refused, naming the file, and the one before it
  // tried); FailedPrecondition when it has none.
  virtual absl::StatusOr<JobStatus> ResumeJob(const std::string& job_id) = 0;
  // The job's model at its checkpoint at `step` (0: the newest complete
  // one) as safetensors bytes (control/export.h has the layouts).
  virtual absl::StatusOr<std::string> ExportJob(const std::string& job_id, int64_t step,
                                                bool native_layout) = 0;

  // Operator's tools. DescribeJob: the job and its progress history.
  virtual absl::StatusOr<JobDescription> DescribeJob(const std::string& job_id) = 0;
  // Removes an ended job from the store; FailedPrecondition while it is
  // pending or running (stop it first). With `checkpoints`, its checkpoint
  // files go first (the job stays when they cannot).
  virtual absl::Status DeleteJob(const std::string& job_id, bool checkpoints) = 0;
  // `cordoned`: the node gets no new work and its running jobs move off it
  // as recovery allows (a worker's rank to a free worker, a shard's jobs
  // after a checkpoint); false: it takes work again. Returns the node.
  virtual absl::StatusOr<NodeInfo> CordonNode(const std::string& node_id, bool cordoned) = 0;
  // The job's log lines after request.after_sequence, waiting up to
  // request.timeout_ms for one.
  virtual absl::StatusOr<JobLogsResponse> JobLogs(const JobLogsRequest& request) = 0;
};

// Whether a job in `state` has ended (SUCCEEDED, FAILED or STOPPED).
inline bool IsTerminal(JobState state) {
  return state == SUCCEEDED || state == FAILED || state == STOPPED;
}

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_COORDINATOR_H_
