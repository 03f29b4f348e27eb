#include "control/coordinator_state.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "control/checkpoints.h"
#include "control/export.h"
#include "control/request_limits.h"
#include "control/scheduler.h"
#include "spec/job_validation.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

bool InPlacement(const Placement& placement, const std::string& node_id) {
  return std::count(placement.shard_nodes().begin(), placement.shard_nodes().end(), node_id) +
             std::count(placement.worker_nodes().begin(), placement.worker_nodes().end(), node_id) >
         0;
}

absl::Status NoSuchJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
}

bool HasCheckpointAt(const JobStatus& job, int64_t step) {
  return !job.checkpoints().empty() && job.checkpoints().rbegin()->step() == step;
}

// The job's test_auc and test_log_loss are the newest evaluation's (final or
// periodic), cleared where it has none; its scalars go to TensorBoard.
void RecordEvaluation(const Evaluation& evaluation, TensorBoardWriter* tensorboard,
                      JobStatus* job) {
  if (evaluation.has_auc()) {
    job->set_test_auc(evaluation.auc());
  } else {
    job->clear_test_auc();
  }
  if (evaluation.has_log_loss()) {
    job->set_test_log_loss(evaluation.log_loss());
  } else {
    job->clear_test_log_loss();
  }
  if (tensorboard == nullptr) return;
  tensorboard->AddScalar(job->id(), "test_accuracy", evaluation.step(), evaluation.accuracy());
  if (evaluation.has_auc()) {
    tensorboard->AddScalar(job->id(), "test_auc", evaluation.step(), evaluation.auc());
  }
  if (evaluation.has_log_loss()) {
    tensorboard->AddScalar(job->id(), "test_log_loss", evaluation.step(), evaluation.log_loss());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorState>> CoordinatorState::Create(
    Options options, std::unique_ptr<JobStore> store) {
  auto state =
      std::unique_ptr<CoordinatorState>(new CoordinatorState(std::move(options), std::move(store)));
  ASSIGN_OR_RETURN(std::vector<JobStatus> jobs, state->store_->LoadJobs());
  ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, state->store_->LoadNodes());
  absl::MutexLock lock(&state->mu_);
  const absl::Time now = state->options_.now();
  state->grace_until_ = now + state->options_.recovery_grace;
  for (NodeInfo& node : nodes) {
    NodeEntry& entry = state->nodes_[node.id()];
    entry.info = std::move(node);
    entry.last_heartbeat = now;
    entry.heard = false;
    // A node dead before the restart stays dead, as last heard then.
    if (!entry.info.alive() && entry.info.last_heartbeat_ms() > 0) {
      entry.last_heartbeat = absl::FromUnixMillis(entry.info.last_heartbeat_ms());
    }
  }
  for (JobStatus& job : jobs) {
    state->job_order_.push_back(job.id());
    state->jobs_[job.id()] = std::move(job);
  }
  return state;
}

CoordinatorState::CoordinatorState(Options options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      tensorboard_(options_.tensorboard_dir.empty()
                       ? nullptr
                       : std::make_unique<TensorBoardWriter>(TensorBoardWriter::Options{
                             options_.tensorboard_dir, "", options_.now})) {}

absl::Time CoordinatorState::Deadline(const NodeEntry& node) const {
  const absl::Time deadline = node.last_heartbeat + options_.node_timeout;
  return node.heard ? deadline : std::max(deadline, grace_until_);
}

bool CoordinatorState::Alive(const NodeEntry& node) const {
  return node.info.alive() && options_.now() <= Deadline(node);
}

NodeInfo CoordinatorState::Describe(const NodeEntry& node) const {
  NodeInfo info = node.info;
  info.set_alive(Alive(node));
  info.set_draining(node.draining);
  info.set_last_heartbeat_ms(ToMillis(node.last_heartbeat));
  return info;
}

absl::StatusOr<JobStatus*> CoordinatorState::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoSuchJob(job_id);
  return &it->second;
}

absl::Status CoordinatorState::SaveNode(const NodeInfo& info) {
  RETURN_IF_ERROR(store_->SaveNode(info));
  nodes_[info.id()].info = info;
  return absl::OkStatus();
}

absl::StatusOr<RegisterNodeResponse> CoordinatorState::RegisterNode(const NodeInfo& node) {
  RETURN_IF_ERROR(CheckNodeInfo(node));
  if (node.id().empty()) return absl::InvalidArgumentError("node id is required");
  if (node.role() != SHARD && node.role() != WORKER) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node.id(), ": role must be SHARD or WORKER"));
  }
  if (node.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", node.id(), ": address is required"));
  }
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.id());
  const bool known = it != nodes_.end();
  if (known && it->second.info.incarnation() != node.incarnation()) {
    RETURN_IF_ERROR(FailJobsOfNode(node.id(), absl::StrCat("node ", node.id(), " restarted")));
  }
  NodeInfo info = node;
  info.set_alive(true);
  // An operator's cordon outlives the node's restarts.
  info.set_cordoned(known && it->second.info.cordoned());
  const bool arrived =
      !known || !it->second.info.alive() || it->second.info.incarnation() != node.incarnation();
  RETURN_IF_ERROR(SaveNode(info));
  if (arrived) {
    Log(absl::StrCat(node.role() == SHARD ? "shard" : "worker", " node ", node.id(), " at ",
                     node.address(), known ? " registered again" : " joined",
                     info.cordoned() ? " (cordoned: no new work)" : ""));
  }
  nodes_[node.id()].last_heartbeat = options_.now();
  nodes_[node.id()].heard = true;
  SchedulePending();
  RegisterNodeResponse response;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::StatusOr<HeartbeatResponse> CoordinatorState::Heartbeat(const HeartbeatRequest& request) {
  RETURN_IF_ERROR(CheckHeartbeatRequest(request));
  absl::MutexLock lock(&mu_);
  HeartbeatResponse response;
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.incarnation() != request.incarnation()) {
    response.set_reregister(true);
    return response;
  }
  NodeEntry& node = it->second;
  node.last_heartbeat = options_.now();
  node.heard = true;
  if (request.draining() && !node.draining) {
    node.draining = true;
    Log(absl::StrCat("node ", request.node_id(), " is draining"));
    if (node.info.role() == SHARD) DrainShard(node.info.id());
  }
  if (!node.info.alive()) {
    // Back from the dead: alive again once that is recorded (the next
    // heartbeat tries again otherwise).
    NodeInfo info = node.info;
    info.set_alive(true);
    const std::string what = absl::StrCat("node ", info.id(), " alive again");
    absl::Status saved = SaveNode(info);
    if (saved.ok()) {
      write_failures_.erase(what);
      SchedulePending();
    } else {
      LogWriteFailure(what, saved);
    }
  }
  if (node.info.role() == SHARD) {
    for (const CheckpointPart& part : request.checkpoints()) TakeCheckpointPart(part);
  }
  for (const JobLogLine& line : request.logs()) {
    // Only what a line is, its text cut to the limit (a long line is the
    // node's own output: it never costs the node its heartbeat).
    JobLogLine from_node;
    from_node.set_job_id(line.job_id());
    from_node.set_source(node.info.id());
    from_node.set_time_ms(line.time_ms());
    from_node.set_text(TruncateText(line.text(), kMaxLogLineBytes));
    AppendJobLog(std::move(from_node));
  }
  response.set_released(node.draining && Released(node.info.id()));
  for (const std::string& id : job_order_) {
    const JobStatus& job = jobs_[id];
    if (job.state() != RUNNING || !InPlacement(job.placement(), node.info.id())) continue;
    Task* task = response.add_tasks();
    task->set_job_id(job.id());
    task->set_attempt(job.attempt());
    task->set_checkpoints(Saves(job));
    task->set_checkpoint_requested_ms(job.checkpoint_requested_ms());
    if (job.has_restore()) {
      *task->mutable_restore() = job.restore();
      // Shards restore from the files; the workers' state (up to
      // kMaxWorkerStateBytes) goes to workers only, so a shard hosting many
      // jobs is not sent it once per job every heartbeat.
      if (node.info.role() == SHARD) task->mutable_restore()->clear_worker_state();
    }
    *task->mutable_spec() = job.spec();
    *task->mutable_placement() = job.placement();
    for (const std::string& shard : job.placement().shard_nodes()) {
      task->add_shard_addresses(nodes_[shard].info.address());
    }
    const auto& nodes =
        node.info.role() == SHARD ? job.placement().shard_nodes() : job.placement().worker_nodes();
    task->set_rank(std::find(nodes.begin(), nodes.end(), node.info.id()) - nodes.begin());
    for (const WorkerProgress& worker : job.workers()) {
      if (worker.lost() || worker.finished()) task->add_absent_ranks(worker.rank());
    }
    if (node.info.role() != WORKER) continue;
    const WorkerProgress& worker = job.workers(task->rank());
    // A worker that took its rank over continues where the rank had got to,
    // with the workers' state of the checkpoint the job records (the hand-over
    // made it the newest).
    if (worker.joined()) {
      task->mutable_join()->set_step(worker.step());
      task->mutable_join()->set_worker_state(job.restore().worker_state());
    }
    *task->mutable_data() = worker.data();
    task->set_data_step(worker.data_step());
    task->set_steps(worker.steps());
    task->set_batches_per_step(worker.batches_per_step());
    task->set_takes_checkpoints(task->checkpoints() && task->rank() == CheckpointRank(job));
  }
  return response;
}

