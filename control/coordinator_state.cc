// CoordinatorState's requests and job transitions: membership, submission,
// progress reports, the jobs' ends and restarts, scheduling, retention.
// coordinator_recovery.cc has what happens when nodes leave;
// coordinator_checkpoints.cc the checkpoint requests.
#include "control/coordinator_state.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

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

constexpr int kDefaultMaxRestarts = 3;
constexpr int kDefaultBackoffSeconds = 1;
// An evaluation curve keeps its newest points.
constexpr int kMaxEvaluations = 1000;

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

bool Names(const google::protobuf::RepeatedPtrField<std::string>& nodes, const std::string& id) {
  return std::find(nodes.begin(), nodes.end(), id) != nodes.end();
}

// "2 workers (a, b)", or "1 of 2 workers (b)" where ranks start with no
// worker (the live workers take them over or their data).
std::string WorkersText(const Placement& placement) {
  std::vector<std::string> present;
  for (const std::string& node : placement.worker_nodes()) {
    if (!node.empty()) present.push_back(node);
  }
  const int ranks = placement.worker_nodes_size();
  return absl::StrCat(static_cast<int>(present.size()) == ranks
                          ? absl::StrCat(ranks)
                          : absl::StrCat(present.size(), " of ", ranks),
                      " workers (", absl::StrJoin(present, ", "), ")");
}

bool InPlacement(const Placement& placement, const std::string& node_id) {
  return Names(placement.shard_nodes(), node_id) || Names(placement.worker_nodes(), node_id);
}

bool HasCheckpointAt(const JobStatus& job, int64_t step) {
  return !job.checkpoints().empty() && job.checkpoints().rbegin()->step() == step;
}

// An evaluation (the final one or a periodic one) as a worker reported it.
Evaluation Reported(int64_t step, double accuracy, std::optional<double> auc,
                    std::optional<double> log_loss, absl::Time now) {
  Evaluation evaluation;
  evaluation.set_step(step);
  evaluation.set_accuracy(accuracy);
  if (auc.has_value()) evaluation.set_auc(*auc);
  if (log_loss.has_value()) evaluation.set_log_loss(*log_loss);
  evaluation.set_time_ms(ToMillis(now));
  return evaluation;
}

