// RankHandover: what happens to a worker rank whose worker is gone (dead,
// restarted, drained, cordoned). The next free worker takes it over where it
// had got to (its share of the data, its step). When none does within
// handover_wait, a SYNC job's rank is taken over by one of the job's own
// workers, which then trains it beside its own rank (each on its data,
// pushing as its rank, so the job trains exactly what a clean run trains,
// only slower); an ASYNC/SSP job's rank has its data and remaining steps
// dealt out to the live ranks, least loaded first. Meanwhile an ASYNC/SSP
// job goes on without the rank, while a SYNC job's steps wait for it (a step
// that went on would skip the rank's batch). It also shares a job's record
// files out to its ranks.
//
// It keeps no state of its own: a rank's state lives in its job's record
// (WorkerProgress: lost, joined, absorbed, data, steps), which each method
// changes in place and the caller commits (JobTable). Thread-compatible:
// callers hold the coordinator's job lock. Time comes from Options::now.
#ifndef DOWNPOUR_CONTROL_RANK_HANDOVER_H_
#define DOWNPOUR_CONTROL_RANK_HANDOVER_H_

#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/job_history.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

class RankHandover {
 public:
  struct Options {
    // A lost rank that no free worker takes over within this long goes to
    // one of the job's workers (SYNC) or has its data dealt out (ASYNC/SSP).
    absl::Duration handover_wait = absl::Seconds(30);
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // `history` (for events) must outlive this.
  RankHandover(Options options, JobHistory* history);

  // Lost, and neither taken over nor absorbed yet.
  static bool Unclaimed(const WorkerProgress& worker);
  // Whether the running `job` has an unclaimed rank.
  static bool HasUnclaimed(const JobStatus& job);
  // The rank that evaluates the job: rank 0, or while it is lost the lowest
  // rank still training, or when none trains the lowest live one (which
  // runs again to do it: ReopenToEvaluate); -1 when every rank is lost.
  static int EvaluatingRank(const JobStatus& job);
  // The step a lost rank goes on from, as far as the coordinator knows: its
  // last report, or, when it has not reported since the job started again,
  // the checkpoint the job resumed from (a SYNC taker joins at the shards'
  // step, at or past either; an ASYNC/SSP one at this step).
  static int64_t StepOf(const JobStatus& job, const WorkerProgress& worker);
  // The job's message while ranks are lost ("" when none is).
  std::string WaitingFor(const JobStatus& job) const;
  // What a job that ends with lost ranks did not train ("" when none is).
  static std::string Untrained(const JobStatus& job);
  // Whether the shards complete `job`'s steps without `worker`'s rank
  // (Task.absent_ranks): a finished rank, and in ASYNC/SSP a lost one (in
  // SYNC the steps wait for its taker, who continues at the very step the
  // rank had reached; but for a rank absorbed under an older coordinator).
  bool AbsentAtShards(const JobStatus& job, const WorkerProgress& worker) const;

  // Worker `rank` of running `job` is gone: marked lost for a taker.
  // False (nothing changed) when the rank already finished or is lost.
  bool Lose(JobStatus* job, int rank, const std::string& why) const;
  // Gives `job`'s unclaimed ranks to workers taken from the front of
  // `free`; the job's newest complete checkpoint (`newest`, called only
  // then, when it has one) becomes the restore the takers load their state
  // from. False when no rank was taken (or the job was already evaluated:
  // its end waits for no one).
  bool AssignTakers(JobStatus* job, std::deque<std::string>* free,
                    const std::function<absl::StatusOr<CheckpointRestore>()>& newest) const;
  // SYNC: gives each rank lost for longer than handover_wait to the worker
  // of the job's live ranks that trains the fewest of them and has room for
  // another replica of the model (`why_no_room` says why a node has not;
  // nullopt when it has; asked of the job's record as it was before the
  // call, so a node takes at most one rank a call), as a take-over: the
  // node then trains it beside its own.
  // `newest` as AssignTakers'. With no room anywhere the rank keeps waiting
  // for a free worker and the job's message says why. False when nothing
  // changed.
  bool ShareWorkers(
      JobStatus* job,
      const std::function<std::optional<std::string>(const std::string&)>& why_no_room,
      const std::function<absl::StatusOr<CheckpointRestore>()>& newest) const;
  // ASYNC/SSP: deals the data and remaining steps of ranks lost for longer
  // than handover_wait out to the job's live ranks; the ranks are then
  // absorbed — rank 0 too, whose evaluation then goes to the lowest live
  // rank. False when none was.
  bool Absorb(JobStatus* job) const;
  // A job not yet evaluated whose rank 0 was lost, not taken over within
  // handover_wait, after the others finished: the lowest live rank runs
  // again, from its step, to train what rank 0 had left (Absorb deals it)
  // and evaluate the job. False when nothing changed.
  bool ReopenToEvaluate(JobStatus* job) const;

  // Gives every rank of `job` its first share of job->data_files().
  static void ShareDataFiles(JobStatus* job);
  // A worker's listing of the job's record files (ReportProgressRequest.
  // data_files) when the job has none yet: records and shares them
  // (InvalidArgument when the shares would pass kMaxDataShareBytes). False
  // when the job already had its files.
  absl::StatusOr<bool> TakeListing(JobStatus* job, const ReportProgressRequest& request) const;

 private:
  // `worker`'s rank is trained by `node` from now on, from where it had got
  // to (Task.join).
  static void TakeOver(JobStatus* job, WorkerProgress* worker, const std::string& node);
  // The newest checkpoint becomes the restore the takers load their state
  // from (when the job has one).
  static void RecordRestore(JobStatus* job,
                            const std::function<absl::StatusOr<CheckpointRestore>()>& newest);

  const Options options_;
  JobHistory* const history_;
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_RANK_HANDOVER_H_
