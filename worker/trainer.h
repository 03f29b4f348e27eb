// JobTrainer: one worker's part of one job — the training loop of the job's
// model on the worker's devices (replicas of it, or its pipeline stages:
// worker/model_runner.h). Each step it pulls the parameters from the job's shards, runs
// forward and backward on its next batch, and pushes the gradients back; it
// reports progress every log_every_steps and, on rank 0, evaluates the final
// model on the held-out set. Where the job is saved (Task.checkpoints), rank
// 0 also takes its checkpoints: it marks a step's push so every shard
// captures its partitions at that step, and sends its own state
// (worker/worker_state.h) with a progress report. A task with a restore
// starts at the checkpoint's step: the worker state is loaded, the data
// stream skips the batches already trained on, and the first pull waits for
// the restored parameters. A task with a join takes over a lost worker's
// rank mid-run: it continues the rank's data stream at the shards' current
// step (SYNC) or the rank's last reported one (ASYNC/SSP).
//
// The rank's training data comes from the coordinator (Task.data): a task
// without any yet lists the record files the spec names and asks for the
// rank's share (ReportProgressRequest.data_files). When the rank takes on a
// lost rank's data mid-run (UpdateData), it reads the new share from its
// next step.
//
// The shards are ParameterShard interfaces, so the loop runs the same against
// local stores (tests) and remote shards (the daemon). Run() is blocking and
// runs on its own thread; Cancel() may be called from any thread.
#ifndef DOWNPOUR_WORKER_TRAINER_H_
#define DOWNPOUR_WORKER_TRAINER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "data/dataset.h"
#include "proto/coordinator.pb.h"
#include "ps/parameter_shard.h"
#include "worker/exchange_window.h"
#include "worker/input_stage.h"
#include "worker/model_runner.h"
#include "worker/param_exchange.h"

namespace downpour {

struct TrainerOptions {
  std::string node_id;
  int64_t incarnation = 0;
  // Relative record-file globs of the job are resolved against this.
  std::string data_dir;
  // Directories besides data_dir that the record files may lead into
  // through symlinks (--data_roots); a file whose real path is elsewhere
  // fails the job (data/data_roots.h).
  std::vector<std::string> data_roots;
  // The exchange's timeouts and tuning (pull_timeout, pull_slice,
  // push_timeout, max_inflight, message_bytes); the trainer fills in the
  // job's own fields (job, rank, identity, wire dtype).
  ExchangeOptions exchange;
  // The messages in flight are chosen from the measured step times
  // (worker/exchange_window.h), up to exchange.max_inflight; false: always
  // exchange.max_inflight.
  bool tune_window = false;
  MetricsRegistry* metrics = nullptr;  // Optional, not owned.
  // Where the model computes (worker/model_runner.h): one replica per CUDA
  // device listed (ModelOptions::device), or one on the CPU when empty. With
  // several, each step's batch is split across them and their gradients are
  // reduced into the first replica before the push (NCCL between GPUs; see
  // model/replica_set.h). A job whose model is split into pipeline stages
  // (ModelSpec.pipeline) runs stage i on the i-th device listed, which must
  // be one per stage, or every stage on the CPU when empty.
  std::vector<int> devices;
  // Non-null: the most compute memory the worker's replicas and pipeline
  // stages may hold together on each device (--device_memory_limit;
  // ModelOptions::memory_caps): two ranks on one worker share the limit
  // rather than take it each. Null: no limit but the devices' own.
  std::shared_ptr<kernels::MemoryCaps> device_memory;
  // GPU convolutions through cuDNN's graph API where faster (--conv_graph;
  // ModelOptions::conv_graph).
  bool conv_graph = true;
  // Which run of this job in this process this is (0 first): a worker that
  // runs a job again in the same attempt (it took a rank over) numbers its
  // requests above its earlier runs', which the shards remember.
  int64_t run_index = 0;
  // Testing only (--testing_stall_mid_push): "JOB:RANK:STEP" stalls that
  // rank's push of that step after shard 0 (ExchangeOptions::
  // testing_stall_step), except in a run that took the rank over;
  // "JOB:RANK:STEP:stale" pushes it once the rank went elsewhere
  // (ExchangeOptions::testing_stale_push).
  std::string testing_stall_mid_push;
  // Each step's push and pull overlap its backward pass (message by
  // message as the gradients come out; ParameterExchange::BeginPushPull);
  // false: the step's exchange starts after backward (the serial path).
  bool overlap = true;
  // A bf16/fp16 job on GPUs pulls the weights its GPUs read only in that
  // type narrowed to it (half their bytes; the same steps): ModelRunner::
  // reduced_weight_params. false: every parameter as float32.
  bool pull_reduced_weights = true;
};

// What an evaluation of the test set measured (JobSpec.metrics).
struct TestMetrics {
  double accuracy = 0;
  std::optional<double> auc, log_loss;
  // "test accuracy A[, AUC X][, log loss Y]" appended to `text`.
  void Describe(std::string* text) const;
};

class JobTrainer {
 public:
  // Delivers a progress report to the coordinator. Returns its answer (the
  // job has ended elsewhere — stopped, or failed on another node — which
  // stops the loop; the rank's data, for a listing) or the delivery error.
  using Reporter =
      std::function<absl::StatusOr<ReportProgressResponse>(const ReportProgressRequest&)>;