// Adds `evaluation` to the job's curve: the job's test_auc and test_log_loss
// are the newest evaluation's, cleared where it has none; its scalars go to
// TensorBoard.
void RecordEvaluation(const Evaluation& evaluation, TensorBoardWriter* tensorboard,
                      JobStatus* job) {
  *job->add_evaluations() = evaluation;
  if (job->evaluations_size() > kMaxEvaluations) {
    job->mutable_evaluations()->DeleteSubrange(0, job->evaluations_size() - kMaxEvaluations);
  }
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

// The job's step, loss and rate from its present workers' (lost ranks do
// not hold it back); whether any of them still trains.
bool Aggregate(absl::Time now, JobStatus* job) {
  int64_t min_step = INT64_MAX;
  double loss = 0, rate = 0;
  int present = 0;
  bool training = false;
  for (const WorkerProgress& w : job->workers()) {
    if (w.lost()) continue;
    ++present;
    training = training || !w.finished();
    min_step = std::min(min_step, w.step());
    loss += w.loss();
    rate += w.finished() ? 0 : w.examples_per_sec();
  }
  // A worker taking a rank over, or a start from a checkpoint, reports an
  // earlier step than the job has shown: the step shown never goes back.
  const int64_t step = std::max(job->step(), min_step);
  if (step != job->step()) job->set_step_time_ms(ToMillis(now));
  job->set_step(step);
  job->set_loss(loss / present);
  job->set_examples_per_sec(rate);
  return training;
}

// Where a restarting job continues: its newest complete checkpoint, or the
// start, saying why it has none.
std::string ContinuesFrom(const JobStatus& job, const absl::StatusOr<CheckpointRestore>& restore) {
  if (restore.ok()) return absl::StrCat("from the checkpoint at step ", restore->step());
  if (!job.checkpoints().empty()) {
    return "from the start (none of its checkpoints is complete)";
  }
  if (job.checkpoint_failures() > 0) {
    return absl::StrCat("from the start (no checkpoint was written: ", job.checkpoint_failures(),
                        " failed, the last: ", job.last_checkpoint_error(), ")");
  }
  return "from the start (no checkpoint yet)";
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorState>> CoordinatorState::Create(
    Options options, std::unique_ptr<JobStore> store) {
  auto state =
      std::unique_ptr<CoordinatorState>(new CoordinatorState(std::move(options), std::move(store)));
  ASSIGN_OR_RETURN(std::vector<JobStatus> jobs, state->store_->LoadJobs());
  ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, state->store_->LoadNodes());
  RETURN_IF_ERROR(state->history_.Load());
  for (JobStatus& job : jobs) {
    // A rank's step target is always in its record (stores of earlier
    // versions left it 0 for "the spec's steps").
    for (WorkerProgress& worker : *job.mutable_workers()) {
      if (worker.steps() == 0) worker.set_steps(job.spec().steps());
    }
  }
  state->jobs_.Load(std::move(jobs));
  state->nodes_.Load(std::move(nodes));
  return state;
}

CoordinatorState::CoordinatorState(Options options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      tensorboard_(options_.tensorboard_dir.empty()
                       ? nullptr
                       : std::make_unique<TensorBoardWriter>(TensorBoardWriter::Options{
                             options_.tensorboard_dir, "", options_.now})),
      history_({options_.job_log_lines, options_.progress_points, options_.now}, store_.get()),
      jobs_({options_.progress_persist_interval, options_.job_retention_count,
             options_.job_retention_age, options_.now},
            store_.get()),
      nodes_({options_.node_timeout, options_.recovery_grace, options_.dead_node_retention,
              options_.now},
             store_.get()),
      checkpoints_({options_.checkpoint_root, options_.checkpoint_timeout, options_.now},
                   &history_),
      handover_({options_.handover_wait, options_.now}, &history_) {}

// ---- Membership ----

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
  RETURN_IF_ERROR(nodes_.MayRegister(node));
  if (nodes_.Restarted(node)) {
    RETURN_IF_ERROR(FailJobsOfNode(node.id(), absl::StrCat("node ", node.id(), " restarted")));
  }
  RETURN_IF_ERROR(nodes_.Register(node));
  SchedulePending();
  RegisterNodeResponse response;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::StatusOr<HeartbeatResponse> CoordinatorState::Heartbeat(const HeartbeatRequest& request) {
  RETURN_IF_ERROR(CheckHeartbeatRequest(request));
  absl::MutexLock lock(&mu_);
  HeartbeatResponse response;
  std::optional<NodeRegistry::Beat> beat =
      nodes_.Heartbeat(request.node_id(), request.incarnation(), request.draining());
  if (!beat.has_value()) {
    response.set_reregister(true);
    return response;
  }
  const NodeInfo& node = beat->node;
  if (beat->began_draining && node.role() == SHARD) DrainShard(node.id());
  if (beat->revived) {
    NoteWrite(absl::StrCat("node ", node.id(), " alive again"), beat->revival);
    if (beat->revival.ok()) SchedulePending();
  }
  if (node.role() == SHARD) {
    for (const ShardJobSteps& steps : request.job_steps()) TakeShardSteps(node.id(), steps);
    for (const CheckpointPart& part : request.checkpoints()) TakeCheckpointPart(part);
  }
  for (const JobLogLine& line : request.logs()) {
    // Lines of unknown jobs are dropped.
    if (jobs_.Find(line.job_id()) == nullptr) continue;
    // Only what a line is, its text cut to the limit (a long line is the
    // node's own output: it never costs the node its heartbeat).
    JobLogLine from_node;
    from_node.set_job_id(line.job_id());
    from_node.set_source(node.id());
    from_node.set_time_ms(line.time_ms());
    from_node.set_text(TruncateText(line.text(), kMaxLogLineBytes));
    history_.AddLine(std::move(from_node));
  }
  response.set_released(beat->draining && Released(node.id()));
  AddTasks(node, &response);
  return response;
}

void CoordinatorState::AddTasks(const NodeInfo& node, HeartbeatResponse* response) {
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    if (job.state() != RUNNING) continue;
    // A task per rank the node holds: a worker may train two ranks of a
    // SYNC job (RankHandover::ShareWorkers).
    const auto& nodes =
        node.role() == SHARD ? job.placement().shard_nodes() : job.placement().worker_nodes();
    for (int rank = 0; rank < nodes.size(); ++rank) {
      if (nodes[rank] == node.id()) AddTask(job, node, rank, response->add_tasks());
    }
  }
}

void CoordinatorState::AddTask(const JobStatus& job, const NodeInfo& node, int rank, Task* task) {
  task->set_job_id(job.id());
  task->set_attempt(job.attempt());
  task->set_checkpoints(Saves(job));
  task->set_checkpoint_requested_ms(job.checkpoint_requested_ms());
  if (job.has_restore()) {
    *task->mutable_restore() = job.restore();
    // Shards restore from the files; the workers' state (up to
    // kMaxWorkerStateBytes) goes to workers only, so a shard hosting many
    // jobs is not sent it once per job every heartbeat.
    if (node.role() == SHARD) task->mutable_restore()->clear_worker_state();
  }
  *task->mutable_spec() = job.spec();
  *task->mutable_placement() = job.placement();
  for (const std::string& shard : job.placement().shard_nodes()) {
    task->add_shard_addresses(nodes_.Address(shard));
  }
  task->set_rank(rank);
  for (const WorkerProgress& worker : job.workers()) {
    if (handover_.AbsentAtShards(job, worker)) task->add_absent_ranks(worker.rank());
  }
  if (node.role() != WORKER) return;
  const WorkerProgress& worker = job.workers(task->rank());
  // A worker that took its rank over continues where the rank had got to
  // (where the job resumed, if it had not reported since), with the
  // workers' state of the checkpoint the job records (the hand-over made it
  // the newest).
  if (worker.joined()) {
    task->mutable_join()->set_step(RankHandover::StepOf(job, worker));
    task->mutable_join()->set_worker_state(job.restore().worker_state());
  }
  *task->mutable_data() = worker.data();
  task->set_data_step(worker.data_step());
  task->set_steps(worker.steps());
  task->set_takes_checkpoints(task->checkpoints() &&
                              task->rank() == CheckpointOrchestrator::CheckpointRank(job));
  task->set_evaluates(task->rank() == RankHandover::EvaluatingRank(job));
}

absl::StatusOr<std::vector<NodeInfo>> CoordinatorState::ListNodes() { return nodes_.List(); }

absl::StatusOr<NodeInfo> CoordinatorState::CordonNode(const std::string& node_id, bool cordoned) {
  RETURN_IF_ERROR(CheckNodeIdArgument(node_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(NodeInfo node, nodes_.SetCordoned(node_id, cordoned));
  if (cordoned) {
    // Workers hand their rank on (as a lost worker's is); shards move their
    // jobs after a checkpoint (as a SIGTERM drain does).
    if (node.role() == SHARD) DrainShard(node_id);
    absl::Status first;
    for (const std::string& id : jobs_.Ids()) {
      const JobStatus& job = *jobs_.Find(id);
      if (job.state() != RUNNING) continue;
      // Every rank the node trains; each loss commits a new record.
      const int ranks = job.placement().worker_nodes_size();
      for (int rank = 0; rank < ranks; ++rank) {
        if (jobs_.Find(id)->placement().worker_nodes(rank) != node_id) continue;
        first.Update(LoseWorker(*jobs_.Find(id), rank,
                                absl::StrCat("worker node ", node_id, " drained by operator")));
      }
    }
    RETURN_IF_ERROR(first);
  }
  SchedulePending();
  return node;
}

// ---- Jobs ----

absl::StatusOr<JobStatus> CoordinatorState::SubmitJob(const SubmitJobRequest& request) {
  RETURN_IF_ERROR(CheckSubmitJobRequest(request));
  JobSpec spec = request.spec();
  // Initial weights are read (and checked) before the job exists; a model
  // from an ONNX file brings its own, and the spec's model with them.
  std::optional<SafetensorsFile> init;
  std::string init_from;
  if (request.has_model_file()) {
    if (request.has_init_from()) {
      return absl::InvalidArgumentError(
          "a job from an ONNX model starts from the graph's weights; leave init_from out");
    }
    ASSIGN_OR_RETURN(init, ReadOnnxModel(request.model_file(), &spec, &init_from));
  }
  ApplyJobDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec).status());
  // A job the cluster could not hold even idle is refused now, not left to
  // fail (or take daemons down with it) when it starts.
  RETURN_IF_ERROR(CheckFits(spec, nodes_.Alive(), Placing()));
  if (request.has_init_from()) {
    ASSIGN_OR_RETURN(init, ReadInitialWeights(request.init_from(), &init_from));
  }
  absl::MutexLock lock(&mu_);
  std::string id = request.job_id();
  if (id.empty()) {
    id = jobs_.NewId(spec.name());
  } else {
    RETURN_IF_ERROR(ValidateJobId(id));
    if (jobs_.Find(id) != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat("job id \"", id, "\" already exists"));
    }
  }
  JobStatus job;
  job.set_id(id);
  *job.mutable_spec() = spec;
  job.set_state(PENDING);
  job.set_test_accuracy(-1);
  job.set_submit_time_ms(ToMillis(options_.now()));
  job.set_pending_since_ms(job.submit_time_ms());
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
    history_.AddEvent(&job, absl::StrCat("initial weights from ", init_from));
  }
  absl::Status inserted = jobs_.Insert(job);
  if (!inserted.ok()) {
    history_.Remove(id);
    return inserted;
  }
  Log(absl::StrCat("job ", id, " submitted: ", spec.name().empty() ? "unnamed" : spec.name(), ", ",
                   spec.num_workers(), " workers, ", spec.num_shards(), " shards, ", spec.steps(),
                   " steps, ", ConsistencySpec::Mode_Name(spec.consistency().mode())));
  SchedulePending();
  return *jobs_.Find(id);
}

