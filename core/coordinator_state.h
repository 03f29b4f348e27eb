// CoordinatorState: the network-free control plane of downpour-coordinator —
// membership (register, heartbeat, failure detection), the job queue and job
// state machine (PENDING -> RUNNING -> SUCCEEDED / FAILED / STOPPED),
// parameter placement and data-shard assignment (worker ranks).
//
// The gRPC service (rpc/coordinator_service) is a thin adapter over this
// class. Thread-safe: one mutex guards all state; WatchJob waits on a
// condition variable. Every change is written through the JobStore before the
// call returns, so jobs survive a restart.
#ifndef DOWNPOUR_CORE_COORDINATOR_STATE_H_
#define DOWNPOUR_CORE_COORDINATOR_STATE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/job_store.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {

class CoordinatorState {
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

  absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node);
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  std::vector<NodeInfo> ListNodes();

  absl::StatusOr<JobStatus> SubmitJob(const JobSpec& spec, const std::string& job_id);
  std::vector<JobStatus> ListJobs();
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id);
  // Returns when the job's version exceeds `known_version`, or at `deadline`
  // with the current state.
  absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                     absl::Time deadline);
  absl::StatusOr<JobStatus> StopJob(const std::string& job_id);
  absl::StatusOr<ReportProgressResponse> ReportProgress(const ReportProgressRequest& request);

  // Declares silent nodes dead (failing their running jobs) and starts
  // pending jobs that now fit. Called periodically by the daemon, and after
  // every membership or job change.
  void Tick();

 private:
  CoordinatorState(Options options, std::unique_ptr<JobStore> store);

  struct NodeEntry {
    NodeInfo info;
    absl::Time last_heartbeat;
  };

  bool IsTerminal(JobState state) const {
    return state == SUCCEEDED || state == FAILED || state == STOPPED;
  }
  // Records a change of `job`: bumps its version, persists it (always when
  // `durable`, else throttled), wakes watchers.
  absl::Status Commit(JobStatus* job, bool durable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJob(JobStatus* job, JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJobsOfNode(const std::string& node_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DetectDeadNodes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Alive(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewJobId(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeInfo Describe(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<JobStore> store_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, NodeEntry> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for list output and FIFO scheduling.
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> last_persisted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_CORE_COORDINATOR_STATE_H_