  // `shards[i]` serves shard index i of the task's placement (not owned).
  JobTrainer(Task task, TrainerOptions options, std::vector<ParameterShard*> shards,
             Reporter reporter);

  // Trains to the end, reports the outcome (finished, or the error) and
  // returns it. A run stopped before its end (Cancel, Shutdown, or the
  // coordinator's answer that the job ended) returns Cancelled saying why
  // in one sentence (StopReason).
  absl::Status Run();
  // The coordinator wants a checkpoint (rank 0; the time it asked, in ms):
  // taken at the next step boundary unless this request was already.
  void RequestCheckpoint(int64_t requested_ms) {
    int64_t wanted = checkpoint_wanted_ms_.load();
    while (requested_ms > wanted &&
           !checkpoint_wanted_ms_.compare_exchange_weak(wanted, requested_ms)) {
    }
  }
  // The coordinator changed the rank's data (Task.data, from step
  // `data_step`) or its steps (Task.steps; only more are taken; ASYNC/SSP,
  // a lost rank's dealt out): read and run them from the next step on.
  // Thread-safe.
  void UpdateData(std::vector<DataPart> data, int64_t data_step, int64_t steps);
  // Whether this rank takes the job's checkpoints (Task.takes_checkpoints:
  // rank 0, or another while rank 0 is lost). Thread-safe.
  void SetTakesCheckpoints(bool takes) { takes_checkpoints_.store(takes); }
  // Whether this rank evaluates the job (Task.evaluates: rank 0, or while
  // it is lost the lowest live rank), as the coordinator's tasks say.
  void SetEvaluates(bool evaluates) { evaluates_.store(evaluates); }
  // Whether this run reported the job's final evaluation.
  bool evaluated() const { return evaluated_.load(); }
  // Which start of the job this trainer runs (Task.attempt).
  int64_t attempt() const { return task_.attempt(); }
  // The job is no longer this worker's task: stop without reporting. `why`
  // is what happened, as the run's end says it ("rank 1 was handed to
  // another worker; this worker stops its run"); empty where the worker
  // cannot tell (the job left its task list: it ended, or the rank went to
  // another worker). The first `why` given is kept.
  void Cancel(std::string why = "");
  // Which rank of the job this trainer runs.
  int rank() const { return task_.rank(); }
  // Run() returned an error it reported (the coordinator acts on it: the
  // job fails or starts again, and this task goes away).
  bool failed() const { return failed_.load(); }
  // Steps completed (pushed) so far.
  int64_t steps_completed() const { return steps_completed_.load(); }
  bool cancelled() const { return cancelled_.load(); }
  // Testing only: this run pushes a step after it is cancelled, as a worker
  // cut off from the coordinator would (--testing_stall_mid_push=...:stale);
  // its calls to the shards are left alone (WorkerRuntime).
  bool testing_pushes_after_cancel() const { return testing_pushes_after_cancel_.load(); }
  // The worker process is exiting (SIGTERM): finish the step under way
  // (its push reaches every shard, whole; the next step's parameters are
  // not waited for), then hand the rank back to the coordinator (drained),
  // which gives it to another worker while the job goes on.
  void Shutdown() {
    shutdown_at_ms_.store(absl::ToUnixMillis(absl::Now()));
    shutting_down_.store(true);
    cancelled_.store(true);
  }
  // How long a shutdown waits for the push under way before giving it up
  // too (shards that answer push a step in milliseconds; ones that dropped
  // the job, or are gone, would hold the exit for --push_timeout_ms).
  static constexpr absl::Duration kShutdownPushGrace = absl::Seconds(2);

 private:
  // What one run of Train holds (the model, its data, what the loop
  // carries from step to step, the run's totals), and one step's plan and
  // measurements; both defined in trainer_loop.cc, with Train and its
  // phases.
  struct RunState;
  struct StepState;

  // The training loop: StartRun, then each step's phases in turn, then
  // FinishRun and rank 0's EvaluateFinalModel.
  absl::Status Train();