absl::StatusOr<std::vector<JobStatus>> CoordinatorState::ListJobs() {
  return jobs_.List(JobSummary);
}

absl::StatusOr<JobStatus> CoordinatorState::GetJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  return jobs_.Get(job_id);
}

absl::StatusOr<JobStatus> CoordinatorState::WatchJob(const std::string& job_id,
                                                     int64_t known_version,
                                                     absl::Duration timeout) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  return jobs_.Watch(job_id, known_version, options_.now() + timeout);
}

absl::StatusOr<JobStatus> CoordinatorState::StopJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobStatus* job, jobs_.Lookup(job_id));
  if (!IsTerminal(job->state())) {
    RETURN_IF_ERROR(FinishJob(*job, STOPPED, "stopped by operator"));
    SchedulePending();  // Its workers are free now.
  }
  return *jobs_.Find(job_id);
}

absl::StatusOr<JobDescription> CoordinatorState::DescribeJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  ASSIGN_OR_RETURN(JobStatus job, jobs_.Get(job_id));
  JobDescription description;
  *description.mutable_job() = std::move(job);
  for (ProgressPoint& point : history_.Progress(job_id)) {
    *description.add_progress() = std::move(point);
  }
  return description;
}

absl::Status CoordinatorState::DeleteJob(const std::string& job_id, bool checkpoints) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobStatus* job, jobs_.Lookup(job_id));
  if (!IsTerminal(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is ", JobState_Name(job->state()),
                     "; stop it first (downpourctl stop ", job_id, ")"));
  }
  if (checkpoints) {
    if (options_.checkpoint_root.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the coordinator has no --checkpoint_root: it holds no checkpoint files of job \"",
          job_id, "\" to remove (delete it without --with_checkpoints)"));
    }
    // The files first: a job whose files could not go stays, to try again.
    RETURN_IF_ERROR(Annotate(RemoveJobCheckpoints(options_.checkpoint_root, job_id),
                             absl::StrCat("removing the checkpoints of job ", job_id)));
  }
  RETURN_IF_ERROR(RemoveJob(job_id));
  Log(absl::StrCat("job ", job_id, " deleted by operator",
                   checkpoints ? ", with its checkpoint files" : ""));
  return absl::OkStatus();
}