absl::StatusOr<std::vector<NodeInfo>> CoordinatorState::ListNodes() {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> out;
  for (const auto& [id, node] : nodes_) out.push_back(Describe(node));
  return out;
}

std::string CoordinatorState::NewJobId(const std::string& name) {
  std::string base;
  for (char c : name) {
    base.push_back(std::isalnum(static_cast<uint8_t>(c)) || c == '-' || c == '_' ? c : '-');
  }
  if (base.empty() || !std::isalnum(static_cast<uint8_t>(base[0]))) base = "job" + base;
  base = base.substr(0, 48);
  for (size_t n = jobs_.size() + 1;; ++n) {
    std::string id = absl::StrCat(base, "-", n);
    if (jobs_.count(id) == 0) return id;
  }
}

absl::StatusOr<JobStatus> CoordinatorState::SubmitJob(const SubmitJobRequest& request) {
  RETURN_IF_ERROR(CheckSubmitJobRequest(request));
  JobSpec spec = request.spec();
  ApplyJobDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec).status());
  // Initial weights are read (and checked) before the job exists.
  std::optional<SafetensorsFile> init;
  std::string init_from;
  if (request.has_init_from()) {
    ASSIGN_OR_RETURN(init, ReadInitialWeights(request.init_from(), &init_from));
  }
  absl::MutexLock lock(&mu_);
  std::string id = request.job_id();
  if (id.empty()) {
    id = NewJobId(spec.name());
  } else {
    RETURN_IF_ERROR(ValidateJobId(id));
    if (jobs_.count(id)) {
      return absl::AlreadyExistsError(absl::StrCat("job id \"", id, "\" already exists"));
    }
  }
  JobStatus job;
  job.set_id(id);
  *job.mutable_spec() = spec;
  job.set_state(PENDING);
  job.set_test_accuracy(-1);
  job.set_submit_time_ms(ToMillis(options_.now()));
  if (init.has_value()) {
    // The weights become the job's checkpoint at step 0: it starts (and
    // restarts, until it has a newer one) from them.
    ASSIGN_OR_RETURN(CheckpointInfo info, WriteInitialCheckpoint(options_.checkpoint_root, id, spec,
                                                                 *init, ToMillis(options_.now())));
    std::vector<std::string> refused;
    ASSIGN_OR_RETURN(CheckpointRestore restore,
                     CompleteCheckpoint(options_.checkpoint_root, {info}, 0, &refused));
    *job.add_checkpoints() = info;
    *job.mutable_restore() = std::move(restore);
    AddEvent(&job, absl::StrCat("initial weights from ", init_from));
  }
  RETURN_IF_ERROR(Commit(job, /*durable=*/true));
  job_order_.push_back(id);
  Log(absl::StrCat("job ", id, " submitted: ", spec.name().empty() ? "unnamed" : spec.name(), ", ",
                   spec.num_workers(), " workers, ", spec.num_shards(), " shards, ", spec.steps(),
                   " steps, ", ConsistencySpec::Mode_Name(spec.consistency().mode())));
  SchedulePending();
  return jobs_[id];
}

