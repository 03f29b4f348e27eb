// JobTrainer::Train, the training loop (worker/trainer.h), and the phases
// of a step it runs, over the run's RunState and each step's StepState.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/float_arrays.h"
#include "common/log.h"
#include "common/status.h"
#include "data/dataset.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"
#include "worker/worker_state.h"

namespace downpour {
using data::Batch;
using data::BatchReader;
namespace {

// The model's gradients by tensor id, or none for a skipped step.
std::vector<const float*> Gradients(const ModelRunner& model, bool skipped) {
  std::vector<const float*> grads;
  if (skipped) return grads;
  for (size_t i = 0; i < model.params().size(); ++i) {
    grads.push_back(model.grad(static_cast<int>(i)));
  }
  return grads;
}

// The model's host parameters by tensor id, for a pull.
std::vector<float*> ParamPointers(ModelRunner* model) {
  std::vector<float*> params(model->params().size());
  for (size_t i = 0; i < params.size(); ++i) params[i] = model->param(static_cast<int>(i));
  return params;
}

// The sum of a worker's gradients over the steps between its pushes
// (ConsistencySpec.push_every).
class GradientSum {
 public:
  // Adds gradients by tensor id (none: nothing to add), of `model`'s sizes.
  void Add(const ModelRunner& model, const std::vector<const float*>& grads) {
    if (grads.empty()) return;
    sums_.resize(model.params().size());
    for (size_t i = 0; i < sums_.size(); ++i) {
      const float* g = grads[i];
      const int64_t n = model.params()[i].num_elements;
      if (sums_[i].empty()) {
        sums_[i].assign(g, g + n);
      } else {
        AddInto(g, n, sums_[i].data());
      }
    }
    any_ = true;
  }
  // The sum by tensor id, or none when every step since the last push was
  // skipped; valid until Clear().
  std::vector<const float*> Gradients() const {
    std::vector<const float*> out;
    if (!any_) return out;
    for (const std::vector<float>& sum : sums_) out.push_back(sum.data());
    return out;
  }
  void Clear() {
    for (std::vector<float>& sum : sums_) sum.clear();
    any_ = false;
  }

 private:
  std::vector<std::vector<float>> sums_;
  bool any_ = false;
};

// "; the first non-finite gradient is fc1/weight's", or "".
std::string NonFiniteGradient(const ModelRunner& model) {
  for (const ParamInfo& p : model.params()) {
    const float* g = model.grad(p.id);
    for (int64_t i = 0; i < p.num_elements; ++i) {
      if (!std::isfinite(g[i]))
        return absl::StrCat("; the first non-finite gradient is ", p.name, "'s");
    }
  }
  return "";
}

absl::Status DataEnded() { return absl::InternalError("training data ended"); }

// "job ID: test accuracy A[, AUC X][, log loss Y]<suffix>" in the job's log.
void LogEvaluation(const std::string& job_id, const TestMetrics& tested, absl::string_view suffix) {
  std::string said = absl::StrCat("job ", job_id, ": ");
  tested.Describe(&said);
  Log(absl::StrCat(said, suffix));
}

// The next batches' preparation beside the steps, per batch (a step waits
// for it in its "rows" and its "plan").
std::string AheadSplit(const InputStage::AheadSeconds& ahead) {
  if (ahead.batches == 0) return "";
  const double ms = 1000.0 / static_cast<double>(ahead.batches);
  // Only the plan where no table keeps its rows.
  if (ahead.cache + ahead.pull + ahead.pool == 0) {
    return absl::StrFormat("; ahead of the step, per batch: plan %.3f ms", ahead.plan * ms);
  }
  return absl::StrFormat(
      "; ahead of the step, per batch: plan %.3f, cache %.3f, pull %.3f, pool %.3f ms",
      ahead.plan * ms, ahead.cache * ms, ahead.pull * ms, ahead.pool * ms);
}

// The dense partitions' part of the exchange, per step (`ms`: 1000 over
// the steps trained): what the steps waited for them, layer by layer in a
// gated forward and for the rest of an exchange (before a gated step's
// backward, before another's forward), and the push-and-pull exchanges'
// own time from their first and from their last message's gradients ready
// to their last parameters back.
std::string DenseSplit(double layer_wait, double rest_wait,
                       const ParameterExchange::StreamedSeconds& streamed, double ms) {
  if (streamed.steps == 0) return "";
  return absl::StrFormat(
      "; the dense partitions waited for layer by layer %.3f, the rest of an exchange %.3f; "
      "their exchange from the first gradients ready %.3f, from the last %.3f (its last "
      "message's round trip %.3f, of it on the shard %.3f)",
      layer_wait * ms, rest_wait * ms, streamed.from_first_ready * ms,
      streamed.from_last_ready * ms, streamed.last_round_trip * ms, streamed.last_on_shard * ms);
}

}  // namespace

struct JobTrainer::RunState {
  std::unique_ptr<ModelRunner> model;
  // Where this worker starts: the job's start, its checkpoint's step, or
  // where the rank it takes over had got to.
  int64_t first_step = 0;
  std::unique_ptr<BatchReader> reader;
  std::unique_ptr<BatchReader> test_reader;  // Rank 0's, for the final model.
  TrainerMetrics metrics;