absl::StatusOr<JobLogsResponse> CoordinatorState::JobLogs(const JobLogsRequest& request) {
  RETURN_IF_ERROR(CheckJobIdArgument(request.job_id()));
  const absl::Time deadline =
      options_.now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms()));
  while (true) {
    const int64_t seen = history_.version();
    ASSIGN_OR_RETURN(JobState state, jobs_.State(request.job_id()));
    JobLogsResponse response = history_.LinesAfter(request.job_id(), request.after_sequence());
    response.set_job_ended(IsTerminal(state));
    const absl::Time now = options_.now();
    if (response.lines_size() > 0 || response.job_ended() || now >= deadline) return response;
    // Tick wakes followers too, so an injected clock that jumps is noticed.
    history_.WaitForChange(seen, deadline - now);
  }
}

absl::StatusOr<ReportProgressResponse> CoordinatorState::ReportProgress(
    const ReportProgressRequest& request) {
  RETURN_IF_ERROR(CheckReportProgressRequest(request));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobStatus* current, jobs_.Lookup(request.job_id()));
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
  if (request.data_files_size() > 0) {
    JobStatus job = *current;
    ASSIGN_OR_RETURN(bool listed, handover_.TakeListing(&job, request));
    if (listed) RETURN_IF_ERROR(jobs_.Commit(std::move(job), /*durable=*/true));
    const WorkerProgress& worker = jobs_.Find(request.job_id())->workers(rank);
    *response.mutable_data() = worker.data();
    response.set_data_step(worker.data_step());
    return response;
  }
  if (request.drained()) {
    // A leaving worker takes no rank over, not even the one it gave back.
    nodes_.MarkDraining(request.node_id());
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
  return TakeProgress(*current, request);
}

