// CoordinatorState's checkpoints: the parts shards and the checkpointing
// rank send in (CheckpointOrchestrator gathers them), what a complete or a
// failed checkpoint does to its job, the cadence Tick keeps, and the
// operator's checkpoint, resume and export.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "control/checkpoints.h"
#include "control/coordinator_state.h"
#include "control/export.h"
#include "control/request_limits.h"
#include "spec/onnx_import.h"

namespace downpour {
namespace control {
namespace {

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

void CoordinatorState::TakeCheckpointPart(const CheckpointPart& part) {
  const JobStatus* job = jobs_.Find(part.job_id());
  if (job == nullptr || job->state() != RUNNING || !Saves(*job)) return;
  Settle(part.job_id(), part.step(), checkpoints_.TakeShardPart(*job, part));
}

void CoordinatorState::TakeWorkerState(const std::string& job_id,
                                       const CheckpointWorkerState& state) {
  const JobStatus* job = jobs_.Find(job_id);
  if (job == nullptr || job->state() != RUNNING || !Saves(*job)) return;
  Settle(job_id, state.step(), checkpoints_.TakeWorkerState(*job, state));
}

void CoordinatorState::Settle(const std::string& job_id, int64_t step,
                              const CheckpointOrchestrator::Gathered& gathered) {
  using Kind = CheckpointOrchestrator::Gathered::Kind;
  if (gathered.kind == Kind::kWaiting) return;
  if (gathered.kind == Kind::kFailed) {
    AbandonCheckpoint(job_id, step, gathered.why);
    return;
  }
  absl::StatusOr<JobStatus> updated = checkpoints_.Commit(*jobs_.Find(job_id), gathered);
  if (!updated.ok()) {
    AbandonCheckpoint(job_id, step, std::string(updated.status().message()));
    return;
  }
  const bool finished = step == updated->spec().steps() && TrainingDone(*updated);
  const absl::Status committed =
      finished ? FinishJob(*updated, SUCCEEDED, RankHandover::Untrained(*updated))
               : jobs_.Commit(*std::move(updated), /*durable=*/true);
  // On failure the files stay; the job does not know of them (its older
  // checkpoints stay too).
  NoteWrite(absl::StrCat("the checkpoint of job ", job_id, " at step ", step), committed);
  if (!committed.ok()) return;
  checkpoints_.RemoveStale(*jobs_.Find(job_id), step);
  // A job waiting for this checkpoint to move off a draining shard moves now.
  if (checkpoints_.Draining(job_id)) TickDrains();
  if (finished) SchedulePending();
}

void CoordinatorState::AbandonCheckpoint(const std::string& job_id, int64_t step,
                                         const std::string& why) {
  JobStatus updated = checkpoints_.Abandon(*jobs_.Find(job_id), step, why);
  absl::Status committed;
  if (step == updated.spec().steps() && TrainingDone(updated)) {
    updated.set_final_checkpoint_missing(
        absl::StrCat("its final checkpoint (step ", step, ") was not written: ", why));
    const std::string untrained = RankHandover::Untrained(updated);
    committed = FinishJob(updated, SUCCEEDED,
                          absl::StrCat("trained", untrained.empty() ? "" : " ", untrained,
                                       ", but the final checkpoint was not written: ", why));
    SchedulePending();
  } else {
    committed = jobs_.Commit(std::move(updated), /*durable=*/true);
  }
  NoteWrite(absl::StrCat("the failed checkpoint of job ", job_id, " at step ", step), committed);
}

void CoordinatorState::TickCheckpoints() {
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus* job = jobs_.Find(id);
    if (job->state() != RUNNING || !Saves(*job)) continue;
    for (int64_t step : checkpoints_.Overdue(id)) {
      AbandonCheckpoint(
          id, step,
          absl::StrCat("not complete after ", absl::FormatDuration(options_.checkpoint_timeout),
                       " (a shard's file or rank 0's state never came)"));
    }
    job = jobs_.Find(id);
    if (job->state() != RUNNING) continue;
    const int64_t final_step = job->spec().steps();
    if (TrainingDone(*job) && !checkpoints_.Gathering(id, final_step)) {
      // The checkpointing rank's part of the final checkpoint went with a
      // coordinator that restarted since.
      AbandonCheckpoint(id, final_step, "the coordinator restarted while it was taken");
      continue;
    }
    std::optional<JobStatus> cadence = checkpoints_.Cadence(*job);
    if (cadence.has_value()) {
      NoteWrite(absl::StrCat("the checkpoint cadence of ", id),
                jobs_.Commit(*std::move(cadence), /*durable=*/false));
    }
  }
}

absl::StatusOr<SafetensorsFile> CoordinatorState::ReadOnnxModel(const ModelFile& file,
                                                                JobSpec* spec, std::string* what) {
  *what = absl::StrCat("ONNX model ", file.name().empty() ? "(uploaded)" : file.name());
  if (spec->has_model()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job spec has a model and the request brings one from ", *what,
                     "; leave model out of the spec (it holds only the training part)"));
  }
  if (checkpoints_.root().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a job from ", *what,
                     " starts from the graph's weights, which needs the coordinator's "
                     "--checkpoint_root (they are written there)"));
  }
  ASSIGN_OR_RETURN(ImportedModel imported, ImportOnnx(file.onnx(), file.name()));
  *spec->mutable_model() = std::move(imported.model);
  absl::StatusOr<SafetensorsFile> weights =
      SafetensorsFile::Parse(std::move(imported.weights), *what);
  if (!weights.ok()) return absl::InternalError(weights.status().message());
  return weights;
}

