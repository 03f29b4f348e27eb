#include "control/job_table.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "control/coordinator.h"

namespace downpour {
namespace control {

absl::Status NoSuchJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
}

JobStatus JobSummary(const JobStatus& job) {
  JobStatus listed;
  listed.CopyFrom(job);
  listed.mutable_placement()->clear_partitions();
  listed.clear_data_files();
  for (WorkerProgress& worker : *listed.mutable_workers()) worker.clear_data();
  listed.clear_events();
  listed.clear_restore();
  if (listed.evaluations_size() > 1) {
    listed.mutable_evaluations()->DeleteSubrange(0, listed.evaluations_size() - 1);
  }
  return listed;
}

namespace {

// Whether the job's shards have reported its ranks' steps in this start:
// from then on, a rank's word that it finished counts once they agree.
bool ShardsReport(const JobStatus& job) {
  return job.attempt() > 0 && job.shard_steps_attempt() == job.attempt();
}

bool Confirmed(const JobStatus& job, const WorkerProgress& w) {
  return !ShardsReport(job) || w.shard_step() >= w.steps();
}

}  // namespace

bool TrainingDone(const JobStatus& job) {
  if (job.test_accuracy() < 0 || job.workers().empty()) return false;
  // Lost ranks (not taken over, or absorbed) do not hold the end back.
  for (const WorkerProgress& w : job.workers()) {
    if (!w.lost() && !(w.finished() && Confirmed(job, w))) return false;
  }
  return true;
}

std::string Unconfirmed(const JobStatus& job) {
  if (job.test_accuracy() < 0 || job.workers().empty()) return "";
  std::vector<std::string> awaited;
  for (const WorkerProgress& w : job.workers()) {
    if (w.lost()) continue;
    if (!w.finished()) return "";
    if (!Confirmed(job, w)) {
      awaited.push_back(absl::StrCat(
          "rank ", w.rank(), "'s ", w.steps(),
          w.shard_step() > 0 ? absl::StrCat(" (they know of ", w.shard_step(), ")") : ""));
    }
  }
  if (awaited.empty()) return "";
  return absl::StrCat(
      "trained, as the workers say; waiting for the shards to confirm the steps of ",
      absl::StrJoin(awaited, ", "));
}

JobTable::JobTable(Options options, JobStore* store)
    : options_(std::move(options)), store_(store) {}

void JobTable::Load(std::vector<JobStatus> jobs) {
  absl::MutexLock lock(&mu_);
  for (JobStatus& job : jobs) {
    order_.push_back(job.id());
    jobs_[job.id()] = std::move(job);
  }
}

const JobStatus* JobTable::Find(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<const JobStatus*> JobTable::Lookup(const std::string& job_id) {
  const JobStatus* job = Find(job_id);
  if (job == nullptr) return NoSuchJob(job_id);
  return job;
}

std::vector<std::string> JobTable::Ids() {
  absl::MutexLock lock(&mu_);
  return order_;
}

absl::Status JobTable::Insert(JobStatus job) {
  absl::MutexLock lock(&mu_);
  if (jobs_.count(job.id())) {
    return absl::AlreadyExistsError(absl::StrCat("job id \"", job.id(), "\" already exists"));
  }
  job.set_version(job.version() + 1);
  RETURN_IF_ERROR(store_->SaveJob(job));
  last_persisted_[job.id()] = options_.now();
  order_.push_back(job.id());
  jobs_[job.id()] = std::move(job);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobTable::Commit(JobStatus updated, bool durable) {
  updated.set_version(updated.version() + 1);
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  auto last = last_persisted_.find(updated.id());
  if (durable || last == last_persisted_.end() ||
      now - last->second >= options_.progress_persist_interval) {
    RETURN_IF_ERROR(store_->SaveJob(updated));
    last_persisted_[updated.id()] = now;
  }
  jobs_[updated.id()] = std::move(updated);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobTable::Remove(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(store_->DeleteJob(job_id));
  jobs_.erase(job_id);
  order_.erase(std::remove(order_.begin(), order_.end(), job_id), order_.end());
  last_persisted_.erase(job_id);
  changed_.SignalAll();
  return absl::OkStatus();
}

std::string JobTable::NewId(const std::string& name) {
  std::string base;
  for (char c : name) {
    base.push_back(std::isalnum(static_cast<uint8_t>(c)) || c == '-' || c == '_' ? c : '-');
  }
  if (base.empty() || !std::isalnum(static_cast<uint8_t>(base[0]))) base = "job" + base;
  base = base.substr(0, 48);
  absl::MutexLock lock(&mu_);
  for (size_t n = jobs_.size() + 1;; ++n) {
    std::string id = absl::StrCat(base, "-", n);
    if (jobs_.count(id) == 0) return id;
  }
}

absl::StatusOr<JobStatus> JobTable::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoSuchJob(job_id);
  return it->second;
}

absl::StatusOr<JobState> JobTable::State(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoSuchJob(job_id);
  return it->second.state();
}

std::vector<JobStatus> JobTable::List(const std::function<JobStatus(const JobStatus&)>& summary) {
  absl::MutexLock lock(&mu_);
  std::vector<JobStatus> out;
  out.reserve(order_.size());
  for (const std::string& id : order_) out.push_back(summary(jobs_[id]));
  return out;
}

absl::StatusOr<JobStatus> JobTable::Watch(const std::string& job_id, int64_t known_version,
                                          absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return NoSuchJob(job_id);
    const absl::Time now = options_.now();
    if (it->second.version() > known_version || now >= deadline) return it->second;
    // Wake comes with every Tick, so an injected clock that jumps is noticed.
    changed_.WaitWithTimeout(&mu_, deadline - now);
  }
}

void JobTable::Wake() {
  absl::MutexLock lock(&mu_);
  changed_.SignalAll();
}

std::vector<std::string> JobTable::Expired() {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  // Ended jobs, newest end first: those past the count or the age go.
  std::vector<const JobStatus*> ended;
  for (const std::string& id : order_) {
    if (IsTerminal(jobs_[id].state())) ended.push_back(&jobs_[id]);
  }
  std::stable_sort(ended.begin(), ended.end(), [](const JobStatus* a, const JobStatus* b) {
    return a->end_time_ms() > b->end_time_ms();
  });
  std::vector<std::string> expired;
  for (size_t i = 0; i < ended.size(); ++i) {
    const bool too_many =
        options_.retention_count > 0 && static_cast<int>(i) >= options_.retention_count;
    const bool too_old =
        options_.retention_age > absl::ZeroDuration() &&
        now - absl::FromUnixMillis(ended[i]->end_time_ms()) > options_.retention_age;
    if (too_many || too_old) expired.push_back(ended[i]->id());
  }
  return expired;
}

}  // namespace control
}  // namespace downpour
