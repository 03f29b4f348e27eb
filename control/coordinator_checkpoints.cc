// CoordinatorState's checkpoint orchestration: gathering each checkpoint's
// files (shards' parts from heartbeats, rank 0's state from its progress
// report), committing it, the cadence by time, timeouts, and the operator's
// checkpoint, resume and export.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "control/checkpoints.h"
#include "control/coordinator_state.h"
#include "control/export.h"
#include "control/request_limits.h"
#include "spec/checkpoint_files.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

constexpr int kMaxEvents = 200;
constexpr int kDefaultMaxRestarts = 3;
constexpr int kDefaultBackoffSeconds = 1;

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

bool HasCheckpointAt(const JobStatus& job, int64_t step) {
  return !job.checkpoints().empty() && job.checkpoints().rbegin()->step() == step;
}

std::string Bytes(uint64_t bytes) {
  if (bytes < (1 << 20)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
}

}  // namespace

bool CoordinatorState::Saves(const JobStatus& job) const {
  if (options_.checkpoint_root.empty()) return false;
  for (const std::string& shard : job.placement().shard_nodes()) {
    auto it = nodes_.find(shard);
    if (it == nodes_.end() || !it->second.info.checkpoints()) return false;
  }
  return true;
}

bool CoordinatorState::TrainingDone(const JobStatus& job) {
  if (job.test_accuracy() < 0 || job.workers().empty()) return false;
  // Lost ranks (not taken over, or absorbed) do not hold the end back.
  for (const WorkerProgress& w : job.workers()) {
    if (!w.finished() && !w.lost()) return false;
  }
  return true;
}

void CoordinatorState::AddEvent(JobStatus* job, const std::string& message) {
  JobEvent* event = job->add_events();
  event->set_time_ms(ToMillis(options_.now()));
  // Events name nodes, files and errors: a job of thousands of workers
  // keeps its 200 within a few MiB.
  event->set_message(TruncateText(message, kMaxEventBytes));
  if (job->events_size() > kMaxEvents) {
    job->mutable_events()->DeleteSubrange(0, job->events_size() - kMaxEvents);
  }
  Log(absl::StrCat("job ", job->id(), ": ", message));
  JobLogLine line;
  line.set_job_id(job->id());
  line.set_source("coordinator");
  line.set_time_ms(event->time_ms());
  line.set_text(TruncateText(message, kMaxLogLineBytes));
  AppendJobLog(std::move(line));
}

void CoordinatorState::TakeCheckpointPart(const CheckpointPart& part) {
  auto job = jobs_.find(part.job_id());
  // A part of another start of the job (a shard that has not heard of the
  // restart yet, or was frozen) is not this start's.
  if (job == jobs_.end() || job->second.state() != RUNNING || !Saves(job->second) ||
      part.attempt() != job->second.attempt() ||
      part.step() <= settled_checkpoint_[part.job_id()]) {
    return;
  }
  // The file's name becomes a path under the checkpoint root: only the
  // name a shard of the job writes is taken.
  const int shard = part.file().shard();
  if (shard < 0 || shard >= job->second.placement().shard_nodes_size() ||
      (part.error().empty() && part.file().name() != ShardFileName(shard))) {
    return;
  }
  PendingCheckpoint& pending = pending_checkpoints_[part.job_id()][part.step()];
  if (pending.began == absl::Time()) pending.began = options_.now();
  if (!part.error().empty()) {
    AbandonCheckpoint(
        part.job_id(), part.step(),
        absl::StrCat("shard ", shard, ": ", TruncateText(part.error(), kMaxMessageBytes)));
    return;
  }
  CheckpointFile& file = pending.shard_files[shard];
  file = part.file();
  // It goes into the manifest and the job's record: fields this
  // coordinator does not know stay out.
  file.DiscardUnknownFields();
  MaybeCommitCheckpoint(part.job_id(), part.step());
}

