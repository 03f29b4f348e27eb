#include "control/checkpoint_orchestrator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status.h"
#include "spec/checkpoint_files.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

std::string Bytes(uint64_t bytes) {
  if (bytes < (1 << 20)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
}

// The operator's (or a drain's) request is answered by a checkpoint the
// checkpointing rank took after it.
void ClearAnsweredRequest(absl::Time began, JobStatus* job) {
  if (job->checkpoint_requested_ms() > 0 && job->checkpoint_requested_ms() <= ToMillis(began)) {
    job->set_checkpoint_requested_ms(0);
  }
}

}  // namespace

CheckpointOrchestrator::CheckpointOrchestrator(Options options, JobHistory* history)
    : options_(std::move(options)), history_(history) {}

int CheckpointOrchestrator::CheckpointRank(const JobStatus& job) {
  for (const WorkerProgress& worker : job.workers()) {
    if (!worker.lost() && (!worker.finished() || worker.rank() == 0)) return worker.rank();
  }
  return -1;
}

bool CheckpointOrchestrator::Wanted(const JobStatus& job, int64_t attempt, int64_t step) {
  // A part of another start of the job (a shard that has not heard of the
  // restart yet, or was frozen) is not this start's.
  return attempt == job.attempt() && step > settled_[job.id()];
}

CheckpointOrchestrator::Pending& CheckpointOrchestrator::PendingAt(const std::string& job_id,
                                                                   int64_t step) {
  Pending& pending = pending_[job_id][step];
  if (pending.began == absl::Time()) pending.began = options_.now();
  return pending;
}

CheckpointOrchestrator::Gathered CheckpointOrchestrator::Complete(const JobStatus& job,
                                                                  int64_t step) {
  Gathered gathered;
  const Pending& pending = pending_[job.id()][step];
  if (!pending.have_worker_state ||
      static_cast<int>(pending.shard_files.size()) < job.placement().shard_nodes_size()) {
    return gathered;
  }
  gathered.kind = Gathered::Kind::kComplete;
  gathered.began = pending.began;
  gathered.parts.step = step;
  gathered.parts.worker_state = pending.worker_state;
  for (const auto& [shard, file] : pending.shard_files) gathered.parts.shard_files.push_back(file);
  return gathered;
}

CheckpointOrchestrator::Gathered CheckpointOrchestrator::TakeShardPart(const JobStatus& job,
                                                                       const CheckpointPart& part) {
  absl::MutexLock lock(&mu_);
  if (!Wanted(job, part.attempt(), part.step())) return {};
  // The file's name becomes a path under the checkpoint root: only the
  // name a shard of the job writes is taken.
  const int shard = part.file().shard();
  if (shard < 0 || shard >= job.placement().shard_nodes_size() ||
      (part.error().empty() && part.file().name() != ShardFileName(shard))) {
    return {};
  }
  Pending& pending = PendingAt(job.id(), part.step());
  if (!part.error().empty()) {
    Gathered failed;
    failed.kind = Gathered::Kind::kFailed;
    failed.why = absl::StrCat("shard ", shard, ": ", TruncateText(part.error(), kMaxMessageBytes));
    return failed;
  }
  CheckpointFile& file = pending.shard_files[shard];
  file = part.file();
  // It goes into the manifest and the job's record: fields this
  // coordinator does not know stay out.
  file.DiscardUnknownFields();
  return Complete(job, part.step());
}

CheckpointOrchestrator::Gathered CheckpointOrchestrator::TakeWorkerState(
    const JobStatus& job, const CheckpointWorkerState& state) {
  absl::MutexLock lock(&mu_);
  if (!Wanted(job, state.attempt(), state.step())) return {};
  Pending& pending = PendingAt(job.id(), state.step());
  pending.have_worker_state = true;
  pending.worker_state = state.state();
  return Complete(job, state.step());
}

void CheckpointOrchestrator::Settle(const std::string& job_id, int64_t step) {
  std::map<int64_t, Pending>& pending = pending_[job_id];
  pending.erase(pending.begin(), pending.upper_bound(step));
  settled_[job_id] = std::max(settled_[job_id], step);
}

absl::StatusOr<JobStatus> CheckpointOrchestrator::Commit(const JobStatus& job,
                                                         const Gathered& complete) {
  const int64_t step = complete.parts.step;
  const absl::Time now = options_.now();
  ASSIGN_OR_RETURN(CheckpointInfo info,
                   CommitCheckpoint(options_.checkpoint_root, job, complete.parts, ToMillis(now)));
  {
    absl::MutexLock lock(&mu_);
    Settle(job.id(), step);
  }
  JobStatus updated = job;
  *updated.add_checkpoints() = info;
  updated.set_restarts_in_a_row(0);  // Progress.
  history_->AddEvent(
      &updated,
      absl::StrCat("checkpoint at step ", step, " written (", Bytes(info.bytes()), ", ",
                   absl::FormatDuration(absl::Trunc(now - complete.began, absl::Milliseconds(1))),
                   " after rank 0 took it)"));
  ClearAnsweredRequest(complete.began, &updated);
  const int keep = std::max(1, updated.spec().checkpoint().keep());
  if (updated.checkpoints_size() > keep) {
    updated.mutable_checkpoints()->DeleteSubrange(0, updated.checkpoints_size() - keep);
  }
  return updated;
}

