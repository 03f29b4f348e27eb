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

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/safetensors.h"
#include "control/coordinator.h"
#include "control/job_store.h"
#include "control/tensorboard_writer.h"
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
    // After a restart, nodes known from the store count as alive for this
    // long (or until they heartbeat): a coordinator down for up to this long
    // fails nothing, however long its nodes take to find it again. Nodes not
    // heard from since the restart get no new work meanwhile.
    absl::Duration recovery_grace = absl::Minutes(10);
    // A lost worker rank (not rank 0, which evaluates) that no free worker
    // takes over within this long has its data dealt out to the job's live
    // ranks (AbsorbLostRanks).
    absl::Duration handover_wait = absl::Seconds(30);
    // Where checkpoints live (a filesystem every shard with --checkpoint_root
    // shares); empty: jobs are not saved.
    std::string checkpoint_root;
    // A checkpoint not complete this long after rank 0 took it is given up
    // (an event says why).
    absl::Duration checkpoint_timeout = absl::Minutes(10);
    // Retention: ended jobs beyond the newest job_retention_count (0: no
    // limit) or ended longer ago than job_retention_age (zero: no limit)
    // leave the store; so do nodes dead for longer than dead_node_retention
    // (zero: kept) that no running job names.
    int job_retention_count = 0;
    absl::Duration job_retention_age = absl::ZeroDuration();
    absl::Duration dead_node_retention = absl::ZeroDuration();
    // Where each job's loss, examples_per_second and test_accuracy (and
    // test_auc, test_log_loss when its metrics ask for them) go as
    // TensorBoard event files, DIR/JOB_ID/ (control/tensorboard_writer.h);
    // empty: not written.
    std::string tensorboard_dir;
    // Log lines kept per job (the newest) and progress points per job.
    int job_log_lines = 2000;
    int progress_points = 1000;
    // Current time; tests inject their own.
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // Loads jobs and nodes from `store`. Nodes loaded from the store count as
  // alive for recovery_grace from now (see Options), so running jobs get that
  // long to be re-joined after a coordinator restart.
  static absl::StatusOr<std::unique_ptr<CoordinatorState>> Create(Options options,
                                                                  std::unique_ptr<JobStore> store);

  absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override;
  absl::StatusOr<std::vector<NodeInfo>> ListNodes() override;
  using Coordinator::SubmitJob;
  absl::StatusOr<JobStatus> SubmitJob(const SubmitJobRequest& request) override;
  absl::StatusOr<std::vector<JobStatus>> ListJobs() override;
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id) override;
  // `timeout` is measured on Options::now.
  absl::StatusOr<JobStatus> WatchJob(const std::string& job_id, int64_t known_version,
                                     absl::Duration timeout) override;
  absl::StatusOr<JobStatus> StopJob(const std::string& job_id) override;
  absl::StatusOr<ReportProgressResponse> ReportProgress(
      const ReportProgressRequest& request) override;
  absl::StatusOr<JobStatus> CheckpointJob(const std::string& job_id) override;
  absl::StatusOr<JobStatus> ResumeJob(const std::string& job_id) override;
  absl::StatusOr<std::string> ExportJob(const std::string& job_id, int64_t step,
                                        bool native_layout) override;
  absl::StatusOr<JobDescription> DescribeJob(const std::string& job_id) override;
  absl::Status DeleteJob(const std::string& job_id) override;
  absl::StatusOr<NodeInfo> CordonNode(const std::string& node_id, bool cordoned) override;
  // `timeout_ms` is measured on Options::now.
  absl::StatusOr<JobLogsResponse> JobLogs(const JobLogsRequest& request) override;

  // Declares silent nodes dead (failing their running jobs), starts pending
  // jobs that now fit, asks for the checkpoints the jobs' cadence wants,
  // gives up checkpoints past checkpoint_timeout, removes what retention no
  // longer keeps, and wakes watchers to look at the clock. Called
  // periodically by the daemon, and after every membership or job change.
  void Tick();

 private:
  CoordinatorState(Options options, std::unique_ptr<JobStore> store);

  struct NodeEntry {
    NodeInfo info;
    absl::Time last_heartbeat;
    // Registered or heartbeated since this coordinator started (false for a
    // node loaded from the store until it does).
    bool heard = true;
    // Told to stop (SIGTERM): gets no new work (HeartbeatRequest.draining).
    bool draining = false;
  };

  // A checkpoint rank 0 has taken, gathering its files.
  struct PendingCheckpoint {
    absl::Time began;
    bool have_worker_state = false;
    std::string worker_state;
    std::map<int, CheckpointFile> shard_files;
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
  // A running job failed for `why`: it starts again from its newest complete
  // checkpoint if its RestartPolicy allows one more restart (a divergence
  // only with rollback_on_divergence), and fails otherwise. `moved`: it did
  // not fail but moves off a draining shard — always, at once, uncounted.
  absl::Status FailOrRestart(const JobStatus& job, const std::string& why, bool diverged,
                             bool moved = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard node began draining: its running jobs take a checkpoint and move
  // off it (TickDrains), or move at once when they are not saved.
  void DrainShard(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves jobs whose checkpoint since a drain began is in (or overdue).
  void TickDrains() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a draining node holds nothing a running job needs.
  bool Released(const std::string& node_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `rank` of running `job` is gone (dead, restarted, drained): the
  // job goes on without it, and AssignLostRanks hands the rank on.
  absl::Status LoseWorker(const JobStatus& job, int rank, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives lost ranks of running jobs to free workers (alive, not draining,
  // not working on a running job), oldest job first.
  void AssignLostRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deals the data of ranks lost for longer than handover_wait out to their
  // jobs' live ranks, least loaded first; the ranks are then absorbed.
  void AbsorbLostRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's listing of the job's record files (ReportProgressRequest.
  // data_files): shares them out unless that was done, and answers with the
  // rank's share.
  absl::StatusOr<ReportProgressResponse> AssignData(const JobStatus& job, int rank,
                                                    const ReportProgressRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives every rank of `job` its first share of job->data_files().
  static void ShareDataFiles(JobStatus* job);
  // `job` as ListJobs shows it (see Coordinator::ListJobs).
  static JobStatus ListedJob(const JobStatus& job);
  // Shard `index` of running ASYNC/SSP `job` is lost: a spare shard takes
  // it over, restoring only its partitions from the newest checkpoint, and
  // the job goes on. False (nothing changed) when the job is SYNC (one
  // model: it rolls back whole), has no checkpoint, or no spare is free.
  absl::StatusOr<bool> ReplaceShard(const JobStatus& job, int index, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank that takes the job's checkpoints: 0, or while rank 0 is lost
  // the lowest rank still training; -1 when none is.
  static int CheckpointRank(const JobStatus& job);
  // The job's message while ranks are lost ("" when none is).
  static std::string WaitingFor(const JobStatus& job);
  // What a job that ends with lost ranks did not train ("" when none is).
  static std::string Untrained(const JobStatus& job);
  void DetectDeadNodes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `line` to its job's log (the newest job_log_lines are kept) and
  // wakes JobLogs callers. Lines of unknown jobs are dropped.
  void AppendJobLog(JobLogLine line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Samples the job's progress for DescribeJob (at most one point a second
  // unless the step moved by a tenth of the steps).
  void RecordProgress(const JobStatus& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `job_id` from the store, then from memory.
  absl::Status RemoveJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the retention options (Options::job_retention_*,
  // dead_node_retention).
  void TickRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change the coordinator made by itself could not be written: logged
  // (once, until the store's error changes), retried by the next Tick.
  void LogWriteFailure(const std::string& what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When a silent node is declared dead.
  absl::Time Deadline(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Alive(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the job's state is saved: the coordinator and every shard node
  // of its placement have a checkpoint root.
  bool Saves(const JobStatus& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends an event to `job` (the caller commits it) and logs it.
  void AddEvent(JobStatus* job, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard's file or rank 0's state for a checkpoint of a running job;
  // commits the checkpoint once it has everything.
  void TakeCheckpointPart(const CheckpointPart& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeWorkerState(const std::string& job_id, const CheckpointWorkerState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCommitCheckpoint(const std::string& job_id, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint at `step` cannot complete: recorded as an event (a job
  // waiting for its final checkpoint succeeds without it).
  void AbandonCheckpoint(const std::string& job_id, int64_t step, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's part: cadence by time, timeouts, final checkpoints lost.
  void TickCheckpoints() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every worker has finished (lost ranks aside) and the accuracy is
  // in: the job only waits for its final checkpoint.
  static bool TrainingDone(const JobStatus& job);
  std::string NewJobId(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeInfo Describe(const NodeEntry& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobStatus*> FindJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newest complete checkpoint of `job` (damaged newer ones described
  // in `refused`); NotFound when it has none, or checkpoints are off.
  absl::StatusOr<CheckpointRestore> NewestCheckpoint(const JobStatus& job,
                                                     std::vector<std::string>* refused) const;
  // The weights `init` names, checked to be a safetensors file; `what`
  // describes them for the job's events.
  absl::StatusOr<SafetensorsFile> ReadInitialWeights(const InitFrom& init, std::string* what)
      ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const std::unique_ptr<JobStore> store_;
  // Null when Options::tensorboard_dir is empty.
  const std::unique_ptr<TensorBoardWriter> tensorboard_;
  // Nodes loaded from the store are not judged before this.
  absl::Time grace_until_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, NodeEntry> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for list output and FIFO scheduling.
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> last_persisted_ ABSL_GUARDED_BY(mu_);
  // Checkpoints being gathered, by job and step (not durable: a restarted
  // coordinator takes the next one).
  std::map<std::string, std::map<int64_t, PendingCheckpoint>> pending_checkpoints_
      ABSL_GUARDED_BY(mu_);
  // The highest step whose checkpoint each job has committed or given up in
  // this run of the job: parts for it that heartbeats repeat are ignored.
  std::map<std::string, int64_t> settled_checkpoint_ ABSL_GUARDED_BY(mu_);
  // Jobs moving off a draining shard once a checkpoint is in: the shard and
  // when the drain began (not durable: the shard's next heartbeat after a
  // coordinator restart begins it again).
  struct Drain {
    std::string node_id;
    absl::Time began;
  };
  std::map<std::string, Drain> drains_ ABSL_GUARDED_BY(mu_);
  // Each job's recent log lines, oldest first, and the sequence of the next.
  struct JobLog {
    std::deque<JobLogLine> lines;
    int64_t next_sequence = 1;
  };
  std::map<std::string, JobLog> job_logs_ ABSL_GUARDED_BY(mu_);
  // Each job's sampled progress (not durable).
  std::map<std::string, std::deque<ProgressPoint>> progress_ ABSL_GUARDED_BY(mu_);
  // What LogWriteFailure logged last, by what could not be written.
  std::map<std::string, std::string> write_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_COORDINATOR_STATE_H_