void CoordinatorState::TakeWorkerState(const std::string& job_id,
                                       const CheckpointWorkerState& state) {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end() || job->second.state() != RUNNING || !Saves(job->second) ||
      state.attempt() != job->second.attempt() || state.step() <= settled_checkpoint_[job_id]) {
    return;
  }
  PendingCheckpoint& pending = pending_checkpoints_[job_id][state.step()];
  if (pending.began == absl::Time()) pending.began = options_.now();
  pending.have_worker_state = true;
  pending.worker_state = state.state();
  MaybeCommitCheckpoint(job_id, state.step());
}

void CoordinatorState::MaybeCommitCheckpoint(const std::string& job_id, int64_t step) {
  std::map<int64_t, PendingCheckpoint>& pending = pending_checkpoints_[job_id];
  auto it = pending.find(step);
  const JobStatus& job = jobs_[job_id];
  if (it == pending.end() || !it->second.have_worker_state ||
      static_cast<int>(it->second.shard_files.size()) < job.placement().shard_nodes_size()) {
    return;
  }
  CheckpointParts parts;
  parts.step = step;
  parts.worker_state = it->second.worker_state;
  for (const auto& [shard, file] : it->second.shard_files) parts.shard_files.push_back(file);
  const absl::Time began = it->second.began;
  absl::StatusOr<CheckpointInfo> info =
      CommitCheckpoint(options_.checkpoint_root, job, parts, ToMillis(options_.now()));
  if (!info.ok()) {
    AbandonCheckpoint(job_id, step, std::string(info.status().message()));
    return;
  }
  JobStatus updated = job;
  *updated.add_checkpoints() = *info;
  updated.set_restarts_in_a_row(0);  // Progress.
  AddEvent(
      &updated,
      absl::StrCat("checkpoint at step ", step, " written (", Bytes(info->bytes()), ", ",
                   absl::FormatDuration(absl::Trunc(options_.now() - began, absl::Milliseconds(1))),
                   " after rank 0 took it)"));
  if (updated.checkpoint_requested_ms() > 0 &&
      updated.checkpoint_requested_ms() <= ToMillis(began)) {
    updated.set_checkpoint_requested_ms(0);
  }
  const int keep = std::max(1, updated.spec().checkpoint().keep());
  if (updated.checkpoints_size() > keep) {
    updated.mutable_checkpoints()->DeleteSubrange(0, updated.checkpoints_size() - keep);
  }
  pending.erase(pending.begin(), pending.upper_bound(step));
  settled_checkpoint_[job_id] = std::max(settled_checkpoint_[job_id], step);
  const bool finished = step == updated.spec().steps() && TrainingDone(updated);
  const absl::Status committed = finished ? FinishJob(updated, SUCCEEDED, Untrained(updated))
                                          : Commit(std::move(updated), /*durable=*/true);
  if (!committed.ok()) {
    // The files stay; the job does not know of them (its older checkpoints
    // stay too).
    LogWriteFailure(absl::StrCat("the checkpoint of job ", job_id, " at step ", step), committed);
    return;
  }
  // Older checkpoints go only now that a newer one is complete and recorded
  // (with what earlier starts of the job left unfinished).
  const JobStatus& now_recorded = jobs_[job_id];
  absl::Status gone =
      RemoveStaleCheckpoints(options_.checkpoint_root, job_id,
                             std::vector<CheckpointInfo>(now_recorded.checkpoints().begin(),
                                                         now_recorded.checkpoints().end()),
                             now_recorded.attempt(), step);
  if (!gone.ok()) {
    Log(absl::StrCat("job ", job_id, ": cannot remove old checkpoints: ", gone.message()));
  }
  // A job waiting for this checkpoint to move off a draining shard moves now.
  if (drains_.count(job_id)) TickDrains();
  if (finished) SchedulePending();
}