void CheckpointOrchestrator::RemoveStale(const JobStatus& recorded, int64_t step) {
  // Older checkpoints go only now that a newer one is complete and recorded
  // (with what earlier starts of the job left unfinished).
  absl::Status gone = RemoveStaleCheckpoints(
      options_.checkpoint_root, recorded.id(),
      std::vector<CheckpointInfo>(recorded.checkpoints().begin(), recorded.checkpoints().end()),
      recorded.attempt(), step);
  if (!gone.ok()) {
    Log(absl::StrCat("job ", recorded.id(), ": cannot remove old checkpoints: ", gone.message()));
  }
}

JobStatus CheckpointOrchestrator::Abandon(const JobStatus& job, int64_t step,
                                          const std::string& why) {
  absl::Time began = options_.now();
  {
    absl::MutexLock lock(&mu_);
    std::map<int64_t, Pending>& pending = pending_[job.id()];
    auto it = pending.find(step);
    if (it != pending.end()) {
      began = it->second.began;
      pending.erase(it);
    }
    settled_[job.id()] = std::max(settled_[job.id()], step);
  }
  // Shards that did write leave their files: a full disk would keep them,
  // and every later checkpoint would fail for want of their room.
  absl::Status removed =
      RemoveAbandonedCheckpoint(options_.checkpoint_root, job.id(), step, job.attempt());
  if (!removed.ok()) {
    Log(absl::StrCat("job ", job.id(), ": cannot remove the checkpoint at step ", step,
                     " that was given up: ", removed.message()));
  }
  JobStatus updated = job;
  history_->AddEvent(&updated, absl::StrCat("checkpoint at step ", step, " not written: ", why));
  updated.set_checkpoint_failures(updated.checkpoint_failures() + 1);
  updated.set_last_checkpoint_error(TruncateText(why, kMaxMessageBytes));
  ClearAnsweredRequest(began, &updated);
  return updated;
}

std::vector<int64_t> CheckpointOrchestrator::Overdue(const std::string& job_id) {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> overdue;
  auto it = pending_.find(job_id);
  if (it == pending_.end()) return overdue;
  for (const auto& [step, pending] : it->second) {
    if (now - pending.began > options_.timeout) overdue.push_back(step);
  }
  return overdue;
}

bool CheckpointOrchestrator::Gathering(const std::string& job_id, std::optional<int64_t> step) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(job_id);
  if (it == pending_.end()) return false;
  return step.has_value() ? it->second.count(*step) > 0 : !it->second.empty();
}

std::optional<JobStatus> CheckpointOrchestrator::Cadence(const JobStatus& job) {
  const absl::Time now = options_.now();
  const int64_t requested = job.checkpoint_requested_ms();
  JobStatus updated = job;
  if (requested > 0) {
    if (now - absl::FromUnixMillis(requested) <= options_.timeout || Gathering(job.id())) {
      return std::nullopt;
    }
    updated.set_checkpoint_requested_ms(0);
    history_->AddEvent(&updated, absl::StrCat("the checkpoint asked for was not taken within ",
                                              absl::FormatDuration(options_.timeout)));
    return updated;
  }
  const int64_t every_ms = job.spec().checkpoint().every_seconds() * 1000;
  if (every_ms <= 0) return std::nullopt;
  int64_t last = job.start_time_ms();
  if (!job.checkpoints().empty()) last = std::max(last, job.checkpoints().rbegin()->time_ms());
  if (ToMillis(now) - last < every_ms) return std::nullopt;
  updated.set_checkpoint_requested_ms(ToMillis(now));
  return updated;
}

absl::StatusOr<CheckpointRestore> CheckpointOrchestrator::NewestCheckpoint(
    const JobStatus& job, std::vector<std::string>* refused) const {
  if (options_.checkpoint_root.empty() || job.checkpoints().empty()) {
    return absl::NotFoundError("no checkpoint yet");
  }
  return CompleteCheckpoint(
      options_.checkpoint_root,
      std::vector<CheckpointInfo>(job.checkpoints().begin(), job.checkpoints().end()), 0, refused);
}

void CheckpointOrchestrator::Started(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  pending_.erase(job_id);
  settled_[job_id] = step;
}

void CheckpointOrchestrator::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  pending_.erase(job_id);
}

void CheckpointOrchestrator::Remove(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  pending_.erase(job_id);
  settled_.erase(job_id);
  drains_.erase(job_id);
}

void CheckpointOrchestrator::BeginDrain(const std::string& job_id, const std::string& node_id,
                                        int64_t step) {
  absl::MutexLock lock(&mu_);
  drains_[job_id] = Drain{node_id, options_.now(), step};
}

bool CheckpointOrchestrator::Draining(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  return drains_.count(job_id) > 0;
}

std::vector<CheckpointOrchestrator::DrainDue> CheckpointOrchestrator::DueDrains(
    const std::function<const JobStatus*(const std::string&)>& find) {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  std::vector<DrainDue> due;
  for (auto it = drains_.begin(); it != drains_.end();) {
    const JobStatus* job = find(it->first);
    if (job == nullptr || job->state() != RUNNING) {
      it = drains_.erase(it);
      continue;
    }
    const bool saved = !job->checkpoints().empty() &&
                       job->checkpoints().rbegin()->time_ms() >= ToMillis(it->second.began) &&
                       job->checkpoints().rbegin()->step() >= it->second.step;
    // With no rank to take checkpoints, none will come.
    const bool overdue = CheckpointRank(*job) < 0 || now - it->second.began > options_.timeout;
    if (saved || overdue) due.push_back({it->first, it->second.node_id, saved});
    ++it;
  }
  return due;
}

void CheckpointOrchestrator::EndDrain(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  drains_.erase(job_id);
}

}  // namespace control
}  // namespace downpour
