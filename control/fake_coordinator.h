// FakeCoordinator: an in-process control::Coordinator for the tests of what
// talks to a coordinator (node agents, shard and worker runtimes), without a
// job queue or sockets: it hands every node the tasks a test sets for it,
// answers heartbeats as a real coordinator would (re-register after a
// restart it does not know) and a worker's listing of its job's record
// files with the rank's first share (spec/data_assignment.h), records registrations and progress
// reports, and can be taken down (Unavailable) and forget its nodes.
//
// Thread-safe. Test-only (testonly in BUILD).
#ifndef DOWNPOUR_CONTROL_FAKE_COORDINATOR_H_
#define DOWNPOUR_CONTROL_FAKE_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/coordinator.h"

namespace downpour {
namespace control {

class FakeCoordinator : public Coordinator {
 public:
  absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override;
  absl::StatusOr<ReportProgressResponse> ReportProgress(
      const ReportProgressRequest& request) override;
  // The rest is a job queue's, which the fake does not have: Unimplemented.
  absl::StatusOr<std::vector<NodeInfo>> ListNodes() override;
  using Coordinator::SubmitJob;
  absl::StatusOr<JobStatus> SubmitJob(const SubmitJobRequest& request) override;
  absl::StatusOr<std::vector<JobStatus>> ListJobs() override;
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id) override;
  absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                     absl::Duration timeout) override;
  absl::StatusOr<JobStatus> StopJob(const std::string& job_id) override;
  absl::StatusOr<JobStatus> CheckpointJob(const std::string& job_id) override;
  absl::StatusOr<JobStatus> ResumeJob(const std::string& job_id) override;
  absl::StatusOr<std::string> ExportJob(const std::string& job_id, int64_t step,
                                        bool native_layout) override;
  absl::StatusOr<JobDescription> DescribeJob(const std::string& job_id) override;
  absl::Status DeleteJob(const std::string& job_id, bool checkpoints) override;
  absl::StatusOr<NodeInfo> CordonNode(const std::string& node_id, bool cordoned) override;
  absl::StatusOr<JobLogsResponse> JobLogs(const JobLogsRequest& request) override;

  // The tasks node `node_id`'s heartbeats hand it from now on (a task without
  // a step target gets the spec's `steps`, as the coordinator fills it).
  void SetTasks(const std::string& node_id, std::vector<Task> tasks);
  // Whether rank 0's tasks always say it evaluates, as the coordinator's do
  // while rank 0 is there (the default), or say what SetTasks gave.
  void SetRankZeroEvaluates(bool evaluates);
  // Down: every call fails with Unavailable.
  void SetUp(bool up);
  // Forgets every node, as a coordinator that lost its state would: the
  // next heartbeat of each is told to re-register.
  void ForgetNodes();

  int registrations();
  NodeInfo last_registered();
  std::vector<ReportProgressRequest> reports();
  // Waits up to `timeout` until `n` more heartbeats (answered or not) have
  // arrived; false if they did not.
  bool AwaitHeartbeats(int n, absl::Duration timeout = absl::Seconds(20));
  // Waits up to `timeout` until a report satisfying `done` has arrived.
  bool AwaitReport(const std::function<bool(const ReportProgressRequest&)>& done,
                   absl::Duration timeout = absl::Seconds(60));

 private:
  bool HeartbeatsReached() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  bool up_ ABSL_GUARDED_BY(mu_) = true;
  bool rank_zero_evaluates_ ABSL_GUARDED_BY(mu_) = true;
  std::map<std::string, int64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Task>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<NodeInfo> registered_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportProgressRequest> reports_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int awaited_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_FAKE_COORDINATOR_H_