absl::StatusOr<ReportProgressResponse> CoordinatorState::TakeProgress(
    const JobStatus& current, const ReportProgressRequest& request) {
  const absl::Time now = options_.now();
  const int rank = request.rank();
  // A result counts only from the rank that evaluates the job.
  if ((request.has_test_accuracy() || request.has_evaluation()) &&
      rank != RankHandover::EvaluatingRank(current)) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker rank ", rank, " (", request.node_id(), ") does not evaluate job ",
                     current.id(), "; rank ", RankHandover::EvaluatingRank(current), " does"));
  }
  ReportProgressResponse response;
  JobStatus job = current;
  WorkerProgress* worker = job.mutable_workers(rank);
  if (worker->steps() > 0 && request.step() > worker->steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", rank, " (", request.node_id(), ") reported step ", request.step(),
        " of job ", current.id(), ", past the ", worker->steps(), " steps the rank runs"));
  }
  // A rank that finished short of its steps (they grew as it finished: it
  // took on a lost rank's) runs again for the rest (WorkerRuntime).
  const bool finished = request.finished() && request.step() >= worker->steps();
  const bool milestone =
      (finished && !worker->finished()) || request.has_test_accuracy() || request.has_evaluation();
  worker->set_step(request.step());
  worker->set_loss(request.loss());
  worker->set_examples_per_sec(request.examples_per_sec());
  worker->set_finished(worker->finished() || finished);
  auto optional = [](bool has, double value) {
    return has ? std::optional<double>(value) : std::nullopt;
  };
  if (request.has_test_accuracy()) {
    job.set_test_accuracy(request.test_accuracy());
    RecordEvaluation(Reported(request.step(), request.test_accuracy(),
                              optional(request.has_test_auc(), request.test_auc()),
                              optional(request.has_test_log_loss(), request.test_log_loss()), now),
                     tensorboard_.get(), &job);
  }
  if (request.has_evaluation()) {
    const Evaluation& e = request.evaluation();
    RecordEvaluation(Reported(e.step(), e.accuracy(), optional(e.has_auc(), e.auc()),
                              optional(e.has_log_loss(), e.log_loss()), now),
                     tensorboard_.get(), &job);
    const double target = job.spec().stop_at_accuracy();
    if (target > 0 && e.accuracy() >= target) {
      job.set_test_accuracy(e.accuracy());
      if (Saves(job)) {
        job.set_final_checkpoint_missing(absl::StrCat(
            "it stopped early at step ", e.step(), " (stop_at_accuracy); its newest checkpoint is ",
            job.checkpoints().empty()
                ? "none"
                : absl::StrCat("from step ", job.checkpoints().rbegin()->step())));
      }
      RETURN_IF_ERROR(
          FinishJob(job, SUCCEEDED,
                    absl::StrCat("stopped early: test accuracy ", e.accuracy(),
                                 " reached stop_at_accuracy ", target, " at step ", e.step(),
                                 Saves(job) ? " (the newest checkpoint is from before it)" : "")));
      SchedulePending();
      response.set_job_ended(true);
      return response;
    }
  }
  const bool training = Aggregate(now, &job);
  history_.RecordProgress(job);
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
    RETURN_IF_ERROR(FinishJob(job, SUCCEEDED, RankHandover::Untrained(job)));
    SchedulePending();
    response.set_job_ended(true);
    return response;
  }
  // A saved job ends once its final checkpoint is written (the
  // checkpointing rank sends its part with its last report).
  if (done) job.set_message("trained; writing the final checkpoint");
  // Else, with every rank's word that it finished, the shards' next
  // heartbeats end it (TakeShardSteps); until then `get` says what is
  // awaited.
  const std::string unconfirmed = Unconfirmed(job);
  if (!unconfirmed.empty()) job.set_message(unconfirmed);
  // The rank that took the checkpoint as it was when it did (its last
  // report, with the final one, also says it finished); the final
  // checkpoint comes with the evaluation, also from a rank that ran again to
  // evaluate after every live rank had finished (none takes checkpoints
  // then).
  const bool takes_checkpoints =
      rank == CheckpointOrchestrator::CheckpointRank(current) ||
      (request.has_test_accuracy() && rank == RankHandover::EvaluatingRank(current));
  RETURN_IF_ERROR(jobs_.Commit(std::move(job), milestone));
  if (request.has_checkpoint() && takes_checkpoints) {
    TakeWorkerState(request.job_id(), request.checkpoint());
  }
  return response;
}