absl::StatusOr<SafetensorsFile> CoordinatorState::ReadInitialWeights(const InitFrom& init,
                                                                     std::string* what) {
  if (checkpoints_.root().empty()) {
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
    ASSIGN_OR_RETURN(JobStatus source, jobs_.Get(init.job_id()));
    checkpoints.assign(source.checkpoints().begin(), source.checkpoints().end());
    spec = source.spec();
  }
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> checkpoint =
      CompleteCheckpoint(checkpoints_.root(), checkpoints, init.step(), &refused);
  if (!checkpoint.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", init.job_id(), ": ", checkpoint.status().message(),
                     refused.empty() ? "" : absl::StrCat(" (", absl::StrJoin(refused, "; "), ")")));
  }
  *what = absl::StrCat("job ", init.job_id(), "'s checkpoint at step ", checkpoint->step());
  ASSIGN_OR_RETURN(std::string bytes, ExportCheckpoint(checkpoints_.root(), init.job_id(), spec,
                                                       *checkpoint, ExportLayout::kNative));
  return SafetensorsFile::Parse(std::move(bytes), *what);
}

absl::StatusOr<JobStatus> CoordinatorState::CheckpointJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobStatus* job, jobs_.Lookup(job_id));
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
  RETURN_IF_ERROR(jobs_.Commit(std::move(updated), /*durable=*/false));
  return *jobs_.Find(job_id);
}

absl::StatusOr<JobStatus> CoordinatorState::ResumeJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  std::vector<CheckpointInfo> checkpoints;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const JobStatus* job, jobs_.Lookup(job_id));
    if (job->state() != FAILED && job->state() != STOPPED) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ",
                                                        JobState_Name(job->state()),
                                                        "; only a FAILED or STOPPED job resumes"));
    }
    if (checkpoints_.root().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " cannot resume: this coordinator has no --checkpoint_root"));
    }
    checkpoints.assign(job->checkpoints().begin(), job->checkpoints().end());
  }
  // Reading every file takes a while for a large model: outside the lock.
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> restore =
      CompleteCheckpoint(checkpoints_.root(), checkpoints, 0, &refused);

  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobStatus* job, jobs_.Lookup(job_id));
  if (job->state() != FAILED && job->state() != STOPPED) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " changed state meanwhile"));
  }
  JobStatus updated = *job;
  for (const std::string& why : refused) history_.AddEvent(&updated, absl::StrCat("refused ", why));
  // Refused checkpoints are no longer offered.
  const int64_t kept_step = restore.ok() ? restore->step() : 0;
  auto* list = updated.mutable_checkpoints();
  list->erase(std::remove_if(list->begin(), list->end(),
                             [&](const CheckpointInfo& c) { return c.step() > kept_step; }),
              list->end());
  if (!restore.ok()) {
    RETURN_IF_ERROR(jobs_.Commit(std::move(updated), /*durable=*/true));
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " cannot resume: it has no complete checkpoint",
                     refused.empty() ? "" : absl::StrCat(" (", absl::StrJoin(refused, "; "), ")")));
  }
  history_.AddEvent(&updated, absl::StrCat("resume asked: continues from the checkpoint at step ",
                                           restore->step()));
  updated.set_state(PENDING);
  updated.set_pending_since_ms(absl::ToUnixMillis(options_.now()));
  updated.set_message("");
  updated.set_test_accuracy(-1);
  updated.clear_test_auc();
  updated.clear_test_log_loss();
  updated.set_end_time_ms(0);
  updated.set_resumed_from_step(restore->step());
  *updated.mutable_restore() = *std::move(restore);
  RETURN_IF_ERROR(jobs_.Commit(std::move(updated), /*durable=*/true));
  SchedulePending();
  return *jobs_.Find(job_id);
}

absl::StatusOr<std::string> CoordinatorState::ExportJob(const std::string& job_id, int64_t step,
                                                        bool native_layout) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  ASSIGN_OR_RETURN(const JobStatus job, jobs_.Get(job_id));
  if (job.checkpoints().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no checkpoint",
        checkpoints_.root().empty() ? " (this coordinator has no --checkpoint_root)" : ""));
  }
  std::vector<int64_t> steps;
  for (const CheckpointInfo& c : job.checkpoints()) steps.push_back(c.step());
  const std::string older =
      absl::StrCat("; it has checkpoints at steps ", absl::StrJoin(steps, ", "),
                   ": export one with --checkpoint=STEP");
  // Without a step: the job's final state, or its newest checkpoint while it
  // has none; never an older one in their place.
  if (step == 0 && !job.final_checkpoint_missing().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, "'s final state was not saved: ", job.final_checkpoint_missing(), older));
  }
  const int64_t wanted = step == 0 ? steps.back() : step;
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> checkpoint = CompleteCheckpoint(
      checkpoints_.root(),
      std::vector<CheckpointInfo>(job.checkpoints().begin(), job.checkpoints().end()), wanted,
      &refused);
  if (!checkpoint.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, ": ", step == 0 ? "its newest checkpoint cannot be read: " : "",
        refused.empty() ? std::string(checkpoint.status().message()) : absl::StrJoin(refused, "; "),
        older));
  }
  // What the job recorded of the model at that step, for the file's reader.
  std::map<std::string, std::string> recorded;
  for (const Evaluation& evaluation : job.evaluations()) {
    if (evaluation.step() == wanted) {
      recorded["downpour.test_accuracy"] = absl::StrCat(evaluation.accuracy());
    }
  }
  return ExportCheckpoint(checkpoints_.root(), job_id, job.spec(), *checkpoint,
                          native_layout ? ExportLayout::kNative : ExportLayout::kPyTorch, recorded);
}

}  // namespace control
}  // namespace downpour
