// CoordinatorState: the network-free control plane of downpour-coordinator,
// implementing control::Coordinator — membership (register, heartbeat,
// failure detection), the job queue and job state machine, placement
// (control/scheduler.h) and data-shard assignment (worker ranks).
//
// Durability: every change of a job or node is written through the JobStore
// before it takes effect in memory (progress-only changes at most every
// progress_persist_interval), so what callers see is what a restarted
// coordinator loads. A write that fails changes nothing: a request fails with
// the store's error; a change the coordinator makes by itself (starting a
// pending job, declaring a node dead) is logged and tried again on the next
// Tick.
//
// Thread-safe: one mutex guards all state; WatchJob waits on a condition
// variable. Time comes from Options::now (tests inject a clock).
#ifndef DOWNPOUR_CONTROL_COORDINATOR_STATE_H_
#define DOWNPOUR_CONTROL_COORDINATOR_STATE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/coordinator.h"
#include "control/job_store.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

class CoordinatorState : public Coordinator {
 public:
  struct Options {
    absl::Duration heartbeat_interval = absl::Seconds(1);
    // A node silent for this long is declared dead.
    absl::Duration node_timeout = absl::Seconds(5);
    // Progress-only changes are written to the store at most this often.
    absl::Duration progress_persist_interval = absl::Seconds(2);
    // Current time; tests inject their own.
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // Loads jobs and nodes from `store`. Nodes loaded from the store count as
  // alive from now, so running jobs get node_timeout to be re-joined after a
  // coordinator restart.
  static absl::StatusOr<std::unique_ptr<CoordinatorState>> Create(Options options,
                                                                  std::unique_ptr<JobStore> store);

  absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override;
  absl::StatusOr<std::vector<NodeInfo>> ListNodes() override;
  absl::StatusOr<JobStatus> SubmitJob(const JobSpec& spec, const std::string& job_id) override;
  absl::StatusOr<std::vector<JobStatus>> ListJobs() override;
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id) override;
  // `timeout` is measured on Options::now.
  absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                     absl::Duration timeout) override;
  absl::StatusOr<JobStatus> StopJob(const std::string& job_id) override;
  absl::StatusOr<ReportProgressResponse> ReportProgress(
      const ReportProgressRequest& request) override;

  // Declares silent nodes dead (failing their running jobs), starts pending
  // jobs that now fit, and wakes watchers to look at the clock. Called
  // periodically by the daemon, and after every membership or job change.
  void Tick();

 private:
  CoordinatorState(Options options, std::unique_ptr<JobStore> store);

  struct NodeEntry {
    NodeInfo info;
    absl::Time last_heartbeat;
  };

  // Makes `updated` the job's state: bumps its version and writes it to the
  // store (always when `durable`, else at most every
  // progress_persist_interval), then wakes watchers. Nothing changes when
  // the write fails.
  absl::Status Commit(JobStatus updated, bool durable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the end of `job`.
  absl::Status FinishJob(const JobStatus& job, JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `info` the node's record (written first, like a job's).
  absl::Status SaveNode(const NodeInfo& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FailJobsOfNode(const std::string& node_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DetectDeadNodes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change the coordinator made by itself could not be written: logged
  // (once, until the store's error changes), retried by the next Tick.
  void LogWriteFailure(const std::string& what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Alive(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewJobId(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeInfo Describe(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobStatus*> FindJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<JobStore> store_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, NodeEntry> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for list output and FIFO scheduling.
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> last_persisted_ ABSL_GUARDED_BY(mu_);
  // What LogWriteFailure logged last, by what could not be written.
  std::map<std::string, std::string> write_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_COORDINATOR_STATE_H_