void CoordinatorState::TakeShardSteps(const std::string& shard, const ShardJobSteps& steps) {
  const JobStatus* current = jobs_.Find(steps.job_id());
  // Only a shard of the job's current start speaks for it.
  if (current == nullptr || current->state() != RUNNING || current->attempt() != steps.attempt() ||
      !Names(current->placement().shard_nodes(), shard)) {
    return;
  }
  // A copy of the job (its placement, data and events) is what costs: it is
  // made only where the figures matter, at the first report of a start and
  // for the ranks that said they finished and wait for the shards to agree.
  const bool first = current->shard_steps_attempt() != current->attempt();
  std::vector<int> raised;
  const int ranks = std::min(current->workers_size(), steps.worker_steps_size());
  for (int rank = 0; rank < ranks; ++rank) {
    const WorkerProgress& w = current->workers(rank);
    const int64_t known = first ? 0 : w.shard_step();
    if (w.finished() && known < w.steps() && steps.worker_steps(rank) > known) {
      raised.push_back(rank);
    }
  }
  if (!first && raised.empty()) return;
  JobStatus job = *current;
  if (first) {
    // An earlier start's figures are not this one's.
    for (WorkerProgress& w : *job.mutable_workers()) w.set_shard_step(0);
    job.set_shard_steps_attempt(job.attempt());
  }
  for (int rank : raised) job.mutable_workers(rank)->set_shard_step(steps.worker_steps(rank));
  absl::Status committed;
  if (!TrainingDone(*current) && TrainingDone(job) &&
      (!Saves(job) || HasCheckpointAt(job, job.spec().steps()))) {
    committed = FinishJob(job, SUCCEEDED, RankHandover::Untrained(job));
    if (committed.ok()) SchedulePending();
  } else {
    const std::string unconfirmed = Unconfirmed(job);
    if (!unconfirmed.empty()) {
      job.set_message(unconfirmed);
    } else if (TrainingDone(job)) {
      job.set_message("trained; writing the final checkpoint");
    }
    committed = jobs_.Commit(std::move(job), /*durable=*/false);
  }
  NoteWrite(absl::StrCat("the steps shard ", shard, " knows of job ", steps.job_id()), committed);
}

// ---- Transitions ----

absl::Status CoordinatorState::FinishJob(const JobStatus& job, JobState state,
                                         const std::string& message) {
  JobStatus ended = job;
  ended.set_state(state);
  ended.set_message(message);
  ended.set_end_time_ms(ToMillis(options_.now()));
  ended.set_examples_per_sec(0);
  ended.set_checkpoint_requested_ms(0);
  history_.AddEvent(&ended,
                    absl::StrCat(JobState_Name(state), message.empty() ? "" : ": ", message));
  RETURN_IF_ERROR(jobs_.Commit(std::move(ended), /*durable=*/true));
  checkpoints_.Forget(job.id());
  if (tensorboard_) tensorboard_->CloseJob(job.id());
  return absl::OkStatus();
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
  absl::StatusOr<CheckpointRestore> restore = checkpoints_.NewestCheckpoint(job, &refused);
  for (const std::string& reason : refused) {
    history_.AddEvent(&updated, absl::StrCat("refused ", reason));
  }
  const int64_t from = restore.ok() ? restore->step() : 0;
  auto* list = updated.mutable_checkpoints();
  list->erase(std::remove_if(list->begin(), list->end(),
                             [&](const CheckpointInfo& c) { return c.step() > from; }),
              list->end());
  if (restore.ok()) {
    *updated.mutable_restore() = *restore;
  } else {
    updated.clear_restore();
  }
  const absl::Duration backoff =
      moved ? absl::ZeroDuration()
            : std::min(absl::Minutes(5),
                       absl::Seconds(policy.backoff_seconds() > 0 ? policy.backoff_seconds()
                                                                  : kDefaultBackoffSeconds) *
                           (int64_t{1} << std::min(job.restarts_in_a_row(), 16)));
  history_.AddEvent(
      &updated, absl::StrCat("restart ", updated.restarts(),
                             moved ? " (a move, not counted)"
                                   : absl::StrCat(" (", updated.restarts_in_a_row(), " of ",
                                                  max_restarts, " in a row)"),
                             " in ", absl::FormatDuration(backoff), " after: ", why, "; at step ",
                             job.step(), ", continues ", ContinuesFrom(job, restore)));
  updated.set_state(PENDING);
  updated.set_pending_since_ms(ToMillis(options_.now()));
  updated.set_message(absl::StrCat("restarting after: ", why));
  updated.set_test_accuracy(-1);
  updated.clear_test_auc();
  updated.clear_test_log_loss();
  updated.set_resumed_from_step(from);
  updated.set_checkpoint_requested_ms(0);
  updated.set_not_before_ms(ToMillis(options_.now() + backoff));
  RETURN_IF_ERROR(jobs_.Commit(std::move(updated), /*durable=*/true));
  checkpoints_.Forget(job.id());
  return absl::OkStatus();
}