  // Whether the rank reported its last step (finished); it trains none when
  // it took over a rank that had got to the end, or was left behind at the
  // last steps (CatchUp skips them), and reports after the loop then.
  bool reported_last = false;
  // ASYNC/SSP may push a sum of several steps and pull less often (SYNC: 1).
  int64_t push_every = 1, fetch_every = 1;
  GradientSum accumulated;
  // Whether the model holds the parameters after the last push (a push
  // that was to be the last pulls nothing; the rank's steps may grow).
  bool pulled = true;
  // A SYNC taker's first step: its rows are pulled at that step's version
  // exactly, as its dense partitions were (StartLoop).
  bool exact_rows = false;
  // The batch being trained. With sparse tables, the one after it too, read
  // as the step computes (its rows' plan is made meanwhile) and before the
  // step's exchange (which pulls its rows).
  bool sparse = false;
  Batch batch;
  // Sparse tables: the batches read (and planned) ahead of the step, the
  // next one first (InputStage::plan_depth() of them at most), and whether
  // the reader had no more.
  std::deque<std::unique_ptr<Batch>> ahead;
  bool ahead_ended = false;
  bool next_read = false;  // This step has read ahead (or found nothing more).

  // An overlapped step's exchange goes on into the next step: its forward
  // waits layer by layer for the parameters coming back (and, on a GPU,
  // going up to the device as they come), and it is finished before that
  // step's backward starts the next exchange. `pending`: one is in flight
  // (of step `pending_step`); `pending_uploads`: it queues the parameters
  // to the device.
  bool pending = false, pending_uploads = false;
  int64_t pending_step = 0;
  // The lowest partition version the newest completed pull brought (SYNC:
  // the step every partition has reached; see CatchUp).
  int64_t pulled_version = 0;
  // What an overlapped step pushes from and pulls into: the model's own
  // buffers, the same every step.
  std::vector<const float*> model_grads;
  std::vector<float*> model_params;
  double exchange_waited = 0;  // In the current batch, inside its compute.
  double read_ahead = 0;       // Likewise: reading the next batch (input).