void CoordinatorState::AbandonCheckpoint(const std::string& job_id, int64_t step,
                                         const std::string& why) {
  std::map<int64_t, PendingCheckpoint>& pending = pending_checkpoints_[job_id];
  auto it = pending.find(step);
  const absl::Time began = it == pending.end() ? options_.now() : it->second.began;
  if (it != pending.end()) pending.erase(it);
  settled_checkpoint_[job_id] = std::max(settled_checkpoint_[job_id], step);
  JobStatus updated = jobs_[job_id];
  AddEvent(&updated, absl::StrCat("checkpoint at step ", step, " not written: ", why));
  if (updated.checkpoint_requested_ms() > 0 &&
      updated.checkpoint_requested_ms() <= ToMillis(began)) {
    updated.set_checkpoint_requested_ms(0);
  }
  absl::Status committed;
  if (step == updated.spec().steps() && TrainingDone(updated)) {
    committed =
        FinishJob(updated, SUCCEEDED,
                  absl::StrCat("trained", Untrained(updated).empty() ? "" : " ", Untrained(updated),
                               ", but the final checkpoint was not written: ", why));
    SchedulePending();
  } else {
    committed = Commit(std::move(updated), /*durable=*/true);
  }
  if (!committed.ok()) {
    LogWriteFailure(absl::StrCat("the failed checkpoint of job ", job_id, " at step ", step),
                    committed);
  }
}

void CoordinatorState::TickCheckpoints() {
  const absl::Time now = options_.now();
  for (const std::string& id : job_order_) {
    const JobStatus& job = jobs_[id];
    if (job.state() != RUNNING || !Saves(job)) continue;
    std::vector<int64_t> expired;
    for (const auto& [step, pending] : pending_checkpoints_[id]) {
      if (now - pending.began > options_.checkpoint_timeout) expired.push_back(step);
    }
    for (int64_t step : expired) {
      AbandonCheckpoint(
          id, step,
          absl::StrCat("not complete after ", absl::FormatDuration(options_.checkpoint_timeout),
                       " (a shard's file or rank 0's state never came)"));
    }
    if (jobs_[id].state() != RUNNING) continue;
    JobStatus updated = jobs_[id];
    if (TrainingDone(updated) && pending_checkpoints_[id].count(updated.spec().steps()) == 0) {
      // Rank 0's part of the final checkpoint went with a coordinator that
      // restarted since.
      AbandonCheckpoint(id, updated.spec().steps(), "the coordinator restarted while it was taken");
      continue;
    }
    const int64_t requested = updated.checkpoint_requested_ms();
    if (requested > 0 && now - absl::FromUnixMillis(requested) > options_.checkpoint_timeout &&
        pending_checkpoints_[id].empty()) {
      updated.set_checkpoint_requested_ms(0);
      AddEvent(&updated, absl::StrCat("the checkpoint asked for was not taken within ",
                                      absl::FormatDuration(options_.checkpoint_timeout)));
    } else if (requested == 0 && updated.spec().checkpoint().every_seconds() > 0) {
      int64_t last = updated.start_time_ms();
      if (!updated.checkpoints().empty()) {
        last = std::max(last, updated.checkpoints().rbegin()->time_ms());
      }
      if (ToMillis(now) - last < updated.spec().checkpoint().every_seconds() * 1000) continue;
      updated.set_checkpoint_requested_ms(ToMillis(now));
    } else {
      continue;
    }
    absl::Status committed = Commit(std::move(updated), /*durable=*/false);
    if (!committed.ok()) LogWriteFailure(absl::StrCat("the checkpoint cadence of ", id), committed);
  }
}

