// JobTable: every job the coordinator knows, in submission order, each with
// its version; the record of truth for a job's state.
//
// Durability: Commit writes a job through the JobStore before it takes
// effect (progress-only changes at most every progress_persist_interval), so
// what callers see is what a restarted coordinator loads. A write that fails
// changes nothing.
//
// Thread-safety: one mutex guards the table, and watchers wait on its
// condition variable. Changes (Insert, Commit, Remove) come only from the
// holder of the coordinator's job lock (CoordinatorState serialises them),
// so that holder may keep the pointer Find returns until it lets go of the
// job lock (a Commit of that job replaces what it points to); anyone else
// reads copies (Get, List, Watch). The table's mutex is taken after the
// job lock and before NodeRegistry's; nothing but the store is called while
// it is held.
#ifndef DOWNPOUR_CONTROL_JOB_TABLE_H_
#define DOWNPOUR_CONTROL_JOB_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/job_store.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

class JobTable {
 public:
  struct Options {
    // Progress-only changes are written to the store at most this often.
    absl::Duration progress_persist_interval = absl::Seconds(2);
    // Retention: ended jobs beyond the newest count (0: no limit) or ended
    // longer ago than age (zero: no limit) are Expired.
    int retention_count = 0;
    absl::Duration retention_age = absl::ZeroDuration();
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // `store` must outlive this.
  JobTable(Options options, JobStore* store);

  // Takes the jobs a restarted coordinator loaded, in their order.
  void Load(std::vector<JobStatus> jobs);

  // The job, or nullptr. REQUIRES: the coordinator's job lock (see above).
  const JobStatus* Find(const std::string& job_id);
  // The job, or NotFound naming it. REQUIRES: the job lock.
  absl::StatusOr<const JobStatus*> Lookup(const std::string& job_id);
  // Job ids in submission order (a copy: the caller may commit while it
  // walks them).
  std::vector<std::string> Ids();

  // A new job: written, then appended to the order. AlreadyExists when its
  // id is taken.
  absl::Status Insert(JobStatus job);
  // Makes `updated` its job's state: bumps the version and writes it (always
  // when `durable`, else at most every progress_persist_interval), then
  // wakes watchers.
  absl::Status Commit(JobStatus updated, bool durable);
  // Removes the job from the store, then from the table.
  absl::Status Remove(const std::string& job_id);
  // An unused id made from a job's name.
  std::string NewId(const std::string& name);

  // Copies for readers without the job lock.
  absl::StatusOr<JobStatus> Get(const std::string& job_id);
  absl::StatusOr<JobState> State(const std::string& job_id);
  // Every job as `summary` makes it, in submission order.
  std::vector<JobStatus> List(const std::function<JobStatus(const JobStatus&)>& summary);
  // Returns once the job's version exceeds `known_version`, or at
  // `deadline` (on Options::now; Wake makes a waiter look at the clock).
  absl::StatusOr<JobStatus> Watch(const std::string& job_id, int64_t known_version,
                                  absl::Time deadline);
  // Wakes watchers to look at the clock.
  void Wake();

  // Ended jobs the retention options no longer keep.
  std::vector<std::string> Expired();

 private:
  const Options options_;
  JobStore* const store_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for list output and FIFO scheduling.
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> last_persisted_ ABSL_GUARDED_BY(mu_);
};

// NotFound naming the job.
absl::Status NoSuchJob(const std::string& job_id);

// `job` as ListJobs shows it: the lists that grow with the model, the data
// and the job's history — placement.partitions, data_files, the workers'
// data, events, restore and all evaluations but the newest — left out.
JobStatus JobSummary(const JobStatus& job);

// Whether every worker of `job` has finished (lost ranks aside), as it said
// and, once they report (JobStatus.shard_steps_attempt), as the shards know
// (WorkerProgress.shard_step reached its steps), and its accuracy is in: a
// saved job then only waits for its final checkpoint.
bool TrainingDone(const JobStatus& job);

// Where every rank (lost ranks aside) said it finished and the accuracy is
// in, but the shards do not know all their steps yet: a sentence naming
// the ranks awaited, for the job's message; else "".
std::string Unconfirmed(const JobStatus& job);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_JOB_TABLE_H_
