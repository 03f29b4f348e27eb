// JobHistory: each job's recent log lines (its nodes' lines and the
// coordinator's events, which AddEvent also writes into the job's record)
// and its sampled progress, for `downpourctl logs` and
// `downpourctl describe`.
//
// Durable: what is added is written to the JobStore by the next Flush (the
// coordinator calls it from every Tick), everything since the last one in one
// transaction, so a restarted coordinator shows the history it had (all but
// the last Tick's worth if it was killed). A Flush that fails keeps its
// records for the next one.
//
// Thread-safe: one mutex guards the history (a leaf: nothing else is called
// while it is held, the store's writes included); log followers wait on its
// condition variable. Time comes from Options::now.
#ifndef DOWNPOUR_CONTROL_JOB_HISTORY_H_
#define DOWNPOUR_CONTROL_JOB_HISTORY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/job_store.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

class JobHistory {
 public:
  struct Options {
    // Log lines kept per job (the newest) and progress points per job.
    int log_lines = 2000;
    int progress_points = 1000;
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // `store` must outlive this.
  JobHistory(Options options, JobStore* store);

  // Takes what the store holds (a restarted coordinator's history).
  absl::Status Load();

  // Adds `line` to its job's log with the job's next sequence number (the
  // newest log_lines are kept) and wakes followers.
  void AddLine(JobLogLine line);
  // Appends an event to `job`'s record (its newest 200 are kept; the caller
  // commits the record), logs it, and adds it to the job's log lines.
  void AddEvent(JobStatus* job, const std::string& message);
  // Samples the job's progress for Progress: at most one point a second
  // unless the step moved by a tenth of the job's steps.
  void RecordProgress(const JobStatus& job);

  // The job's lines after `after_sequence`, with `truncated` when older ones
  // it asked for are gone; job_ended is the caller's to set.
  JobLogsResponse LinesAfter(const std::string& job_id, int64_t after_sequence);
  std::vector<ProgressPoint> Progress(const std::string& job_id);

  // A number that grows with every change (lines added, Wake): a follower
  // reads it with the lines, then waits for it to grow.
  int64_t version();
  // Waits until version() > `seen` or `timeout` passes (on the real clock;
  // Wake ends the wait early, so a test's clock that jumps is noticed).
  void WaitForChange(int64_t seen, absl::Duration timeout);
  // Wakes followers (a job ended, the clock moved).
  void Wake();

  // Forgets the job (the store removes its records with the job).
  void Remove(const std::string& job_id);
  // Writes what was added since the last Flush.
  absl::Status Flush();

 private:
  struct JobLog {
    std::deque<JobLogLine> lines;
    int64_t next_sequence = 1;
  };

  const Options options_;
  JobStore* const store_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, JobLog> logs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<ProgressPoint>> progress_ ABSL_GUARDED_BY(mu_);
  // Added since the last Flush, oldest first.
  JobHistoryRecords unwritten_ ABSL_GUARDED_BY(mu_);
  // One Flush at a time, so records reach the store in order.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_JOB_HISTORY_H_