absl::StatusOr<std::vector<JobStatus>> CoordinatorState::ListJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<JobStatus> out;
  for (const std::string& id : job_order_) out.push_back(ListedJob(jobs_[id]));
  return out;
}

JobStatus CoordinatorState::ListedJob(const JobStatus& job) {
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

absl::StatusOr<JobStatus> CoordinatorState::GetJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
  return *job;
}

absl::StatusOr<JobStatus> CoordinatorState::WatchJob(const std::string& job_id,
                                                     int64_t known_version,
                                                     absl::Duration timeout) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = options_.now() + timeout;
  while (true) {
    ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
    const absl::Time now = options_.now();
    if (job->version() > known_version || now >= deadline) return *job;
    // Tick wakes watchers too, so an injected clock that jumps is noticed.
    changed_.WaitWithTimeout(&mu_, deadline - now);
  }
}

absl::StatusOr<JobStatus> CoordinatorState::StopJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
  if (!IsTerminal(job->state())) {
    RETURN_IF_ERROR(FinishJob(*job, STOPPED, "stopped by operator"));
    SchedulePending();  // Its workers are free now.
  }
  return jobs_[job_id];
}

absl::StatusOr<ReportProgressResponse> CoordinatorState::ReportProgress(
    const ReportProgressRequest& request) {
  RETURN_IF_ERROR(CheckReportProgressRequest(request));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * current, FindJob(request.job_id()));
  ReportProgressResponse response;
  // A run of an earlier start of the job (its report was in flight when the
  // job started again) has ended: nothing it says applies to this start.
  if (current->state() != RUNNING ||
      (request.attempt() != 0 && request.attempt() != current->attempt())) {
    response.set_job_ended(true);
    return response;
  }
  const int rank = request.rank();
  if (rank < 0 || rank >= current->workers_size() ||
      current->placement().worker_nodes(rank) != request.node_id()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "node ", request.node_id(), " is not worker rank ", rank, " of job ", current->id()));
  }
  if (request.data_files_size() > 0) return AssignData(*current, rank, request);
  if (request.drained()) {
    // A leaving worker takes no rank over, not even the one it gave back.
    nodes_[request.node_id()].draining = true;
    JobStatus job = *current;
    job.mutable_workers(rank)->set_step(request.step());
    RETURN_IF_ERROR(LoseWorker(
        job, rank,
        absl::StrCat("worker ", request.node_id(), " drained after step ", request.step())));
    SchedulePending();
    response.set_job_ended(true);
    return response;
  }
  if (!request.error().empty()) {
    // The worker's own words, cut to the limit: refused, they would leave
    // the job running without the worker.
    const std::string why = absl::StrCat("worker ", rank, " (", request.node_id(),
                                         "): ", TruncateText(request.error(), kMaxMessageBytes));
    RETURN_IF_ERROR(request.permanent() ? FinishJob(*current, FAILED, why)
                                        : FailOrRestart(*current, why, request.diverged()));
    SchedulePending();
    response.set_job_ended(true);
    return response;
  }
  JobStatus job = *current;
  WorkerProgress* worker = job.mutable_workers(rank);
  const bool milestone = (request.finished() && !worker->finished()) ||
                         request.has_test_accuracy() || request.has_evaluation();
  worker->set_step(request.step());
  worker->set_loss(request.loss());
  worker->set_examples_per_sec(request.examples_per_sec());
  worker->set_finished(worker->finished() || request.finished());
  if (request.has_test_accuracy()) {
    job.set_test_accuracy(request.test_accuracy());
    Evaluation* final = job.add_evaluations();
    final->set_step(request.step());
    final->set_accuracy(request.test_accuracy());
    if (request.has_test_auc()) final->set_auc(request.test_auc());
    if (request.has_test_log_loss()) final->set_log_loss(request.test_log_loss());
    final->set_time_ms(absl::ToUnixMillis(options_.now()));
    RecordEvaluation(*final, tensorboard_.get(), &job);
  }
  if (request.has_evaluation() && rank == 0) {
    Evaluation* evaluation = job.add_evaluations();
    evaluation->set_step(request.evaluation().step());
    evaluation->set_accuracy(request.evaluation().accuracy());
    if (request.evaluation().has_auc()) evaluation->set_auc(request.evaluation().auc());
    if (request.evaluation().has_log_loss()) {
      evaluation->set_log_loss(request.evaluation().log_loss());
    }
    evaluation->set_time_ms(absl::ToUnixMillis(options_.now()));
    RecordEvaluation(*evaluation, tensorboard_.get(), &job);
    // The curve keeps its newest points.
    constexpr int kMaxEvaluations = 1000;
    if (job.evaluations_size() > kMaxEvaluations) {
      job.mutable_evaluations()->DeleteSubrange(0, job.evaluations_size() - kMaxEvaluations);
    }
    const double target = job.spec().stop_at_accuracy();
    if (target > 0 && evaluation->accuracy() >= target) {
      job.set_test_accuracy(evaluation->accuracy());
      RETURN_IF_ERROR(FinishJob(
          job, SUCCEEDED,
          absl::StrCat("stopped early: test accuracy ", evaluation->accuracy(),
                       " reached stop_at_accuracy ", target, " at step ", evaluation->step(),
                       Saves(job) ? " (the newest checkpoint is from before it)" : "")));
      SchedulePending();
      response.set_job_ended(true);
      return response;
    }
  }

  // Lost ranks (no worker took them over) do not hold the job back.
  int64_t min_step = INT64_MAX;
  double loss = 0, rate = 0;
  int present = 0;
  bool training = false;
  for (const WorkerProgress& w : job.workers()) {
    if (w.lost()) continue;
    ++present;
    training = training || !w.finished();
    min_step = std::min(min_step, w.step());
    loss += w.loss();
    rate += w.finished() ? 0 : w.examples_per_sec();
  }
  // A worker taking a rank over, or a start from a checkpoint, reports an
  // earlier step than the job has shown: the step shown never goes back.
  job.set_step(std::max(job.step(), min_step));
  job.set_loss(loss / present);
  job.set_examples_per_sec(rate);
  RecordProgress(job);
  if (tensorboard_) {
    tensorboard_->AddScalar(job.id(), "loss", job.step(), job.loss());
    // Finished workers count no examples: the rate after the last one
    // finished says nothing about the run.
    if (training) {
      tensorboard_->AddScalar(job.id(), "examples_per_second", job.step(), job.examples_per_sec());
    }
  }
  const bool done = TrainingDone(job);
  if (done && (!Saves(job) || HasCheckpointAt(job, job.spec().steps()))) {
    RETURN_IF_ERROR(FinishJob(job, SUCCEEDED, Untrained(job)));
    SchedulePending();
    response.set_job_ended(true);
    return response;
  }
  // A saved job ends once its final checkpoint is written (rank 0 sends its
  // part with its last report).
  if (done) job.set_message("trained; writing the final checkpoint");
  RETURN_IF_ERROR(Commit(std::move(job), milestone));
  if (request.has_checkpoint() && rank == CheckpointRank(jobs_[request.job_id()]))
    TakeWorkerState(request.job_id(), request.checkpoint());
  return response;
}