absl::Status CoordinatorState::FailOrRestart(const JobStatus& job, const std::string& why,
                                             bool diverged, bool moved) {
  const RestartPolicy& policy = job.spec().restart();
  const int max_restarts =
      policy.max_restarts() == 0 ? kDefaultMaxRestarts : std::max(0, policy.max_restarts());
  if (!moved &&
      (job.restarts_in_a_row() >= max_restarts || (diverged && !policy.rollback_on_divergence()))) {
    return FinishJob(job, FAILED,
                     job.restarts_in_a_row() == 0
                         ? why
                         : absl::StrCat(why, " (after ", job.restarts_in_a_row(),
                                        " automatic restarts without progress; `downpourctl get` "
                                        "has the history)"));
  }
  JobStatus updated = job;
  updated.set_restarts(job.restarts() + 1);
  if (!moved) updated.set_restarts_in_a_row(job.restarts_in_a_row() + 1);
  // Its newest complete checkpoint (a damaged one is refused, and the one
  // before taken), or the start.
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> restore = NewestCheckpoint(job, &refused);
  for (const std::string& reason : refused) AddEvent(&updated, absl::StrCat("refused ", reason));
  const int64_t from = restore.ok() ? restore->step() : 0;
  auto* list = updated.mutable_checkpoints();
  list->erase(std::remove_if(list->begin(), list->end(),
                             [&](const CheckpointInfo& c) { return c.step() > from; }),
              list->end());
  if (restore.ok()) {
    *updated.mutable_restore() = *std::move(restore);
  } else {
    updated.clear_restore();
  }
  const absl::Duration backoff =
      moved ? absl::ZeroDuration()
            : std::min(absl::Minutes(5),
                       absl::Seconds(policy.backoff_seconds() > 0 ? policy.backoff_seconds()
                                                                  : kDefaultBackoffSeconds) *
                           (int64_t{1} << std::min(job.restarts_in_a_row(), 16)));
  AddEvent(&updated, absl::StrCat("restart ", updated.restarts(),
                                  moved ? " (a move, not counted)"
                                        : absl::StrCat(" (", updated.restarts_in_a_row(), " of ",
                                                       max_restarts, " in a row)"),
                                  " in ", absl::FormatDuration(backoff), " after: ", why,
                                  "; at step ", job.step(), ", continues ",
                                  restore.ok() ? absl::StrCat("from the checkpoint at step ", from)
                                               : "from the start (no checkpoint yet)"));
  updated.set_state(PENDING);
  updated.set_message(absl::StrCat("restarting after: ", why));
  updated.set_test_accuracy(-1);
  updated.clear_test_auc();
  updated.clear_test_log_loss();
  updated.set_resumed_from_step(from);
  updated.set_checkpoint_requested_ms(0);
  updated.set_not_before_ms(ToMillis(options_.now() + backoff));
  RETURN_IF_ERROR(Commit(std::move(updated), /*durable=*/true));
  pending_checkpoints_.erase(job.id());
  return absl::OkStatus();
}

absl::StatusOr<CheckpointRestore> CoordinatorState::NewestCheckpoint(
    const JobStatus& job, std::vector<std::string>* refused) const {
  if (options_.checkpoint_root.empty() || job.checkpoints().empty()) {
    return absl::NotFoundError("no checkpoint yet");
  }
  return CompleteCheckpoint(
      options_.checkpoint_root,
      std::vector<CheckpointInfo>(job.checkpoints().begin(), job.checkpoints().end()), 0, refused);
}

absl::StatusOr<SafetensorsFile> CoordinatorState::ReadInitialWeights(const InitFrom& init,
                                                                     std::string* what) {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        "starting from saved weights needs the coordinator's --checkpoint_root (the new job's "
        "weights are written there)");
  }
  if (init.job_id().empty()) {
    *what = init.weights_name().empty() ? "the uploaded weights" : init.weights_name();
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(init.weights(), *what);
    if (!file.ok()) return absl::InvalidArgumentError(file.status().message());
    return file;
  }
  std::vector<CheckpointInfo> checkpoints;
  JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobStatus * source, FindJob(init.job_id()));
    checkpoints.assign(source->checkpoints().begin(), source->checkpoints().end());
    spec = source->spec();
  }
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> checkpoint =
      CompleteCheckpoint(options_.checkpoint_root, checkpoints, init.step(), &refused);
  if (!checkpoint.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", init.job_id(), ": ", checkpoint.status().message(),
                     refused.empty() ? "" : absl::StrCat(" (", absl::StrJoin(refused, "; "), ")")));
  }
  *what = absl::StrCat("job ", init.job_id(), "'s checkpoint at step ", checkpoint->step());
  ASSIGN_OR_RETURN(std::string bytes, ExportCheckpoint(options_.checkpoint_root, init.job_id(),
                                                       spec, *checkpoint, ExportLayout::kNative));
  return SafetensorsFile::Parse(std::move(bytes), *what);
}