  // Since the last progress report, and what the last one said.
  double window_start = 0, window_loss = 0;
  int64_t window_steps = 0, window_examples = 0;
  double last_loss = 0, last_rate = 0;
  // Where the run's time went (the summary at its end).
  double total_input_wait = 0, total_step_seconds = 0, total_compute = 0, total_exchange = 0;
  double total_plan = 0;  // Sparse rows: gradients gathered, plan, exchange begun.
  // Sparse rows, inside total_exchange: the step's rows waited for and
  // pooled (or laid out for the device), before its compute.
  double total_rows = 0;
  // Dense partitions, inside total_exchange: a gated forward's waits for its
  // layers' parameters, and the waits for the rest of an exchange
  // (FinishPendingExchange's within a step: `pending_waited` the current
  // one's).
  double total_layer_wait = 0, total_pending_wait = 0;
  double pending_waited = 0;
  int settled_window = 0;  // The exchange window last logged as settled.
};

struct JobTrainer::StepState {
  int64_t step = 0;
  double began = 0;  // MonotonicSeconds() once its data was settled.
  // The plan (PlanStep).
  bool checkpoint_due = false;  // A checkpoint at step + 1: its push asks for it.
  bool final_step = false;      // The rank's last, as far as it knows.
  bool push = false, fetch = false;
  bool stream = false;                 // Its exchange overlaps backward.
  bool gated = false;                  // Its forward awaits the last step's exchange.
  ParameterExchange::PulledFn upload;  // With `stream`, on a GPU.
  // What it computed and measured.
  StepResult result;
  int64_t examples = 0;
  double input_wait = 0, compute = 0, exchange = 0;
  CheckpointWorkerState checkpoint;  // Rank 0's state, with checkpoint_due.
};

absl::Status JobTrainer::Train() {
  RunState run;
  RETURN_IF_ERROR(StartRun(&run));
  // On every way out, what is in flight ends before the model it reads
  // and writes goes.
  absl::Cleanup abandon_pending = [this, &run] {
    if (run.pending) (void)exchange_->FinishPushPull(/*abandon=*/true);
    // The next batch's rows may be being planned: its batch goes with `run`.
    if (input_stage_ != nullptr) input_stage_->AwaitPlan();
  };
  for (int64_t step = run.first_step; step < steps_.load(); ++step) {
    ASSIGN_OR_RETURN(step, CatchUp(step, &run));
    if (step >= steps_.load()) break;
    ASSIGN_OR_RETURN(StepState s, BeginStep(step, &run));
    RETURN_IF_ERROR(ComputeStep(&s, &run));
    RETURN_IF_ERROR(CaptureCheckpoint(&s, run));
    RETURN_IF_ERROR(ExchangeSparseRows(s, &run));
    RETURN_IF_ERROR(EndExchange(&s, &run));
    RecordStep(s, &run);
    const bool last = step + 1 == steps_.load();
    ReportProgress(&s, last, &run);
    run.reported_last = run.reported_last || last;
    RETURN_IF_ERROR(EvaluatePeriodically(s, last, &run));
  }
  RETURN_IF_ERROR(FinishRun(&run));
  if (evaluates_.load()) return EvaluateFinalModel(&run);
  if (!run.reported_last) {
    ReportProgressRequest done;
    done.set_step(steps_.load());
    done.set_finished(true);
    Report(done, /*final=*/true);
  }
  return absl::OkStatus();
}

absl::Status JobTrainer::PullParameters(ModelRunner* model, int64_t min_version,
                                        int64_t min_worker_steps) {
  return exchange_->Pull(min_version, min_worker_steps, ParamPointers(model), stopped_);
}

absl::Status JobTrainer::PushGradients(int64_t step, const std::vector<const float*>& grads) {
  return exchange_->Push(step, grads, stopped_);
}

absl::Status JobTrainer::PushGradientsAndPull(ModelRunner* model, int64_t step,
                                              const std::vector<const float*>& grads,
                                              int64_t min_version, int64_t min_worker_steps) {
  return exchange_->PushPull(step, grads, min_version, min_worker_steps, ParamPointers(model),
                             stopped_);
}

int64_t JobTrainer::MinVersion(int64_t step) const {
  return task_.spec().consistency().mode() == ConsistencySpec::SYNC ? step : 0;
}

int64_t JobTrainer::MinWorkerSteps(int64_t step) const {
  const ConsistencySpec& consistency = task_.spec().consistency();
  return consistency.mode() == ConsistencySpec::SSP
             ? std::max<int64_t>(0, step - consistency.staleness())
             : 0;
}

absl::Status JobTrainer::StartRun(RunState* run) {
  if (task_.steps() < 1) {
    // The coordinator names every rank's step target; the same task would
    // fail a restart alike.
    permanent_ = true;
    return absl::InvalidArgumentError(
        absl::StrCat("job ", task_.job_id(), ": the task of rank ", task_.rank(),
                     " names no step target (Task.steps is ", task_.steps(),
                     "; a coordinator that assigns the rank sets it to at least 1)"));
  }
  RETURN_IF_ERROR(CreateModel(run));
  RETURN_IF_ERROR(FindFirstStep(run));
  // Data errors (no or a missing file, a corrupt record) recur on a restart.
  permanent_ = true;
  int64_t data_step = 0;
  ASSIGN_OR_RETURN(run->reader, OpenData(&data_step));
  RETURN_IF_ERROR(Resume(data_step, run));
  if (evaluates_.load()) {
    // The evaluating rank: a wrong test-set path fails the job now, not
    // after the last step (a rank that comes to evaluate later opens it
    // then).
    ASSIGN_OR_RETURN(run->test_reader, OpenTestSet(*run->model));
  }
  permanent_ = false;
  return StartLoop(run);
}

absl::Status JobTrainer::CreateModel(RunState* run) {
  ModelOptions model_options;
  model_options.memory_caps = options_.device_memory;
  model_options.conv_graph = options_.conv_graph;
  model_options.job_id = task_.job_id();  // Its lines reach the job's log.
  absl::StatusOr<std::unique_ptr<ModelRunner>> created =
      ModelRunner::Create(task_.spec(), options_.devices, model_options);
  // A model that cannot be made here (its spec, the devices it needs, their
  // memory) cannot be on a restart either.
  permanent_ = !created.ok();
  ASSIGN_OR_RETURN(run->model, std::move(created));
  for (const std::string& line : run->model->Describe()) {
    Log(absl::StrCat("job ", task_.job_id(), ": ", line));
  }
  shape_ = run->model->shape();
  return StartExchange(*run->model);
}

absl::Status JobTrainer::FindFirstStep(RunState* run) {
  // In SYNC a rank taken over starts at the step every partition has
  // reached, which a first pull finds.
  run->first_step = task_.restore().step();
  steps_.store(task_.steps());
  if (task_.has_join()) {
    if (task_.spec().consistency().mode() == ConsistencySpec::SYNC) {
      RETURN_IF_ERROR(PullParameters(run->model.get(), 0, 0));
      run->first_step = exchange_->min_pulled_version();
      if (input_stage_ != nullptr && input_stage_->sparse()) {
        // ... and the sparse tables: the lost worker may have pushed a
        // step's dense gradients and not its rows (which go apart). The
        // tables wait for that step's rows; the partitions keep their
        // version of before it.
        ASSIGN_OR_RETURN(const int64_t tables, input_stage_->TablesVersion());
        run->first_step = std::min(run->first_step, tables);
      }
    } else {
      run->first_step = task_.join().step();
    }
    run->first_step = std::min(run->first_step, steps_.load());
  }
  steps_completed_.store(run->first_step);
  return absl::OkStatus();
}

absl::Status JobTrainer::Resume(int64_t data_step, RunState* run) {
  // A restored job continues at its checkpoint's step, with the workers'
  // state saved there and each worker's data where it was (the stream,
  // begun at data_step, is deterministic: the same batches, skipped).
  const std::string& worker_state =
      task_.has_join() ? task_.join().worker_state() : task_.restore().worker_state();
  if (!worker_state.empty()) {
    RETURN_IF_ERROR(Annotate(
        LoadWorkerState(worker_state, run->model.get()),
        task_.has_join() ? "loading the workers' state of the newest checkpoint"
                         : absl::StrCat("restoring the checkpoint at step ", run->first_step)));
  }
  if (run->first_step == 0) return absl::OkStatus();
  for (int64_t step = data_step; step < run->first_step; ++step) {
    ASSIGN_OR_RETURN(bool have_batch, run->reader->Next(&run->batch));
    if (!have_batch) return DataEnded();
  }
  Log(absl::StrCat("job ", task_.job_id(), ": continuing ",
                   task_.has_join() ? absl::StrCat("rank ", task_.rank(), " (taken over)")
                                    : "from the checkpoint",
                   " at step ", run->first_step));
  return absl::OkStatus();
}

absl::Status JobTrainer::StartLoop(RunState* run) {
  const ConsistencySpec& consistency = task_.spec().consistency();
  run->metrics = TrainerMetrics::Create(options_.metrics, task_.job_id(), task_.rank(),
                                        /*evaluates=*/evaluates_.load());
  run->window_start = MonotonicSeconds();
  run->push_every = std::max(1, consistency.push_every());
  run->fetch_every = std::max(1, consistency.fetch_every());
  run->model_grads = Gradients(*run->model, false);
  run->model_params = ParamPointers(run->model.get());
  run->sparse = input_stage_ != nullptr && input_stage_->sparse();
  // The first step pulls on its own; every later step's parameters come back
  // with the previous step's push (one round trip per message).
  // A joining run does not wait for SSP's bound on its first pull: a shard
  // restored mid-run counts every rank's steps from its checkpoint until
  // each pushes again.
  if (task_.has_join() && consistency.mode() == ConsistencySpec::SYNC) {
    // The rank's worker may have been lost between its pushes of the step
    // to two partitions, one of which completed it: the step is computed
    // again from the parameters it was computed from, every partition's of
    // that version exactly (a partition keeps its previous version until
    // the step after it is pushed there), as a clean run computes it.
    const absl::Status exact =
        exchange_->Pull(MinVersion(run->first_step), 0, run->model_params, stopped_,
                        /*exact_version=*/true);
    // The first step's sparse rows are read at that version too (the
    // tables may have completed the step the lost worker pushed rows of).
    run->exact_rows = exact.ok() && run->sparse;
    if (!absl::IsFailedPrecondition(exact)) return exact;
    // The job went on without the rank meanwhile (it was given up, then
    // taken over): the run joins at the partitions' step, as CatchUp does.
    Log(absl::StrCat("job ", task_.job_id(), ": rank ", task_.rank(),
                     " (taken over): ", exact.message(), "; joining at the partitions' step"));
  }
  RETURN_IF_ERROR(PullParameters(run->model.get(), MinVersion(run->first_step),
                                 task_.has_join() ? 0 : MinWorkerSteps(run->first_step)));
  if (task_.has_join()) run->pulled_version = exchange_->min_pulled_version();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JobTrainer::CatchUp(int64_t step, RunState* run) {
  // A SYNC rank that the job went on without (a slow one where
  // backup_workers let steps complete on a quorum; a lost rank is waited
  // for until it is taken over) finds every partition steps
  // ahead: it joins at their step, as a taker does, its data skipped to
  // there, rather than replaying each step it missed as a late push the
  // shards ignore while the others wait for it.
  // Not with sparse tables: the next batch's rows are already fetched.
  if (task_.spec().consistency().mode() != ConsistencySpec::SYNC || run->sparse) return step;
  if (run->pending) {
    // The last step's exchange is in flight; the one before it found the
    // partitions at the last step, unless the job had gone on. Only then is
    // it awaited here, ahead of the overlap.
    if (run->pulled_version < step) return step;
    RETURN_IF_ERROR(FinishPendingExchange(run));
  }
  if (!run->pulled) return step;
  const int64_t reached = std::min(run->pulled_version, steps_.load());
  if (reached <= step) return step;
  permanent_ = true;  // A bad record recurs on a restart (as ReadBatch's).
  for (int64_t skipped = step; skipped < reached; ++skipped) {
    ASSIGN_OR_RETURN(bool have_batch, run->reader->Next(&run->batch));
    if (!have_batch) return DataEnded();
  }
  permanent_ = false;
  Log(absl::StrCat("job ", task_.job_id(), ": rank ", task_.rank(), " was left behind at step ",
                   step, " (the job went on without it); it joins at step ", reached,
                   ", its data skipped to there"));
  steps_completed_.store(reached);
  return reached;
}

absl::StatusOr<JobTrainer::StepState> JobTrainer::BeginStep(int64_t step, RunState* run) {
  if (stopped_()) return absl::CancelledError("job ended");
  if (!run->pulled) {
    RETURN_IF_ERROR(PullParameters(run->model.get(), MinVersion(step), MinWorkerSteps(step)));
  }
  // Until the step's first batch is read, a failure is the data's: it recurs
  // on a restart.
  permanent_ = true;
  if (data_changed_.exchange(false)) RETURN_IF_ERROR(SwitchData(step, run));
  return PlanStep(step, *run);
}

absl::Status JobTrainer::SwitchData(int64_t step, RunState* run) {
  absl::MutexLock lock(&data_mu_);
  ASSIGN_OR_RETURN(run->reader, OpenTrainingData(new_data_, new_data_step_));
  run->ahead_ended = false;  // A new stream.
  data_ = new_data_;
  data_step_ = new_data_step_;
  Log(absl::StrCat("job ", task_.job_id(), ": rank ", task_.rank(), " reads ", data_.size(),
                   " file parts from step ", step, " (it took on a lost rank's data)"));
  return absl::OkStatus();
}

JobTrainer::StepState JobTrainer::PlanStep(int64_t step, const RunState& run) {
  StepState s;
  s.step = step;
  s.began = MonotonicSeconds();
  s.checkpoint_due = CheckpointDue(step);
  s.final_step = step + 1 >= steps_.load();
  s.push =
      run.push_every == 1 || s.final_step || s.checkpoint_due || (step + 1) % run.push_every == 0;
  s.fetch = !s.final_step && (step + 1) % run.fetch_every == 0;
  // The exchange overlaps backward: each message of the push (and the
  // pull that comes back with it) goes as soon as backward has produced
  // its gradients. Not where the push is of something else than this
  // step's gradients (a sum over steps) or where FP16's verdict on the whole step decides whether
  // it is pushed at all.
  ModelRunner* model = run.model.get();
  // Nor where the pull waits for this step's own pushes (SSP with
  // staleness 0): PushPull pushes them all first.
  s.stream = options_.overlap && s.push && s.fetch && run.push_every == 1 &&
             model->precision() != FP16 && MinWorkerSteps(step + 1) <= step;
  // A GPU worker queues each partition pulled back to the device at once,
  // on the copy stream (of the GPU whose share it is, with several): the
  // next step finds them there.
  if (s.stream && model->uploads_pulled_params()) {
    s.upload = [model](const PartitionPlacement& p) {
      return model->UploadParam(p.tensor_id(), p.offset(), p.num_elements());
    };
  }
  // The last step's exchange still in flight: a model that reads the
  // parameters where they land (the CPU's, or a GPU's they are uploaded
  // to; with several GPUs, each layer's go from their owners to the
  // others as they come, or to its pipeline stage's GPU) starts its
  // forward on them layer by layer.
  s.gated = run.pending && (run.pending_uploads || model->reads_host_params());
  return s;
}

absl::Status JobTrainer::ComputeStep(StepState* s, RunState* run) {
  TrainStepOptions step_options = ExchangeHooks(s, run);
  RETURN_IF_ERROR(ReadBatch(s, run));
  const double began = MonotonicSeconds();
  run->exchange_waited = 0;
  run->pending_waited = 0;
  run->read_ahead = 0;
  if (!s->gated) RETURN_IF_ERROR(BeginExchange(*s, run));
  ASSIGN_OR_RETURN(const float* features, BatchFeatures(*s, run));
  step_options.pooled_rows = input_stage_ != nullptr && input_stage_->pooled_on_device();
  RETURN_IF_ERROR(ReadAhead(*s, run));
  const Batch& batch = run->batch;
  ASSIGN_OR_RETURN(s->result, run->model->TrainStep(features, batch.labels.data(), batch.size,
                                                    s->step, step_options));
  const double computed = MonotonicSeconds() - began - run->exchange_waited - run->read_ahead;
  run->total_compute += computed;
  run->total_exchange += run->exchange_waited;
  run->total_pending_wait += run->pending_waited;
  s->compute += computed;
  s->exchange += run->exchange_waited;
  if (!s->result.skipped && !std::isfinite(s->result.loss)) {
    // Its gradients have gone: the shards refuse them too.
    return MarkDiverged(
        absl::InternalError(absl::StrCat("training diverged at step ", s->step, ": the loss is ",
                                         s->result.loss, NonFiniteGradient(*run->model))));
  }
  s->examples = batch.size;
  return absl::OkStatus();
}

absl::Status JobTrainer::ReadBatch(StepState* s, RunState* run) {
  permanent_ = true;  // A bad record recurs on a restart.
  if (!run->ahead.empty()) {
    // Its plan is made (the last Exchange took it); a task may still pool
    // it (two ahead, on a CPU): "plan" in the step's split.
    const double pooled = MonotonicSeconds();
    input_stage_->AwaitBatch();
    run->total_plan += MonotonicSeconds() - pooled;
  }
  const double began = MonotonicSeconds();
  bool have_batch = true;
  if (!run->ahead.empty()) {
    run->batch = std::move(*run->ahead.front());
    run->ahead.pop_front();
  } else {
    ASSIGN_OR_RETURN(have_batch, run->reader->Next(&run->batch));
  }
  const double waited = MonotonicSeconds() - began;
  run->total_input_wait += waited;
  s->input_wait += waited;
  permanent_ = false;
  return have_batch ? absl::OkStatus() : DataEnded();
}

absl::StatusOr<const float*> JobTrainer::BatchFeatures(const StepState& s, RunState* run) {
  if (input_stage_ == nullptr) return run->batch.features.data();
  // The rows came back with the last step's exchange (or are pulled).
  const double began = MonotonicSeconds();
  const bool exact = run->exact_rows;
  run->exact_rows = false;
  // On a GPU the input is pooled straight into the page-locked buffer it
  // goes up from (the last step, which read it, has returned).
  ASSIGN_OR_RETURN(float* staging, run->model->FeatureStaging(run->batch.size));
  // ... and its rows pooled there, on the GPU.
  const InputStage::PoolOnDevice pool_on_device = DevicePooling(run->model.get());
  absl::StatusOr<const float*> packed =
      input_stage_->Features(s.step, run->batch, MinVersion(s.step), MinWorkerSteps(s.step), exact,
                             staging, pool_on_device);
  if (exact && absl::IsFailedPrecondition(packed.status())) {
    // The tables went on (restored, or a shard from before exact rows):
    // the rows as they are now, the step no longer exactly the lost one's.
    Log(absl::StrCat("job ", task_.job_id(), ": rank ", task_.rank(), " (taken over): ",
                     packed.status().message(), "; reading the rows as they are"));
    packed = input_stage_->Features(s.step, run->batch, MinVersion(s.step), MinWorkerSteps(s.step),
                                    /*exact_version=*/false, staging, pool_on_device);
  }
  RETURN_IF_ERROR(PermanentIfBadData(packed.status()));
  const double waited = MonotonicSeconds() - began;
  run->exchange_waited += waited;
  run->total_rows += waited;
  return packed;
}

TrainStepOptions JobTrainer::ExchangeHooks(StepState* s, RunState* run) {
  TrainStepOptions options;
  ModelRunner* model = run->model.get();
  if (s->gated) {
    // The forward takes each layer's parameters as the last step's
    // exchange brings them; this step's exchange begins before backward.
    options.params_from_host = !run->pending_uploads;
    options.await_layer_params = [this, model, run](int layer) -> absl::Status {
      const double began = MonotonicSeconds();
      absl::Status arrived = exchange_->AwaitTensors(model->shape().layers[layer].param_ids);
      const double waited = MonotonicSeconds() - began;
      run->exchange_waited += waited;
      run->total_layer_wait += waited;
      return arrived;
    };
    options.before_backward = [this, s, run] { return BeginExchange(*s, run); };
  }
  if (s->stream) {
    // Each gradient goes to the exchange as backward finishes it.
    options.gradient_queued = [this, model](int id, int64_t ticket) {
      exchange_->GradientReady(id, [model, id, ticket] { return model->WaitGradient(id, ticket); });
    };
  }
  return options;
}

absl::Status JobTrainer::BeginExchange(const StepState& s, RunState* run) {
  RETURN_IF_ERROR(FinishPendingExchange(run));
  if (s.checkpoint_due) exchange_->MarkNextPush(s.step + 1);
  if (!s.stream) return absl::OkStatus();
  exchange_->BeginPushPull(s.step, run->model_grads, MinVersion(s.step + 1),
                           MinWorkerSteps(s.step + 1), run->model_params, stopped_, s.upload);
  run->pending = true;
  run->pending_step = s.step;
  return absl::OkStatus();
}

absl::Status JobTrainer::FinishPendingExchange(RunState* run) {
  if (!run->pending) return absl::OkStatus();
  const double began = MonotonicSeconds();
  run->pending = false;
  absl::Status finished = exchange_->FinishPushPull();
  const double waited = MonotonicSeconds() - began;
  run->exchange_waited += waited;
  run->pending_waited += waited;
  RETURN_IF_ERROR(finished);
  run->pulled_version = exchange_->min_pulled_version();
  steps_completed_.store(run->pending_step + 1);
  return absl::OkStatus();
}

absl::Status JobTrainer::CaptureCheckpoint(StepState* s, const RunState& run) {
  if (!s->checkpoint_due) return absl::OkStatus();
  s->checkpoint.set_step(s->step + 1);
  s->checkpoint.set_attempt(task_.attempt());
  ASSIGN_OR_RETURN(*s->checkpoint.mutable_state(), SaveWorkerState(*run.model));
  return absl::OkStatus();
}

absl::Status JobTrainer::ReadAhead(const StepState& s, RunState* run) {
  if (!run->sparse || s.final_step || run->next_read) return absl::OkStatus();
  // A bad record recurs on a restart (as ReadBatch's).
  permanent_ = true;
  const double began = MonotonicSeconds();
  // Up to plan_depth() batches ahead, none past the rank's last step.
  const size_t depth = static_cast<size_t>(input_stage_->plan_depth());
  while (!run->ahead_ended && run->ahead.size() < depth &&
         s.step + 1 + static_cast<int64_t>(run->ahead.size()) < steps_.load()) {
    auto batch = std::make_unique<Batch>();
    ASSIGN_OR_RETURN(const bool read, run->reader->Next(batch.get()));
    if (!read) {
      run->ahead_ended = true;
      break;
    }
    const int64_t step = s.step + 1 + static_cast<int64_t>(run->ahead.size());
    input_stage_->PlanAhead(step, batch.get(), MinVersion(step), MinWorkerSteps(step));
    run->ahead.push_back(std::move(batch));
  }
  run->read_ahead = MonotonicSeconds() - began;
  run->total_input_wait += run->read_ahead;
  permanent_ = false;
  run->next_read = true;
  return absl::OkStatus();
}

absl::Status JobTrainer::ExchangeSparseRows(const StepState& s, RunState* run) {
  if (!run->sparse) return absl::OkStatus();
  // The rows' gradients go, and the next batch's rows come, beside the
  // dense exchange.
  const Batch* next = nullptr;
  if (!s.final_step) {
    RETURN_IF_ERROR(ReadAhead(s, run));
    run->next_read = false;
    if (run->ahead.empty()) return DataEnded();
    next = run->ahead.front().get();
  }
  // "plan" in the step's split: the rows' gradients gathered, the next
  // batch's plan waited for, their exchange begun.
  const double began = MonotonicSeconds();
  absl::Status begun = PermanentIfBadData(
      input_stage_->Exchange(s.step, *run->model->whole_model(), next, MinVersion(s.step + 1),
                             MinWorkerSteps(s.step + 1), s.checkpoint_due ? s.step + 1 : 0));
  run->total_plan += MonotonicSeconds() - began;
  return begun;
}

absl::Status JobTrainer::EndExchange(StepState* s, RunState* run) {
  ModelRunner* model = run->model.get();
  // A step that FP16 loss scaling skipped is pushed as skipped in every
  // mode: the shards count it as this worker's step but take no gradient
  // from it (a SYNC step completes with the workers that brought one; SSP's
  // bound and the final pull see the worker's progress).
  std::vector<const float*> grads = Gradients(*model, s->result.skipped);
  if (run->push_every > 1) {
    // Summing the steps' gradients on the host is the step's compute (a
    // model's worth of additions: milliseconds for a large one).
    const double summing = MonotonicSeconds();
    run->accumulated.Add(*model, grads);
    grads = run->accumulated.Gradients();
    const double summed = MonotonicSeconds() - summing;
    run->total_compute += summed;
    s->compute += summed;
  }
  const int64_t next = s->step + 1;
  const double began = MonotonicSeconds();
  if (s->stream) {
    // In flight: the next step finishes it (or what needs the whole
    // parameters first: an evaluation, a plain exchange, the end).
    run->pending_uploads = s->upload != nullptr;
  } else if (s->push && s->fetch) {
    RETURN_IF_ERROR(
        PushGradientsAndPull(model, s->step, grads, MinVersion(next), MinWorkerSteps(next)));
    run->pulled_version = exchange_->min_pulled_version();
  } else if (s->push) {
    RETURN_IF_ERROR(PushGradients(s->step, grads));
  } else if (s->fetch) {
    RETURN_IF_ERROR(PullParameters(model, MinVersion(next), MinWorkerSteps(next)));
    run->pulled_version = exchange_->min_pulled_version();
  }
  const double exchanged = MonotonicSeconds() - began;
  run->total_exchange += exchanged;
  s->exchange += exchanged;
  if (s->push) run->accumulated.Clear();
  // A last step pulls nothing; should the rank's steps grow, the next one
  // pulls first.
  run->pulled = !s->final_step;
  if (!s->stream) steps_completed_.store(next);  // Else once its exchange is.
  return absl::OkStatus();
}

void JobTrainer::RecordStep(const StepState& s, RunState* run) {
  run->window_loss += s.result.loss;
  ++run->window_steps;
  run->window_examples += s.examples;
  const double took = MonotonicSeconds() - s.began;
  run->total_step_seconds += took;
  const TrainerMetrics& metrics = run->metrics;
  if (metrics.steps) {
    metrics.steps->Increment();
    metrics.examples->Increment(static_cast<double>(s.examples));
    metrics.step_seconds->Observe(took);
    metrics.compute_seconds->Observe(s.compute);
    metrics.exchange_seconds->Observe(s.exchange);
    metrics.input_wait_seconds->Observe(s.input_wait);
  }
  const int window = exchange_window_->Record(took);
  if (window != exchange_->window()) exchange_->SetWindow(window);
  if (exchange_window_->settled() && window != run->settled_window) {
    run->settled_window = window;
    Log(absl::StrCat("job ", task_.job_id(), ": rank ", task_.rank(), " keeps ", window,
                     " exchange messages in flight (median step at each depth tried: ",
                     exchange_window_->last_search(), ")"));
  }
  if (metrics.exchange_window) metrics.exchange_window->Set(window);
}

void JobTrainer::ReportProgress(StepState* s, bool last, RunState* run) {
  const bool checkpoint = s->checkpoint.step() > 0;
  if ((s->step + 1) % task_.spec().log_every_steps() != 0 && !last && !checkpoint) return;
  const double now = MonotonicSeconds();
  ReportProgressRequest progress;
  // The steps whose exchange is done (an overlapped step's is still in
  // flight): what a drain or a taker of the rank counts on.
  progress.set_step(steps_completed_.load());
  run->last_loss = run->window_loss / run->window_steps;
  progress.set_loss(run->last_loss);
  run->last_rate = run->window_examples / std::max(1e-9, now - run->window_start);
  progress.set_examples_per_sec(run->last_rate);
  if (run->metrics.loss) run->metrics.loss->Set(progress.loss());
  if (run->metrics.examples_per_second) {
    run->metrics.examples_per_second->Set(progress.examples_per_sec());
  }
  // The evaluating rank finishes with its evaluation (EvaluateFinalModel).
  progress.set_finished(last && !evaluates_.load());
  if (checkpoint) *progress.mutable_checkpoint() = std::move(s->checkpoint);
  Report(progress, /*final=*/progress.finished());
  run->window_start = now;
  run->window_loss = 0;
  run->window_steps = run->window_examples = 0;
}

absl::Status JobTrainer::EvaluatePeriodically(const StepState& s, bool last, RunState* run) {
  // The evaluating rank's evaluation of the parameters it just pulled (the
  // last step's is the final one: EvaluateFinalModel).
  const int64_t every = task_.spec().eval_every_steps();
  const int64_t step = s.step + 1;
  if (!evaluates_.load() || every <= 0 || step % every != 0 || last) return absl::OkStatus();
  const double began = MonotonicSeconds();
  RETURN_IF_ERROR(FinishPendingExchange(run));
  RETURN_IF_ERROR(input_stage_ ? input_stage_->Finish() : absl::OkStatus());
  // Opened again for each evaluation: a file gone since the start is the data's.
  absl::StatusOr<std::unique_ptr<BatchReader>> opened = OpenTestSet(*run->model);
  if (!opened.ok()) return BadTestData(opened.status());
  std::unique_ptr<BatchReader> test_set = *std::move(opened);
  // The rows as of the parameters pulled: no wait.
  ASSIGN_OR_RETURN(TestMetrics tested, EvaluateTestSet(run->model.get(), test_set.get(), 0, 0));
  if (run->metrics.test_accuracy) run->metrics.test_accuracy->Set(tested.accuracy);
  LogEvaluation(task_.job_id(), tested, absl::StrCat(" at step ", step));
  ReportProgressRequest evaluated;
  evaluated.set_step(step);
  evaluated.set_loss(run->last_loss);
  evaluated.set_examples_per_sec(run->last_rate);
  Evaluation* evaluation = evaluated.mutable_evaluation();
  evaluation->set_step(step);
  evaluation->set_accuracy(tested.accuracy);
  if (tested.auc) evaluation->set_auc(*tested.auc);
  if (tested.log_loss) evaluation->set_log_loss(*tested.log_loss);
  Report(evaluated, /*final=*/false);
  // The evaluation is not training time.
  run->window_start += MonotonicSeconds() - began;
  return absl::OkStatus();
}

absl::Status JobTrainer::FinishRun(RunState* run) {
  RETURN_IF_ERROR(FinishPendingExchange(run));
  if (input_stage_ != nullptr) RETURN_IF_ERROR(input_stage_->Finish());
  if (run->total_step_seconds <= 0) return absl::OkStatus();
  // Where a step's time went (the rest: accumulating, checkpoint state,
  // progress reports).
  const double total = run->total_step_seconds;
  const int64_t trained = std::max<int64_t>(1, steps_.load() - run->first_step);
  const double ms = 1000.0 / static_cast<double>(trained);
  const double other =
      total - run->total_input_wait - run->total_compute - run->total_exchange - run->total_plan;
  Log(absl::StrCat(
      absl::StrFormat("job %s: rank %d trained %d steps in %.2f s, %.1f%% of it waiting for "
                      "input; per step %.3f ms: input %.3f, ",
                      task_.job_id(), task_.rank(), trained, total,
                      100 * run->total_input_wait / total, total * ms, run->total_input_wait * ms),
      run->sparse ? absl::StrFormat("plan %.3f, ", run->total_plan * ms) : "",
      absl::StrFormat("compute %.3f, exchange %.3f", run->total_compute * ms,
                      run->total_exchange * ms),
      run->sparse ? absl::StrFormat(
                        " (rows %.3f, of it laying the input out %.3f, the device's block %.3f; "
                        "the rows' round trip %.3f, of it on the shards %.3f)",
                        run->total_rows * ms, input_stage_->lay_seconds() * ms,
                        input_stage_->block_seconds() * ms, input_stage_->round_trip_seconds() * ms,
                        input_stage_->shard_seconds() * ms)
                  : "",
      absl::StrFormat(", other %.3f", other * ms),
      DenseSplit(run->total_layer_wait, run->total_pending_wait, exchange_->streamed_seconds(), ms),
      run->sparse
          ? absl::StrFormat("; sparse rows per step: pulled %.1f, read kept %.1f, kept sent to "
                            "the device %.1f",
                            static_cast<double>(input_stage_->rows_pulled()) / trained,
                            static_cast<double>(input_stage_->rows_kept()) / trained,
                            static_cast<double>(input_stage_->rows_to_device()) / trained)
          : "",
      run->sparse ? AheadSplit(input_stage_->ahead_seconds()) : ""));
  return absl::OkStatus();
}

absl::Status JobTrainer::EvaluateFinalModel(RunState* run) {
  // Every worker's last update applied.
  const bool sync = task_.spec().consistency().mode() == ConsistencySpec::SYNC;
  const int64_t final_version = sync ? JobSteps() : 0;
  const int64_t final_worker_steps = sync ? 0 : JobSteps();
  RETURN_IF_ERROR(PullParameters(run->model.get(), final_version, final_worker_steps));
  if (run->test_reader == nullptr) {
    // This rank came to evaluate after it started (rank 0 was lost).
    absl::StatusOr<std::unique_ptr<BatchReader>> opened = OpenTestSet(*run->model);
    if (!opened.ok()) return BadTestData(opened.status());
    run->test_reader = *std::move(opened);
  }
  ASSIGN_OR_RETURN(TestMetrics tested, EvaluateTestSet(run->model.get(), run->test_reader.get(),
                                                       final_version, final_worker_steps));
  if (run->metrics.test_accuracy) run->metrics.test_accuracy->Set(tested.accuracy);
  ReportProgressRequest done;
  if (task_.checkpoints()) {
    // The final checkpoint: what export takes away.
    RETURN_IF_ERROR(exchange_->CaptureNow(JobSteps(), steps_.load() - 1, stopped_));
    done.mutable_checkpoint()->set_step(JobSteps());
    done.mutable_checkpoint()->set_attempt(task_.attempt());
    ASSIGN_OR_RETURN(*done.mutable_checkpoint()->mutable_state(), SaveWorkerState(*run->model));
  }
  LogEvaluation(task_.job_id(), tested, "");
  done.set_step(steps_.load());
  done.set_loss(run->last_loss);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(tested.accuracy);
  if (tested.auc) done.set_test_auc(*tested.auc);
  if (tested.log_loss) done.set_test_log_loss(*tested.log_loss);
  Report(done, /*final=*/true);
  evaluated_.store(true);
  return absl::OkStatus();
}

}  // namespace downpour