void CoordinatorState::Tick() {
  absl::MutexLock lock(&mu_);
  DetectDeadNodes();
  TickCheckpoints();
  TickDrains();
  SchedulePending();
  TickRetention();
  changed_.SignalAll();
}

absl::Status CoordinatorState::Commit(JobStatus updated, bool durable) {
  updated.set_version(updated.version() + 1);
  const absl::Time now = options_.now();
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

absl::Status CoordinatorState::FinishJob(const JobStatus& job, JobState state,
                                         const std::string& message) {
  JobStatus ended = job;
  ended.set_state(state);
  ended.set_message(message);
  ended.set_end_time_ms(ToMillis(options_.now()));
  ended.set_examples_per_sec(0);
  ended.set_checkpoint_requested_ms(0);
  AddEvent(&ended, absl::StrCat(JobState_Name(state), message.empty() ? "" : ": ", message));
  RETURN_IF_ERROR(Commit(std::move(ended), /*durable=*/true));
  pending_checkpoints_.erase(job.id());
  if (tensorboard_) tensorboard_->CloseJob(job.id());
  return absl::OkStatus();
}

bool CoordinatorState::Released(const std::string& node_id) const {
  return std::none_of(jobs_.begin(), jobs_.end(), [&](const auto& entry) {
    return entry.second.state() == RUNNING && InPlacement(entry.second.placement(), node_id);
  });
}

absl::Status CoordinatorState::FailJobsOfNode(const std::string& node_id, const std::string& why) {
  absl::Status first;
  for (auto& [id, job] : jobs_) {
    if (job.state() != RUNNING || !InPlacement(job.placement(), node_id)) continue;
    const auto& workers = job.placement().worker_nodes();
    auto rank = std::find(workers.begin(), workers.end(), node_id);
    if (rank != workers.end()) {
      first.Update(LoseWorker(job, static_cast<int>(rank - workers.begin()), why));
      continue;
    }
    const auto& shards = job.placement().shard_nodes();
    const int index = std::find(shards.begin(), shards.end(), node_id) - shards.begin();
    absl::StatusOr<bool> replaced = ReplaceShard(job, index, why);
    if (!replaced.ok()) {
      first.Update(replaced.status());
    } else if (!*replaced) {
      first.Update(FailOrRestart(job, why, /*diverged=*/false));
    }
  }
  return first;
}

void CoordinatorState::DetectDeadNodes() {
  const absl::Time now = options_.now();
  for (auto& [id, node] : nodes_) {
    if (!node.info.alive() || now <= Deadline(node)) continue;
    const std::string why = absl::StrCat(
        node.info.role() == SHARD ? "shard" : "worker", " node ", id, " at ", node.info.address(),
        " stopped heartbeating for ", absl::FormatDuration(now - node.last_heartbeat));
    // Its jobs end first; the node counts as dead once that is recorded.
    absl::Status failed = FailJobsOfNode(id, why);
    if (failed.ok()) {
      NodeInfo dead = node.info;
      dead.set_alive(false);
      // Kept, so a restarted coordinator still shows when it was last heard.
      dead.set_last_heartbeat_ms(ToMillis(node.last_heartbeat));
      failed = SaveNode(dead);
      if (failed.ok()) Log(absl::StrCat("lost ", why));
    }
    const std::string what = absl::StrCat("the death of node ", id);
    if (failed.ok()) {
      write_failures_.erase(what);
    } else {
      LogWriteFailure(what, failed);
    }
  }
}

void CoordinatorState::SchedulePending() {
  // Running jobs' lost ranks come before pending jobs.
  AssignLostRanks();
  AbsorbLostRanks();
  std::vector<const JobStatus*> jobs;
  const int64_t now_ms = ToMillis(options_.now());
  for (const std::string& id : job_order_) {
    // A job restarting after a failure waits out its back-off.
    if (jobs_[id].not_before_ms() <= now_ms) jobs.push_back(&jobs_[id]);
  }
  std::vector<NodeInfo> alive;
  for (const auto& [id, node] : nodes_) {
    // A node not heard from since a restart may be gone, a draining one is
    // leaving: no new work.
    if (Alive(node) && node.heard && !node.draining && !node.info.cordoned()) {
      alive.push_back(node.info);
    }
  }
  for (ScheduleDecision& decision : control::SchedulePending(jobs, alive)) {
    JobStatus job = jobs_[decision.job_id];
    absl::Status written;
    std::string what = absl::StrCat("the start of job ", decision.job_id);
    switch (decision.action) {
      case ScheduleDecision::Action::kWait:
        if (job.message() == decision.message) continue;
        job.set_message(decision.message);
        written = Commit(std::move(job), /*durable=*/false);
        what = absl::StrCat("why job ", decision.job_id, " waits");
        break;
      case ScheduleDecision::Action::kFail:
        written = FinishJob(job, FAILED, decision.message);
        what = absl::StrCat("the failure of job ", decision.job_id);
        break;
      case ScheduleDecision::Action::kStart:
        *job.mutable_placement() = std::move(decision.placement);
        job.clear_workers();
        for (int rank = 0; rank < job.placement().worker_nodes_size(); ++rank) {
          WorkerProgress* progress = job.add_workers();
          progress->set_rank(rank);
          progress->set_node_id(job.placement().worker_nodes(rank));
        }
        // Every start shares the files out afresh: all ranks are present.
        ShareDataFiles(&job);
        job.set_state(RUNNING);
        job.set_message("");
        job.set_start_time_ms(ToMillis(options_.now()));
        job.set_attempt(job.attempt() + 1);
        job.set_checkpoint_requested_ms(0);
        job.set_not_before_ms(0);
        AddEvent(&job, absl::StrCat(
                           job.attempt() == 1 ? "started" : "started again",
                           job.has_restore()
                               ? absl::StrCat(" from the checkpoint at step ", job.restore().step())
                               : "",
                           " on ", job.placement().worker_nodes_size(), " workers (",
                           absl::StrJoin(job.placement().worker_nodes(), ", "), ") and ",
                           job.placement().shard_nodes_size(), " shards (",
                           absl::StrJoin(job.placement().shard_nodes(), ", "), ")",
                           Saves(job) ? "; checkpoints on" : ""));
        written = Commit(job, /*durable=*/true);
        if (written.ok()) {
          pending_checkpoints_.erase(job.id());
          settled_checkpoint_[job.id()] = job.restore().step();
        }
        break;
    }
    if (written.ok()) {
      write_failures_.erase(what);
    } else {
      LogWriteFailure(what, written);
    }
  }
}

void CoordinatorState::LogWriteFailure(const std::string& what, const absl::Status& status) {
  std::string& last = write_failures_[what];
  if (last == status.message()) return;
  last = std::string(status.message());
  Log(absl::StrCat("cannot record ", what, ": ", status.message(), "; will try again"));
}

}  // namespace control
}  // namespace downpour