  // Before the first step: the model (CreateModel), where this worker
  // starts (FindFirstStep), the rank's data and a checkpoint's or a lost
  // rank's state (OpenData, Resume), the first pull (StartLoop).
  absl::Status StartRun(RunState* run);
  absl::Status CreateModel(RunState* run);
  absl::Status FindFirstStep(RunState* run);
  absl::Status Resume(int64_t data_step, RunState* run);
  absl::Status StartLoop(RunState* run);

  // A step's phases, in order.
  // SYNC: where the job went on without this rank, the step every
  // partition has reached (the data skipped to it); else `step`.
  absl::StatusOr<int64_t> CatchUp(int64_t step, RunState* run);
  // Input: a pull a step owes, the rank's new data, the step's plan.
  absl::StatusOr<StepState> BeginStep(int64_t step, RunState* run);
  absl::Status SwitchData(int64_t step, RunState* run);
  StepState PlanStep(int64_t step, const RunState& run);
  // Per batch: input, the exchange's beginning (ExchangeHooks make the
  // model's step begin it before backward where it overlaps), compute.
  absl::Status ComputeStep(StepState* s, RunState* run);
  absl::Status ReadBatch(StepState* s, RunState* run);
  absl::StatusOr<const float*> BatchFeatures(const StepState& s, RunState* run);
  TrainStepOptions ExchangeHooks(StepState* s, RunState* run);
  absl::Status BeginExchange(const StepState& s, RunState* run);
  // Waits for the overlapped exchange still in flight, if any.
  absl::Status FinishPendingExchange(RunState* run);
  // Checkpoint: rank 0's own state at the step the shards capture.
  absl::Status CaptureCheckpoint(StepState* s, const RunState& run);
  // The exchange's end: the sparse rows, then the dense partitions (or,
  // overlapped, left in flight for the next step).
  // With sparse tables, reads the batch after this step's (once a step) and
  // starts its rows' plan while the step computes.
  absl::Status ReadAhead(const StepState& s, RunState* run);
  absl::Status ExchangeSparseRows(const StepState& s, RunState* run);
  absl::Status EndExchange(StepState* s, RunState* run);
  // Reporting and evaluation.
  void RecordStep(const StepState& s, RunState* run);
  void ReportProgress(StepState* s, bool last, RunState* run);
  absl::Status EvaluatePeriodically(const StepState& s, bool last, RunState* run);

  // After the last step.
  absl::Status FinishRun(RunState* run);
  absl::Status EvaluateFinalModel(RunState* run);

  // What a pull for `step` waits for: SYNC, every partition at that
  // version; SSP, every worker within the staleness bound of it.
  int64_t MinVersion(int64_t step) const;
  int64_t MinWorkerSteps(int64_t step) const;
  // The job's last step (every rank's): the final checkpoint's and SYNC's
  // final version, whatever this rank's own step target (steps_).
  int64_t JobSteps() const { return task_.spec().steps(); }