absl::Status CoordinatorState::StartJob(const JobStatus& pending, Placement placement) {
  JobStatus job = pending;
  *job.mutable_placement() = std::move(placement);
  job.clear_workers();
  std::vector<int> without;  // Ranks that start without a worker.
  for (int rank = 0; rank < job.placement().worker_nodes_size(); ++rank) {
    WorkerProgress* progress = job.add_workers();
    progress->set_rank(rank);
    progress->set_node_id(job.placement().worker_nodes(rank));
    // Every rank's step target is in its record (the hand-over of a lost
    // rank's steps raises it).
    progress->set_steps(job.spec().steps());
    if (progress->node_id().empty()) {
      // Lost for as long as a hand-over waits: a live worker takes it over
      // at once (SYNC), or its data goes to the live ranks as soon as they
      // have listed the files (ASYNC/SSP).
      progress->set_lost(true);
      progress->set_lost_ms(ToMillis(options_.now() - options_.handover_wait));
      without.push_back(rank);
    }
  }
  // Every start shares the files out afresh: all ranks are present.
  RankHandover::ShareDataFiles(&job);
  job.set_state(RUNNING);
  job.set_message("");
  job.set_start_time_ms(ToMillis(options_.now()));
  if (job.first_start_time_ms() == 0) job.set_first_start_time_ms(job.start_time_ms());
  job.set_attempt(job.attempt() + 1);
  job.set_checkpoint_requested_ms(0);
  job.set_not_before_ms(0);
  history_.AddEvent(
      &job,
      absl::StrCat(
          job.attempt() == 1 ? "started" : "started again",
          job.has_restore() ? absl::StrCat(" from the checkpoint at step ", job.restore().step())
                            : "",
          " on ", WorkersText(job.placement()), " and ", job.placement().shard_nodes_size(),
          " shards (", absl::StrJoin(job.placement().shard_nodes(), ", "), ")",
          Saves(job) ? "; checkpoints on" : "",
          without.empty()
              ? ""
              : absl::StrCat("; no worker was free for rank", without.size() > 1 ? "s " : " ",
                             absl::StrJoin(without, ", "), " within ",
                             absl::FormatDuration(options_.handover_wait),
                             job.spec().consistency().mode() == ConsistencySpec::SYNC
                                 ? ": the live workers take them over beside their own"
                                 : ": the live ranks take their data")));
  const int64_t from = job.restore().step();
  RETURN_IF_ERROR(jobs_.Commit(std::move(job), /*durable=*/true));
  checkpoints_.Started(pending.id(), from);
  return absl::OkStatus();
}

void CoordinatorState::SchedulePending() {
  // Running jobs' lost ranks come before pending jobs.
  HandOverLostRanks();
  std::vector<const JobStatus*> jobs;
  const int64_t now_ms = ToMillis(options_.now());
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus* job = jobs_.Find(id);
    // A job restarting after a failure waits out its back-off.
    if (job->not_before_ms() <= now_ms) jobs.push_back(job);
  }
  for (ScheduleDecision& decision : control::SchedulePending(jobs, nodes_.Available(), Placing())) {
    JobStatus job = *jobs_.Find(decision.job_id);
    switch (decision.action) {
      case ScheduleDecision::Action::kWait:
        if (job.message() == decision.message) continue;
        job.set_message(decision.message);
        NoteWrite(absl::StrCat("why job ", decision.job_id, " waits"),
                  jobs_.Commit(std::move(job), /*durable=*/false));
        break;
      case ScheduleDecision::Action::kFail:
        NoteWrite(absl::StrCat("the failure of job ", decision.job_id),
                  FinishJob(job, FAILED, decision.message));
        break;
      case ScheduleDecision::Action::kStart:
        NoteWrite(absl::StrCat("the start of job ", decision.job_id),
                  StartJob(job, std::move(decision.placement)));
        break;
    }
  }
}