absl::StatusOr<JobStatus> CoordinatorState::CheckpointJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
  if (job->state() != RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobState_Name(job->state()), "; only a running job checkpoints"));
  }
  if (!Saves(*job)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id,
                     " is not saved: start the coordinator and every shard with "
                     "--checkpoint_root (a directory they share)"));
  }
  JobStatus updated = *job;
  updated.set_checkpoint_requested_ms(ToMillis(options_.now()));
  RETURN_IF_ERROR(Commit(std::move(updated), /*durable=*/false));
  return jobs_[job_id];
}

absl::StatusOr<JobStatus> CoordinatorState::ResumeJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  std::vector<CheckpointInfo> checkpoints;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
    if (job->state() != FAILED && job->state() != STOPPED) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ",
                                                        JobState_Name(job->state()),
                                                        "; only a FAILED or STOPPED job resumes"));
    }
    if (options_.checkpoint_root.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " cannot resume: this coordinator has no --checkpoint_root"));
    }
    checkpoints.assign(job->checkpoints().begin(), job->checkpoints().end());
  }
  // Reading every file takes a while for a large model: outside the lock.
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> restore =
      CompleteCheckpoint(options_.checkpoint_root, checkpoints, 0, &refused);

  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
  if (job->state() != FAILED && job->state() != STOPPED) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " changed state meanwhile"));
  }
  JobStatus updated = *job;
  for (const std::string& why : refused) AddEvent(&updated, absl::StrCat("refused ", why));
  // Refused checkpoints are no longer offered.
  const int64_t kept_step = restore.ok() ? restore->step() : 0;
  auto* list = updated.mutable_checkpoints();
  list->erase(std::remove_if(list->begin(), list->end(),
                             [&](const CheckpointInfo& c) { return c.step() > kept_step; }),
              list->end());
  if (!restore.ok()) {
    RETURN_IF_ERROR(Commit(std::move(updated), /*durable=*/true));
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " cannot resume: it has no complete checkpoint",
                     refused.empty() ? "" : absl::StrCat(" (", absl::StrJoin(refused, "; "), ")")));
  }
  AddEvent(&updated,
           absl::StrCat("resume asked: continues from the checkpoint at step ", restore->step()));
  updated.set_state(PENDING);
  updated.set_message("");
  updated.set_test_accuracy(-1);
  updated.clear_test_auc();
  updated.clear_test_log_loss();
  updated.set_end_time_ms(0);
  updated.set_resumed_from_step(restore->step());
  *updated.mutable_restore() = *std::move(restore);
  RETURN_IF_ERROR(Commit(std::move(updated), /*durable=*/true));
  SchedulePending();
  return jobs_[job_id];
}

absl::StatusOr<std::string> CoordinatorState::ExportJob(const std::string& job_id, int64_t step,
                                                        bool native_layout) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  std::vector<CheckpointInfo> checkpoints;
  JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
    if (job->checkpoints().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " has no checkpoint",
          options_.checkpoint_root.empty() ? " (this coordinator has no --checkpoint_root)" : ""));
    }
    checkpoints.assign(job->checkpoints().begin(), job->checkpoints().end());
    spec = job->spec();
  }
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> checkpoint =
      CompleteCheckpoint(options_.checkpoint_root, checkpoints, step, &refused);
  if (!checkpoint.ok()) {
    std::vector<int64_t> steps;
    for (const CheckpointInfo& c : checkpoints) steps.push_back(c.step());
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, ": ", checkpoint.status().message(),
                     refused.empty() ? "" : absl::StrCat(" (", absl::StrJoin(refused, "; "), ")"),
                     "; it has checkpoints at steps ", absl::StrJoin(steps, ", ")));
  }
  return ExportCheckpoint(options_.checkpoint_root, job_id, spec, *checkpoint,
                          native_layout ? ExportLayout::kNative : ExportLayout::kPyTorch);
}

}  // namespace control
}  // namespace downpour
