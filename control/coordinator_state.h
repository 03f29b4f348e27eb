// CoordinatorState: the network-free control plane of downpour-coordinator,
// implementing control::Coordinator. It is a facade over collaborators that
// each own one piece of state (leveldb's DBImpl over its VersionSet):
//
//   NodeRegistry            membership, heartbeats, liveness, drains, cordons
//   JobTable                jobs in submission order, their durable records
//   CheckpointOrchestrator  checkpoints being gathered, cadence, drains' moves
//   RankHandover            lost worker ranks: takers, shared workers, dealing data out
//   JobHistory              each job's log lines, events and progress points
//   scheduler.h             placement of pending jobs (pure)
//
// What this class adds is the job lock, which serialises every change to
// the jobs: a request or a Tick takes it, reads the records it needs, asks
// the collaborators what changes, and commits the new records through
// JobTable. Reads that need no consistency with a change in flight (GetJob,
// ListJobs, WatchJob, ListNodes, JobLogs, DescribeJob) go to the
// collaborators without it.
//
// Lock order: the job lock (mu_), then JobTable's, NodeRegistry's,
// CheckpointOrchestrator's, JobHistory's. Each collaborator's lock is a
// leaf for the ones before it: none calls back into this class.
//
// Durability: every change of a job or node is written through the JobStore
// before it takes effect in memory (progress-only changes at most every
// progress_persist_interval; the history at every Tick), so what callers see
// is what a restarted coordinator loads. A write that fails changes nothing:
// a request fails with the store's error; a change the coordinator makes by
// itself (starting a pending job, declaring a node dead) is logged and tried
// again on the next Tick.
//
// Thread-safe. Time comes from Options::now (tests inject a clock).
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
#include "common/safetensors.h"
#include "control/checkpoint_orchestrator.h"
#include "control/coordinator.h"
#include "control/job_history.h"
#include "control/job_store.h"
#include "control/job_table.h"
#include "control/node_registry.h"
#include "control/rank_handover.h"
#include "control/scheduler.h"
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
    // A lost worker rank that no free worker takes over within this long
    // goes to one of the job's workers (SYNC: RankHandover::ShareWorkers) or
    // has its data dealt out to the job's live ranks (ASYNC/SSP:
    // RankHandover::Absorb).
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

  // Loads jobs, nodes and the jobs' history from `store`. Nodes loaded from
  // the store count as alive for recovery_grace from now (see Options), so
  // running jobs get that long to be re-joined after a coordinator restart.
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
  absl::Status DeleteJob(const std::string& job_id, bool checkpoints) override;
  absl::StatusOr<NodeInfo> CordonNode(const std::string& node_id, bool cordoned) override;
  // `timeout_ms` is measured on Options::now.
  absl::StatusOr<JobLogsResponse> JobLogs(const JobLogsRequest& request) override;

  // Declares silent nodes dead (failing their running jobs), starts pending
  // jobs that now fit, asks for the checkpoints the jobs' cadence wants,
  // gives up checkpoints past checkpoint_timeout, removes what retention no
  // longer keeps, writes the jobs' history, and wakes watchers to look at
  // the clock. Called periodically by the daemon.
  void Tick();

 private:
  CoordinatorState(Options options, std::unique_ptr<JobStore> store);

  // ---- Job transitions (coordinator_state.cc) ----
  // Commits the end of `job`.
  absl::Status FinishJob(const JobStatus& job, JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running job failed for `why`: it starts again from its newest complete
  // checkpoint if its RestartPolicy allows one more restart (a divergence
  // only with rollback_on_divergence), and fails otherwise. `moved`: it did
  // not fail but moves off a draining shard — always, at once, uncounted.
  absl::Status FailOrRestart(const JobStatus& job, const std::string& why, bool diverged,
                             bool moved = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts pending jobs that fit the available nodes (after running jobs'
  // lost ranks have had their takers).
  void SchedulePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the start of `job` on `placement`.
  absl::Status StartJob(const JobStatus& job, Placement placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's progress report (or its last one) on running `job`.
  absl::StatusOr<ReportProgressResponse> TakeProgress(const JobStatus& job,
                                                      const ReportProgressRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Nodes that leave (coordinator_recovery.cc) ----
  // Every running job of `node_id` loses it: a worker's rank is handed on,
  // a shard's job moves to a spare (ReplaceShard) or restarts.
  absl::Status FailJobsOfNode(const std::string& node_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `rank` of running `job` is gone (RankHandover::Lose).
  absl::Status LoseWorker(const JobStatus& job, int rank, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shard `index` of running ASYNC/SSP `job` is lost: a spare shard takes
  // it over, restoring only its partitions from the newest checkpoint, and
  // the job goes on. False (nothing changed) when the job is SYNC (one
  // model: it rolls back whole), has no checkpoint, or no spare is free.
  absl::StatusOr<bool> ReplaceShard(const JobStatus& job, int index, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives lost ranks of running jobs to free workers, oldest job first,
  // then those no one took in time to the jobs' own workers (SYNC) or their
  // data to the live ranks (ASYNC/SSP).
  void HandOverLostRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard node began draining: its running jobs take a checkpoint and move
  // off it (TickDrains), or move at once when they are not saved.
  void DrainShard(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves jobs whose checkpoint since a drain began is in (or overdue).
  void TickDrains() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DetectDeadNodes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a coordinator restart: a node not heard from while the other
  // nodes of its running job are back is judged by the node timeout from
  // their return, not the recovery grace (NodeRegistry::JudgeFrom).
  void JudgeAbsentees() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Checkpoints (coordinator_checkpoints.cc) ----
  // A shard's part or the checkpointing rank's state came in.
  void TakeCheckpointPart(const CheckpointPart& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard's heartbeat figures of a job's steps by rank
  // (WorkerProgress.shard_step); ends the job where they were all it
  // awaited.
  void TakeShardSteps(const std::string& shard, const ShardJobSteps& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restarts the jobs whose workers all said they finished but whose shards
  // have not confirmed it within the checkpoint timeout.
  void TickConfirmations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeWorkerState(const std::string& job_id, const CheckpointWorkerState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits a complete checkpoint, or gives up a failed one.
  void Settle(const std::string& job_id, int64_t step,
              const CheckpointOrchestrator::Gathered& gathered) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint at `step` cannot complete: recorded as an event (a job
  // waiting for its final checkpoint succeeds without it).
  void AbandonCheckpoint(const std::string& job_id, int64_t step, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's part: timeouts, final checkpoints lost, cadence by time.
  void TickCheckpoints() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The weights `init` names, checked to be a safetensors file; `what`
  // describes them for the job's events.
  absl::StatusOr<SafetensorsFile> ReadInitialWeights(const InitFrom& init, std::string* what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // An ONNX model file (SubmitJobRequest.model_file) as `spec`'s model and
  // the weights it starts from (its initializers); `what` names the file.
  absl::StatusOr<SafetensorsFile> ReadOnnxModel(const ModelFile& file, JobSpec* spec,
                                                std::string* what) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Helpers ----
  // How jobs are placed: what their shards hold depends on checkpoints.
  control::ScheduleOptions Placing() const;
  // The job's tasks for `node` (a heartbeat's answer).
  void AddTasks(const NodeInfo& node, HeartbeatResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `node`'s task for its rank (worker) or index (shard) `rank` of `job`.
  void AddTask(const JobStatus& job, const NodeInfo& node, int rank, Task* task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the job's state is saved: the coordinator and every shard node
  // of its placement have a checkpoint root.
  bool Saves(const JobStatus& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a draining node holds nothing a running job needs.
  bool Released(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the retention options.
  void TickRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `job_id` from the store, then from every collaborator.
  absl::Status RemoveJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change the coordinator made by itself (`what`) was written (ok) or
  // not: a failure is logged once until the store's error changes, and
  // retried by the next Tick.
  void NoteWrite(const std::string& what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<JobStore> store_;
  // Null when Options::tensorboard_dir is empty.
  const std::unique_ptr<TensorBoardWriter> tensorboard_;
  JobHistory history_;
  JobTable jobs_;
  NodeRegistry nodes_;
  CheckpointOrchestrator checkpoints_;
  const RankHandover handover_;

  // The job lock.
  absl::Mutex mu_;
  // What NoteWrite logged last, by what could not be written.
  std::map<std::string, std::string> write_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_COORDINATOR_STATE_H_