// ---- Tick and its housekeeping ----

void CoordinatorState::Tick() {
  absl::MutexLock lock(&mu_);
  JudgeAbsentees();
  DetectDeadNodes();
  TickCheckpoints();
  TickConfirmations();
  TickDrains();
  SchedulePending();
  TickRetention();
  NoteWrite("the jobs' log lines and progress", history_.Flush());
  jobs_.Wake();
  history_.Wake();
}

void CoordinatorState::TickConfirmations() {
  // Should the shards not confirm the workers' last steps (a worker's word
  // that is not true, or a fault of the count), the job restarts from its
  // newest checkpoint, after the checkpoint timeout, rather than wait on.
  const int64_t now_ms = ToMillis(options_.now());
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    if (job.state() != RUNNING) continue;
    const std::string unconfirmed = Unconfirmed(job);
    const int64_t since_ms = std::max(job.step_time_ms(), job.start_time_ms());
    if (unconfirmed.empty() ||
        now_ms - since_ms < absl::ToInt64Milliseconds(options_.checkpoint_timeout)) {
      continue;
    }
    NoteWrite(absl::StrCat("the restart of job ", id),
              FailOrRestart(job,
                            absl::StrCat("the shards did not confirm the workers' last steps "
                                         "within ",
                                         absl::FormatDuration(options_.checkpoint_timeout), " (",
                                         unconfirmed, ")"),
                            /*diverged=*/false));
  }
}

control::ScheduleOptions CoordinatorState::Placing() const {
  control::ScheduleOptions options;
  options.checkpoints = !checkpoints_.root().empty();
  options.now_ms = ToMillis(options_.now());
  options.short_start_after_ms = absl::ToInt64Milliseconds(options_.handover_wait);
  return options;
}

bool CoordinatorState::Saves(const JobStatus& job) {
  if (checkpoints_.root().empty()) return false;
  for (const std::string& shard : job.placement().shard_nodes()) {
    if (!nodes_.KeepsCheckpoints(shard)) return false;
  }
  return true;
}

bool CoordinatorState::Released(const std::string& node_id) {
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    if (job.state() == RUNNING && InPlacement(job.placement(), node_id)) return false;
  }
  return true;
}

absl::Status CoordinatorState::RemoveJob(const std::string& job_id) {
  RETURN_IF_ERROR(jobs_.Remove(job_id));
  checkpoints_.Remove(job_id);
  history_.Remove(job_id);
  if (tensorboard_) tensorboard_->CloseJob(job_id);
  return absl::OkStatus();
}

void CoordinatorState::TickRetention() {
  for (const std::string& id : jobs_.Expired()) {
    absl::Status removed = RemoveJob(id);
    NoteWrite(absl::StrCat("the removal of job ", id), removed);
    if (!removed.ok()) continue;
    Log(absl::StrCat(
        "job ", id,
        " removed: past the job retention (--job_retention_count=", options_.job_retention_count,
        ", --job_retention_age=", absl::FormatDuration(options_.job_retention_age), ")"));
  }
  // A running job still naming a node (a lost rank's old holder) keeps it.
  std::set<std::string> named;
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    if (job.state() != RUNNING) continue;
    named.insert(job.placement().worker_nodes().begin(), job.placement().worker_nodes().end());
    named.insert(job.placement().shard_nodes().begin(), job.placement().shard_nodes().end());
  }
  for (const auto& [id, failed] : nodes_.RemoveDead(named)) {
    NoteWrite(absl::StrCat("the removal of node ", id), failed);
  }
}

void CoordinatorState::NoteWrite(const std::string& what, const absl::Status& status) {
  if (status.ok()) {
    write_failures_.erase(what);
    return;
  }
  std::string& last = write_failures_[what];
  if (last == status.message()) return;
  last = std::string(status.message());
  Log(absl::StrCat("cannot record ", what, ": ", status.message(), "; will try again"));
}

}  // namespace control
}  // namespace downpour
