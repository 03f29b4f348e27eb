// CheckpointOrchestrator: how the coordinator takes a running job's
// checkpoints. The checkpointing rank (CheckpointRank) marks a step
// boundary; every shard writes its file and reports it in a heartbeat; that
// rank sends its own state with a progress report. Once every part of a step
// is in, Commit writes the manifest (control/checkpoints.h) and returns the
// job's record with the checkpoint in it (the newest `keep` kept). It also
// keeps the cadence by time, gives up checkpoints past their timeout, finds
// the newest complete checkpoint to restore from, and remembers the jobs
// that move off a draining shard once a checkpoint is in.
//
// The coordinator commits the records this returns (JobTable); this owns
// only the checkpoints being gathered, the steps settled (committed or given
// up) in the current start of each job, and the drains. None of it is
// durable: a restarted coordinator takes the next checkpoint, and a shard's
// next heartbeat begins its drain again.
//
// Thread-safe: one mutex guards that state; it is taken after the
// coordinator's job lock, JobTable's and NodeRegistry's, and only JobHistory
// (for events) and the checkpoint files are touched while it is held. Time
// comes from Options::now.
#ifndef DOWNPOUR_CONTROL_CHECKPOINT_ORCHESTRATOR_H_
#define DOWNPOUR_CONTROL_CHECKPOINT_ORCHESTRATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/checkpoints.h"
#include "control/job_history.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

class CheckpointOrchestrator {
 public:
  struct Options {
    // Where checkpoints live; empty: jobs are not saved.
    std::string checkpoint_root;
    // A checkpoint not complete this long after its first part came is
    // given up, and so is a drain whose checkpoint does not come.
    absl::Duration timeout = absl::Minutes(10);
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // What a part brought about.
  struct Gathered {
    enum class Kind { kWaiting, kComplete, kFailed };
    Kind kind = Kind::kWaiting;
    CheckpointParts parts;  // kComplete: every part of the step.
    absl::Time began;       // kComplete: when its first part came.
    std::string why;        // kFailed: what a shard said.
  };

  // A job to move off a draining shard.
  struct DrainDue {
    std::string job_id;
    std::string node_id;
    bool saved = false;  // Its checkpoint came (else it is overdue).
  };

  // `history` (for events) must outlive this.
  CheckpointOrchestrator(Options options, JobHistory* history);

  const std::string& root() const { return options_.checkpoint_root; }

  // The rank that takes `job`'s checkpoints: 0, or while rank 0 is lost the
  // lowest rank still training; -1 when none is.
  static int CheckpointRank(const JobStatus& job);

  // A shard's file (or its error) for a checkpoint of running, saved `job`.
  // Parts of another start of the job, of a settled step, or not named as
  // a shard of the job writes them are ignored (kWaiting).
  Gathered TakeShardPart(const JobStatus& job, const CheckpointPart& part);
  // The checkpointing rank's state, likewise.
  Gathered TakeWorkerState(const JobStatus& job, const CheckpointWorkerState& state);

  // Writes the manifest of a complete checkpoint and returns `job` with it
  // recorded: an event, the newest `keep` checkpoints, the operator's
  // request it answered cleared, restarts_in_a_row reset; the step is
  // settled. An error (the manifest could not be written) settles nothing:
  // the caller gives the checkpoint up with Abandon.
  absl::StatusOr<JobStatus> Commit(const JobStatus& job, const Gathered& complete);
  // Once the commit is recorded: removes the files `recorded` no longer
  // names (older checkpoints, what earlier starts left). Logs a failure.
  void RemoveStale(const JobStatus& recorded, int64_t step);
  // The checkpoint at `step` will not complete: settles it, removes what it
  // wrote, and returns `job` with an event saying why, the failure counted
  // (checkpoint_failures, last_checkpoint_error) and the request it
  // answered cleared.
  JobStatus Abandon(const JobStatus& job, int64_t step, const std::string& why);

  // Steps of `job_id` gathered for longer than the timeout.
  std::vector<int64_t> Overdue(const std::string& job_id);
  // Whether `job_id` has the checkpoint at `step` being gathered (any step
  // when `step` is nullopt).
  bool Gathering(const std::string& job_id, std::optional<int64_t> step = std::nullopt);
  // Tick's cadence for running, saved `job`: the record with a checkpoint
  // asked for (every_seconds due) or an unanswered request given up (with
  // an event); nullopt when nothing changes.
  std::optional<JobStatus> Cadence(const JobStatus& job);

  // The newest complete checkpoint of `job` (damaged newer ones described
  // in `refused`); NotFound when it has none, or checkpoints are off.
  absl::StatusOr<CheckpointRestore> NewestCheckpoint(const JobStatus& job,
                                                     std::vector<std::string>* refused) const;

  // A start of `job_id` from the checkpoint at `step` (0: none): nothing of
  // an earlier start is gathered, and only later steps are taken.
  void Started(const std::string& job_id, int64_t step);
  // The job stopped, failed or is restarting: what was gathered goes.
  void Forget(const std::string& job_id);
  // The job is deleted: everything of it goes.
  void Remove(const std::string& job_id);

  // `job_id` moves off draining shard `node_id` once a checkpoint asked
  // for now is in: one committed from now on, of a step at least `step`
  // (the job's now), so a checkpoint taken before the drain and committed
  // after it does not count.
  void BeginDrain(const std::string& job_id, const std::string& node_id, int64_t step);
  bool Draining(const std::string& job_id);
  // The drains to act on now: a checkpoint since the drain began is in,
  // none can come (no rank takes them), or the timeout passed. A drain of a
  // job no longer running (`find` returns null or not RUNNING) is dropped.
  std::vector<DrainDue> DueDrains(const std::function<const JobStatus*(const std::string&)>& find);
  // The move of `job_id` was recorded.
  void EndDrain(const std::string& job_id);

 private:
  // A checkpoint the checkpointing rank has taken, gathering its files.
  struct Pending {
    absl::Time began;
    bool have_worker_state = false;
    std::string worker_state;
    std::map<int, CheckpointFile> shard_files;
  };
  struct Drain {
    std::string node_id;
    absl::Time began;
    int64_t step = 0;  // The job's when the drain began.
  };

  // Whether a part of `job`'s start `attempt` at `step` is still wanted.
  bool Wanted(const JobStatus& job, int64_t attempt, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pending checkpoint, begun now if new.
  Pending& PendingAt(const std::string& job_id, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kComplete once every part of `step` is in.
  Gathered Complete(const JobStatus& job, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Settles `step` and drops what was gathered up to it.
  void Settle(const std::string& job_id, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  JobHistory* const history_;

  absl::Mutex mu_;
  // Checkpoints being gathered, by job and step.
  std::map<std::string, std::map<int64_t, Pending>> pending_ ABSL_GUARDED_BY(mu_);
  // The highest step whose checkpoint each job has committed or given up in
  // this start of the job: parts for it that heartbeats repeat are ignored.
  std::map<std::string, int64_t> settled_ ABSL_GUARDED_BY(mu_);
  // Jobs moving off a draining shard once a checkpoint is in.
  std::map<std::string, Drain> drains_ ABSL_GUARDED_BY(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_CHECKPOINT_ORCHESTRATOR_H_