  // Checks the task's placement against the model's parameters and sets up
  // the exchange with the job's shards.
  absl::Status StartExchange(const ModelRunner& model);
  absl::Status PullParameters(ModelRunner* model, int64_t min_version, int64_t min_worker_steps);
  // Pushes gradients by tensor id as step `step`'s (none: a skipped step).
  absl::Status PushGradients(int64_t step, const std::vector<const float*>& grads);
  // PushGradients(step, grads), then PullParameters(min_version,
  // min_worker_steps), in one round trip per message.
  absl::Status PushGradientsAndPull(ModelRunner* model, int64_t step,
                                    const std::vector<const float*>& grads, int64_t min_version,
                                    int64_t min_worker_steps);
  absl::StatusOr<std::unique_ptr<data::BatchReader>> OpenTestSet(const ModelRunner& model) const;
  // OK when every one of `files` (as the job names them) is inside the
  // worker's data directories (TrainerOptions::data_roots).
  absl::Status CheckDataFiles(const std::vector<std::string>& files) const;
  // `status`, marking the failure permanent when it is InvalidArgument (bad
  // data met by the input stage).
  absl::Status PermanentIfBadData(absl::Status status);
  // `status`, an error of the test set (a missing, truncated or corrupt
  // file, a record that does not decode as the spec's input, an id outside
  // a table's vocabulary, no examples), marking the failure permanent.
  absl::Status BadTestData(absl::Status status);
  // The rank's data (Task.data), or, when the task has none yet, the share
  // the coordinator gives for this worker's listing of the record files.
  absl::StatusOr<std::vector<DataPart>> TrainingData(int64_t* data_step);
  // A reader of `data` whose stream began at `data_step`.
  absl::StatusOr<std::unique_ptr<data::BatchReader>> OpenTrainingData(
      const std::vector<DataPart>& data, int64_t data_step) const;
  // A reader of the rank's data (TrainingData), now the data read; sets
  // `data_step` to the step its stream began at.
  absl::StatusOr<std::unique_ptr<data::BatchReader>> OpenData(int64_t* data_step);
  // Whether rank 0 saves a checkpoint after `step` (0-based; the last step
  // has the final checkpoint instead): at the spec's every_steps, or when
  // the coordinator has asked since the last one.
  bool CheckpointDue(int64_t step);
  // `model`'s block for a batch's rows pooled on its device
  // (ModelRunner::PooledStaging), as the input stage asks for it.
  static InputStage::PoolOnDevice DevicePooling(ModelRunner* model);
  // The test set's metrics; a model with sparse tables reads their rows
  // once the tables have had min_version steps and every worker
  // min_worker_steps.
  absl::StatusOr<TestMetrics> EvaluateTestSet(ModelRunner* model, data::BatchReader* reader,
                                              int64_t min_version, int64_t min_worker_steps);
  // Sends a report; a final one (finished, accuracy, failure) is retried
  // until delivered or the trainer is cancelled. Ordinary progress is best
  // effort.
  void Report(ReportProgressRequest request, bool final);
  // Report's delivery: the coordinator's answer, or the last error.
  absl::StatusOr<ReportProgressResponse> Send(ReportProgressRequest request, bool final);
  // Why a stopped run stopped, in one sentence for the worker's log:
  // `handed_back` (a shutdown's drained report went), Cancel's why, the
  // coordinator's answer that the job ended (or this run's attempt did),
  // or, none of those, that the job is no longer this worker's task. Never
  // that the job ended where the worker cannot know it.
  std::string StopReason(bool handed_back);

  const Task task_;
  const TrainerOptions options_;
  const std::vector<ParameterShard*> shards_;
  const Reporter reporter_;
  std::unique_ptr<ParameterExchange> exchange_;  // Set by StartExchange.
  // How many of exchange_'s messages fly at once; set with it.
  std::unique_ptr<ExchangeWindow> exchange_window_;
  // The model's shape (set by Train) and, for a model with named inputs,
  // its input stage (set by StartExchange).
  ModelShape shape_;
  std::unique_ptr<InputStage> input_stage_;
  // Why Train failed, for the coordinator: the error would recur on a
  // restart (data, model). A divergence is marked in the error itself
  // (common/status.h IsDiverged), wherever it was found.
  bool permanent_ = false;
  std::atomic<int64_t> checkpoint_wanted_ms_{0};
  std::atomic<bool> takes_checkpoints_{false};
  std::atomic<bool> evaluates_{false};
  std::atomic<bool> evaluated_{false};
  int64_t checkpoint_taken_ms_ = 0;  // The request the last checkpoint answered.
  std::atomic<bool> cancelled_{false};
  // Cancel was called: the run is no longer the rank's, and even a push
  // under way is given up (a shutdown sets only cancelled_: the step it
  // computed is pushed whole; ExchangeOptions::push_cancelled).
  std::atomic<bool> abandoned_{false};
  std::atomic<int64_t> shutdown_at_ms_{0};  // Shutdown's time, Unix ms.
  absl::Mutex cancel_mu_;
  std::string cancel_why_ ABSL_GUARDED_BY(cancel_mu_);  // Cancel's.
  // The coordinator answered a report: the job is no longer running (or
  // this run's attempt is over).
  std::atomic<bool> job_ended_{false};
  // Whether the exchanges should give up: the job ended, here or elsewhere.
  const std::function<bool()> stopped_ = [this] { return cancelled_.load() || job_ended_.load(); };
  // The data read now and the step its stream began at, and UpdateData's
  // news (when data_changed_), taken at a step boundary.
  std::atomic<bool> data_changed_{false};
  absl::Mutex data_mu_;
  std::vector<DataPart> data_ ABSL_GUARDED_BY(data_mu_);
  int64_t data_step_ ABSL_GUARDED_BY(data_mu_) = -1;
  std::vector<DataPart> new_data_ ABSL_GUARDED_BY(data_mu_);
  int64_t new_data_step_ ABSL_GUARDED_BY(data_mu_) = 0;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> testing_pushes_after_cancel_{false};
  // The steps the rank runs (Task.steps; may grow mid-run).
  std::atomic<int64_t> steps_{0};
  // Steps this worker has completed (pushed), for a drain's report.
  std::atomic<int64_t> steps_completed_{0};
  std::atomic<bool> failed_{false};
  bool coordinator_reachable_ = true;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_TRAINER_H_
