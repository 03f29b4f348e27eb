#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/binary_metrics.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "data/data_roots.h"
#include "data/dataset.h"
#include "spec/shard_map.h"
#include "spec/wire_dtype.h"
#include "worker/worker_metrics.h"
#include "worker/worker_state.h"

namespace downpour {
using data::Batch;
using data::BatchReader;
using data::BatchReaderOptions;
namespace {

int64_t FeatureSize(const ModelSpec& model) {
  int64_t n = 1;
  for (int64_t d : model.input_shape()) n *= d;
  return n;
}

// What every reader of the job's records needs: keys, sizes, the input as an
// image, encoding and compression (augmentation is the training reader's).
void SetExampleFormat(const JobSpec& spec, const ModelShape& shape, BatchReaderOptions* options) {
  const DatasetSpec& data = spec.dataset();
  options->feature_key = data.feature_key();
  options->label_key = data.label_key();
  options->feature_size = FeatureSize(spec.model());
  const auto& input = spec.model().input_shape();
  if (input.size() == 3) options->image = data::ImageShape{input[0], input[1], input[2]};
  // Named inputs (InferModel has filled in their defaults).
  if (!shape.inputs.empty()) options->feature_size = 0;
  for (const InputSpec& named : shape.inputs) {
    data::InputFormat format;
    format.name = named.name();
    format.sparse = named.kind() == InputSpec::SPARSE;
    format.features.assign(named.features().begin(), named.features().end());
    if (format.sparse) {
      format.max_ids = named.max_ids();
    } else {
      format.size = 1;
      for (int64_t d : named.shape()) format.size *= d;
    }
    options->inputs.push_back(std::move(format));
  }
  options->encoding = data.encoding() == DatasetSpec::RAW       ? data::FeatureEncoding::kRaw
                      : data.encoding() == DatasetSpec::ENCODED ? data::FeatureEncoding::kEncoded
                                                                : data::FeatureEncoding::kBySize;
  // Automatic: half the cores, leaving the rest to training and the exchange.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  options->decode_threads =
      data.decode_threads() > 0 ? data.decode_threads() : std::clamp(cores / 2, 1, 4);
  options->compression = data.compression() == DatasetSpec::NONE   ? data::Compression::kNone
                         : data.compression() == DatasetSpec::GZIP ? data::Compression::kGzip
                                                                   : data::Compression::kAuto;
}

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
        for (int64_t k = 0; k < n; ++k) sums_[i][k] += g[k];
      }
    }
    any_ = true;
  }
  void Scale(float factor) {
    for (std::vector<float>& sum : sums_) {
      for (float& x : sum) x *= factor;
    }
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

}  // namespace

JobTrainer::JobTrainer(Task task, TrainerOptions options, std::vector<ParameterShard*> shards,
                       Reporter reporter)
    : task_(std::move(task)),
      options_(std::move(options)),
      shards_(std::move(shards)),
      reporter_(std::move(reporter)) {
  takes_checkpoints_.store(task_.takes_checkpoints());
}

absl::Status JobTrainer::StartExchange(const ModelRunner& model) {
  const std::vector<ParamInfo>& params = model.params();
  const std::vector<PartitionPlacement> partitions(task_.placement().partitions().begin(),
                                                   task_.placement().partitions().end());
  // The coordinator placed the job for this model; a placement from a
  // coordinator of another version is refused before it indexes anything.
  RETURN_IF_ERROR(Annotate(CheckPlacement(params, partitions, static_cast<int>(shards_.size())),
                           "the job's placement does not fit its model"));
  absl::StatusOr<WireDtype> dtype = WireDtypeOf(task_.spec().gradient_wire_dtype());
  if (!dtype.ok()) return Annotate(dtype.status(), "gradient_wire_dtype");
  ExchangeOptions exchange = options_.exchange;
  exchange.job_id = task_.job_id();
  exchange.rank = task_.rank();
  exchange.worker_id = options_.node_id;
  exchange.incarnation = options_.incarnation;
  // Each start of the job in this process numbers its requests above the
  // last start's (2^32 requests apart), and each run within a start above
  // the last run's (2^24 apart).
  exchange.first_sequence = (task_.attempt() << 32) + (options_.run_index << 24);
  exchange.attempt = task_.attempt();
  exchange.gradient_dtype = *dtype;
  // Messages keep ExchangeOptions' size (partitions are never split, so a
  // larger partition is a message of its own): a model of many small
  // partitions then costs a few exchanges per step, not one per partition.
  exchange_ = std::make_unique<ParameterExchange>(exchange, partitions, shards_);
  if (!shape_.inputs.empty()) {
    input_stage_ = std::make_unique<InputStage>(
        shape_, exchange, shards_, [this] { return cancelled_.load() || job_ended_.load(); });
  }
  return absl::OkStatus();
}

absl::Status JobTrainer::Run() {
  absl::Status status = Train();
  if (shutting_down_.load() && !job_ended_.load()) {
    // One attempt: the process is exiting. The rank goes to another worker.
    ReportProgressRequest drained;
    drained.set_drained(true);
    drained.set_step(steps_completed_.load());
    Report(drained, /*final=*/true);
  } else if (!status.ok() && !cancelled_.load() && !job_ended_.load()) {
    ReportProgressRequest failed;
    failed.set_error(std::string(status.message()));
    failed.set_permanent(permanent_);
    // Marked where the loss (here) or a gradient (a shard) was not finite.
    failed.set_diverged(IsDiverged(status));
    CountFailure(options_.metrics, FailureReason(status, failed.diverged()));
    Report(failed, /*final=*/true);
    failed_.store(true);
  }
  return status;
}

void JobTrainer::Report(ReportProgressRequest request, bool final) {
  // The answer matters only to a listing of the data (job_ended is kept).
  (void)Send(std::move(request), final);
}

absl::StatusOr<ReportProgressResponse> JobTrainer::Send(ReportProgressRequest request, bool final) {
  request.set_job_id(task_.job_id());
  request.set_node_id(options_.node_id);
  request.set_rank(task_.rank());
  request.set_attempt(task_.attempt());
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::StatusOr<ReportProgressResponse> answer = reporter_(request);
    if (answer.ok()) {
      if (!coordinator_reachable_) {
        Log(absl::StrCat("job ", task_.job_id(), ": progress reports delivered again"));
      }
      coordinator_reachable_ = true;
      if (answer->job_ended()) job_ended_.store(true);
      return answer;
    }
    if (coordinator_reachable_) {
      Log(absl::StrCat("job ", task_.job_id(), ": cannot report progress (",
                       answer.status().message(), ")", final ? "; retrying" : ""));
    }
    coordinator_reachable_ = false;
    // A result is retried for as long as the job is this worker's task (a
    // coordinator restart loses nothing); one the coordinator rejected
    // outright will not be accepted later.
    if (!final || cancelled_.load() || absl::IsPermissionDenied(answer.status()) ||
        absl::IsNotFound(answer.status()) || absl::IsInvalidArgument(answer.status())) {
      return answer;
    }
    absl::SleepFor(backoff);  // Backoff between delivery attempts of a result.
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

absl::Status JobTrainer::PullParameters(ModelRunner* model, int64_t min_version,
                                        int64_t min_worker_steps) {
  return exchange_->Pull(min_version, min_worker_steps, ParamPointers(model),
                         [this] { return cancelled_.load() || job_ended_.load(); });
}

absl::Status JobTrainer::PushGradients(int64_t step, const std::vector<const float*>& grads) {
  return exchange_->Push(step, grads, [this] { return cancelled_.load() || job_ended_.load(); });
}

absl::Status JobTrainer::PushGradientsAndPull(ModelRunner* model, int64_t step,
                                              const std::vector<const float*>& grads,
                                              int64_t min_version, int64_t min_worker_steps) {
  return exchange_->PushPull(step, grads, min_version, min_worker_steps, ParamPointers(model),
                             [this] { return cancelled_.load() || job_ended_.load(); });
}

absl::StatusOr<std::unique_ptr<BatchReader>> JobTrainer::OpenTestSet() const {
  const JobSpec& spec = task_.spec();
  BatchReaderOptions options;
  ASSIGN_OR_RETURN(std::vector<std::string> files,
                   data::ListRecordFiles(spec.dataset().test_files(), options_.data_dir));
  RETURN_IF_ERROR(CheckDataFiles(files));
  options.slices = data::WholeFiles(files);
  options.data_dir = options_.data_dir;
  SetExampleFormat(spec, shape_, &options);
  options.batch_size = 1000;
  options.repeat = false;
  return BatchReader::Create(options);
}

absl::Status JobTrainer::PermanentIfBadData(absl::Status status) {
  // InvalidArgument from the input stage is the data's (an id outside its
  // table's exact vocabulary) or the request's: it recurs on a restart.
  if (absl::IsInvalidArgument(status)) permanent_ = true;
  return status;
}

absl::Status JobTrainer::CheckDataFiles(const std::vector<std::string>& files) const {
  ASSIGN_OR_RETURN(const data::DataRoots roots,
                   data::DataRoots::Create(options_.data_dir, options_.data_roots));
  for (const std::string& file : files) RETURN_IF_ERROR(roots.Check(file));
  return absl::OkStatus();
}

bool JobTrainer::CheckpointDue(int64_t step) {
  const JobSpec& spec = task_.spec();
  if (!task_.checkpoints() || !takes_checkpoints_.load() || step + 1 >= spec.steps()) return false;
  const int64_t wanted = checkpoint_wanted_ms_.load();
  const int64_t every = spec.checkpoint().every_steps();
  if (wanted <= checkpoint_taken_ms_ && (every <= 0 || (step + 1) % every != 0)) return false;
  checkpoint_taken_ms_ = std::max(checkpoint_taken_ms_, wanted);
  return true;
}

absl::StatusOr<std::vector<DataPart>> JobTrainer::TrainingData(int64_t* data_step) {
  *data_step = task_.data_step();
  if (task_.data_size() > 0) return std::vector<DataPart>(task_.data().begin(), task_.data().end());
  ReportProgressRequest listing;
  ASSIGN_OR_RETURN(std::vector<std::string> files,
                   data::ListRecordFiles(task_.spec().dataset().train_files(), options_.data_dir));
  RETURN_IF_ERROR(CheckDataFiles(files));
  listing.mutable_data_files()->Assign(files.begin(), files.end());
  absl::StatusOr<ReportProgressResponse> answer = Send(std::move(listing), /*final=*/true);
  if (!answer.ok()) {
    return Annotate(answer.status(), "asking the coordinator for this rank's training data");
  }
  if (job_ended_.load() || cancelled_.load()) return absl::CancelledError("job ended");
  if (answer->data_size() == 0) {
    return absl::InternalError(
        absl::StrCat("the coordinator gave rank ", task_.rank(), " no training data"));
  }
  *data_step = answer->data_step();
  return std::vector<DataPart>(answer->data().begin(), answer->data().end());
}

namespace {

bool SameData(const std::vector<DataPart>& a, const std::vector<DataPart>& b) {
  return std::equal(
      a.begin(), a.end(), b.begin(), b.end(), [](const DataPart& x, const DataPart& y) {
        return x.file() == y.file() && x.stride() == y.stride() && x.offset() == y.offset();
      });
}

}  // namespace

void JobTrainer::UpdateData(std::vector<DataPart> data, int64_t data_step, int64_t steps,
                            int batches_per_step) {
  // Only ever more steps (a run that already ended keeps its end).
  int64_t known = steps_.load();
  while (steps > known && !steps_.compare_exchange_weak(known, steps)) {
  }
  batches_per_step_.store(std::max(1, batches_per_step));
  absl::MutexLock lock(&data_mu_);
  const bool same = data_step == data_step_ && SameData(data, data_);
  new_data_ = std::move(data);
  new_data_step_ = data_step;
  data_changed_.store(!same);
}

absl::StatusOr<std::unique_ptr<BatchReader>> JobTrainer::OpenTrainingData(
    const std::vector<DataPart>& parts, int64_t data_step) const {
  const JobSpec& spec = task_.spec();
  BatchReaderOptions data;
  std::vector<std::string> files;
  for (const DataPart& part : parts) {
    data.slices.push_back(data::FileSlice{part.file(), part.stride(), part.offset()});
    files.push_back(part.file());
  }
  // The coordinator's share may name any file: each is checked here too.
  RETURN_IF_ERROR(CheckDataFiles(files));
  data.data_dir = options_.data_dir;
  SetExampleFormat(spec, shape_, &data);
  if (spec.dataset().has_random_crop()) {
    data.augment.crop_padding = spec.dataset().random_crop().padding();
  }
  data.augment.flip_left_right = spec.dataset().random_flip_left_right();
  data.batch_size = spec.dataset().batch_size();
  data.shuffle_buffer = spec.dataset().shuffle_buffer();
  data.seed = spec.seed();
  // A rank's stream, and a new one each time its data changes.
  data.stream = (static_cast<uint64_t>(data_step) << 16) + task_.rank();
  data.repeat = true;
  return BatchReader::Create(data);
}

absl::StatusOr<TestMetrics> JobTrainer::EvaluateTestSet(ModelRunner* model, BatchReader* reader,
                                                        int64_t min_version,
                                                        int64_t min_worker_steps) {
  const JobSpec& spec = task_.spec();
  bool auc = false, log_loss = false;
  for (int metric : spec.metrics()) {
    auc |= metric == AUC;
    log_loss |= metric == LOG_LOSS;
  }
  Batch batch;
  int64_t correct = 0, total = 0;
  BinaryMetrics binary;
  std::vector<float> logits;
  while (true) {
    ASSIGN_OR_RETURN(bool more, reader->Next(&batch));
    if (!more) break;
    const float* features = batch.features.data();
    if (input_stage_ != nullptr) {
      ASSIGN_OR_RETURN(features, input_stage_->EvalFeatures(batch, min_version, min_worker_steps));
    }
    ASSIGN_OR_RETURN(EvalResult result, model->Evaluate(features, batch.labels.data(), batch.size,
                                                        auc || log_loss ? &logits : nullptr));
    if (auc || log_loss) {
      // Two classes: P(class 1) = sigmoid(logit 1 - logit 0).
      for (int64_t i = 0; i < batch.size; ++i) {
        const double margin = logits[2 * i + 1] - logits[2 * i];
        binary.Add(1.0 / (1.0 + std::exp(-margin)), batch.labels[i]);
      }
    }
    correct += result.correct;
    total += batch.size;
  }
  if (total == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("test set ", spec.dataset().test_files(), " holds no examples"));
  }
  TestMetrics metrics;
  metrics.accuracy = static_cast<double>(correct) / total;
  if (auc) metrics.auc = binary.Auc();
  if (log_loss) metrics.log_loss = binary.LogLoss();
  return metrics;
}

void TestMetrics::Describe(std::string* text) const {
  absl::StrAppend(text, "test accuracy ", accuracy);
  if (auc) absl::StrAppend(text, ", AUC ", *auc);
  if (log_loss) absl::StrAppend(text, ", log loss ", *log_loss);
}

absl::Status JobTrainer::Train() {
  const JobSpec& spec = task_.spec();
  const int rank = task_.rank();
  ModelOptions model_options;
  model_options.memory_limit = options_.device_memory_limit;
  model_options.job_id = task_.job_id();  // Its lines reach the job's log.
  absl::StatusOr<std::unique_ptr<ModelRunner>> created =
      ModelRunner::Create(spec, options_.devices, model_options);
  // A model that cannot be made here (its spec, the devices it needs, their
  // memory) cannot be on a restart either.
  permanent_ = !created.ok();
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, std::move(created));
  for (const std::string& line : runner->Describe()) {
    Log(absl::StrCat("job ", task_.job_id(), ": ", line));
  }
  // What the loop trains, exchanges and evaluates with.
  ModelRunner* model = runner.get();
  shape_ = model->shape();
  RETURN_IF_ERROR(StartExchange(*model));
  // Where this worker starts: the job's start, its checkpoint's step, or
  // where the rank it takes over had got to — in SYNC the step every
  // partition has reached, which a first pull finds.
  int64_t first_step = task_.restore().step();
  steps_.store(task_.steps() > 0 ? task_.steps() : spec.steps());
  batches_per_step_.store(std::max(1, task_.batches_per_step()));
  if (task_.has_join()) {
    if (spec.consistency().mode() == ConsistencySpec::SYNC) {
      RETURN_IF_ERROR(PullParameters(model, 0, 0));
      first_step = exchange_->min_pulled_version();
    } else {
      first_step = task_.join().step();
    }
    first_step = std::min(first_step, steps_.load());
  }
  steps_completed_.store(first_step);

  // Data errors (no or a missing file, a corrupt record) recur on a restart.
  permanent_ = true;
  int64_t data_step = 0;
  ASSIGN_OR_RETURN(std::vector<DataPart> parts, TrainingData(&data_step));
  ASSIGN_OR_RETURN(auto reader, OpenTrainingData(parts, data_step));
  {
    // News that came while the data was being asked for is news only if
    // it differs.
    absl::MutexLock lock(&data_mu_);
    if (data_changed_.load() && new_data_step_ == data_step && SameData(new_data_, parts)) {
      data_changed_.store(false);
    }
    data_ = std::move(parts);
    data_step_ = data_step;
  }
  // A restored job continues at its checkpoint's step, with the workers'
  // state saved there and each worker's data where it was (the stream,
  // begun at data_step, is deterministic: the same batches, skipped).
  Batch batch;
  const std::string& worker_state =
      task_.has_join() ? task_.join().worker_state() : task_.restore().worker_state();
  if (!worker_state.empty()) {
    RETURN_IF_ERROR(Annotate(LoadWorkerState(worker_state, model),
                             task_.has_join()
                                 ? "loading the workers' state of the newest checkpoint"
                                 : absl::StrCat("restoring the checkpoint at step ", first_step)));
  }
  if (first_step > 0) {
    for (int64_t step = data_step; step < first_step; ++step) {
      ASSIGN_OR_RETURN(bool have_batch, reader->Next(&batch));
      if (!have_batch) return absl::InternalError("training data ended");
    }
    Log(absl::StrCat(
        "job ", task_.job_id(), ": continuing ",
        task_.has_join() ? absl::StrCat("rank ", rank, " (taken over)") : "from the checkpoint",
        " at step ", first_step));
  }
  // Rank 0 evaluates at the end; a wrong test-set path fails the job now,
  // not after the last step.
  std::unique_ptr<BatchReader> test_reader;
  if (rank == 0) {
    ASSIGN_OR_RETURN(test_reader, OpenTestSet());
  }
  permanent_ = false;

  const ConsistencySpec::Mode mode = spec.consistency().mode();
  const TrainerMetrics metrics =
      TrainerMetrics::Create(options_.metrics, task_.job_id(), /*evaluates=*/rank == 0);
  double total_input_wait = 0, total_step_seconds = 0, total_compute = 0, total_exchange = 0;

  double window_start = MonotonicSeconds();
  double window_loss = 0, last_loss = 0, last_rate = 0;
  int64_t window_steps = 0, window_examples = 0;
  // What a step's pull waits for.
  auto min_version = [&](int64_t step) -> int64_t {
    return mode == ConsistencySpec::SYNC ? step : 0;
  };
  auto min_worker_steps = [&](int64_t step) -> int64_t {
    return mode == ConsistencySpec::SSP
               ? std::max<int64_t>(0, step - spec.consistency().staleness())
               : 0;
  };
  // The first step pulls on its own; every later step's parameters come back
  // with the previous step's push (one round trip per message).
  // A joining run does not wait for SSP's bound on its first pull: a shard
  // restored mid-run counts every rank's steps from its checkpoint until
  // each pushes again.
  RETURN_IF_ERROR(PullParameters(model, min_version(first_step),
                                 task_.has_join() ? 0 : min_worker_steps(first_step)));
  // Whether the model holds the parameters after the last push (a push
  // that was to be the last pulls nothing; the rank's steps may grow).
  bool pulled = true;
  // ASYNC/SSP may push a sum of several steps and pull less often (SYNC: 1).
  const int64_t push_every = std::max(1, spec.consistency().push_every());
  const int64_t fetch_every = std::max(1, spec.consistency().fetch_every());
  GradientSum accumulated;
  // The mean of a step's batches when it trains on several (SYNC hand-out).
  GradientSum step_mean;
  // An overlapped step's exchange goes on into the next step: its forward
  // waits layer by layer for the parameters coming back (and, on a GPU,
  // going up to the device as they come), and it is finished before that
  // step's backward starts the next exchange. `pending`: one is in flight
  // (of step `pending_step`); `pending_uploads`: it queues the parameters
  // to the device.
  bool pending = false, pending_uploads = false;
  // What an overlapped step pushes from and pulls into: the model's own
  // buffers, the same every step.
  const std::vector<const float*> model_grads = Gradients(*model, false);
  const std::vector<float*> model_params = ParamPointers(model);
  int64_t pending_step = 0;
  double exchange_waited = 0;  // In the current step, inside its compute.
  auto finish_pending = [&]() -> absl::Status {
    if (!pending) return absl::OkStatus();
    const double began = MonotonicSeconds();
    pending = false;
    absl::Status finished = exchange_->FinishPushPull();
    exchange_waited += MonotonicSeconds() - began;
    RETURN_IF_ERROR(finished);
    steps_completed_.store(pending_step + 1);
    return absl::OkStatus();
  };
  // On every way out, what is in flight ends before the model it reads
  // and writes goes.
  absl::Cleanup abandon_pending = [&] {
    if (pending) (void)exchange_->FinishPushPull(/*abandon=*/true);
  };
  // Sparse tables: the batch after this step's, read before its exchange
  // (which pulls its rows).
  const bool sparse = input_stage_ != nullptr && input_stage_->sparse();
  Batch next_batch;
  bool have_next = false;
  for (int64_t step = first_step; step < steps_.load(); ++step) {
    if (cancelled_.load() || job_ended_.load()) return absl::CancelledError("job ended");
    if (!pulled) RETURN_IF_ERROR(PullParameters(model, min_version(step), min_worker_steps(step)));
    permanent_ = true;
    if (data_changed_.exchange(false)) {
      absl::MutexLock lock(&data_mu_);
      ASSIGN_OR_RETURN(reader, OpenTrainingData(new_data_, new_data_step_));
      data_ = new_data_;
      data_step_ = new_data_step_;
      Log(absl::StrCat("job ", task_.job_id(), ": rank ", rank, " reads ", data_.size(),
                       " file parts from step ", step, " (it took on a lost rank's data)"));
    }
    const double step_began = MonotonicSeconds();
    // A SYNC rank that took on a lost rank's batch trains on several a step
    // and pushes their mean.
    const int batches = std::max(1, batches_per_step_.load());
    if (sparse && batches > 1) {
      return absl::UnimplementedError(
          "a SYNC rank of a job with sparse tables cannot take on a lost rank's batches yet");
    }
    step_mean.Clear();
    StepResult result;
    double loss_sum = 0;
    int trained = 0;
    int64_t step_examples = 0;
    double step_input_wait = 0, step_compute = 0, step_exchange = 0;
    // A checkpoint at step + 1: this push asks the shards to capture it.
    const bool checkpoint_due = CheckpointDue(step);
    const bool final_step = step + 1 >= steps_.load();
    const bool push =
        push_every == 1 || final_step || checkpoint_due || (step + 1) % push_every == 0;
    const bool fetch = !final_step && (step + 1) % fetch_every == 0;
    // The exchange overlaps backward: each message of the push (and the
    // pull that comes back with it) goes as soon as backward has produced
    // its gradients. Not where the push is of something else than this
    // step's one batch (several batches' mean, a sum over steps) or where
    // FP16's verdict on the whole step decides whether it is pushed at all.
    const bool stream = options_.overlap && push && fetch && batches == 1 && push_every == 1 &&
                        model->precision() != FP16;
    // A GPU worker queues each partition pulled back to the device at once,
    // on the copy stream (of the GPU whose share it is, with several): the
    // next step finds them there.
    ParameterExchange::PulledFn upload;
    if (stream && model->uploads_pulled_params()) {
      upload = [model](const PartitionPlacement& p) {
        return model->UploadParam(p.tensor_id(), p.offset(), p.num_elements());
      };
    }
    // This step's exchange: marked for a checkpoint, and begun when it
    // overlaps backward (the last step's is finished first).
    auto start_exchange = [&]() -> absl::Status {
      RETURN_IF_ERROR(finish_pending());
      if (checkpoint_due) exchange_->MarkNextPush(step + 1);
      if (!stream) return absl::OkStatus();
      exchange_->BeginPushPull(
          step, model_grads, min_version(step + 1), min_worker_steps(step + 1), model_params,
          [this] { return cancelled_.load() || job_ended_.load(); }, upload);
      pending = true;
      pending_step = step;
      return absl::OkStatus();
    };
    TrainStepOptions step_options;
    // The last step's exchange still in flight: a model that reads the
    // parameters where they land (the CPU's, or a GPU's they are uploaded
    // to; with several GPUs, each layer's go from their owners to the
    // others as they come, or to its pipeline stage's GPU) starts its
    // forward on them layer by layer.
    const bool gated = pending && (pending_uploads || model->reads_host_params());
    if (gated) {
      step_options.params_from_host = !pending_uploads;
      step_options.await_layer_params = [&](int layer) -> absl::Status {
        const double began = MonotonicSeconds();
        absl::Status arrived = exchange_->AwaitTensors(model->shape().layers[layer].param_ids);
        exchange_waited += MonotonicSeconds() - began;
        return arrived;
      };
      step_options.before_backward = start_exchange;
    }
    if (stream) {
      step_options.gradient_queued = [this, model](int id, int64_t ticket) {
        exchange_->GradientReady(id,
                                 [model, id, ticket] { return model->WaitGradient(id, ticket); });
      };
    }
    for (int b = 0; b < batches; ++b) {
      permanent_ = true;
      const double wait_began = MonotonicSeconds();
      bool have_batch = true;
      if (have_next) {
        batch = std::move(next_batch);
        have_next = false;
      } else {
        ASSIGN_OR_RETURN(have_batch, reader->Next(&batch));
      }
      const double waited = MonotonicSeconds() - wait_began;
      total_input_wait += waited;
      step_input_wait += waited;
      permanent_ = false;
      if (!have_batch) return absl::InternalError("training data ended");
      const double compute_began = MonotonicSeconds();
      exchange_waited = 0;
      if (b == 0 && !gated) RETURN_IF_ERROR(start_exchange());
      const float* features = batch.features.data();
      if (input_stage_ != nullptr) {
        // The rows came back with the last step's exchange (or are pulled).
        const double began = MonotonicSeconds();
        absl::StatusOr<const float*> packed =
            input_stage_->Features(batch, min_version(step), min_worker_steps(step));
        RETURN_IF_ERROR(PermanentIfBadData(packed.status()));
        features = *packed;
        exchange_waited += MonotonicSeconds() - began;
      }
      ASSIGN_OR_RETURN(
          result, model->TrainStep(features, batch.labels.data(), batch.size, step, step_options));
      // A second batch of the step (SYNC hand-out, never overlapped): the
      // parameters are whole on the host by then.
      step_options = TrainStepOptions();
      const double computed = MonotonicSeconds() - compute_began - exchange_waited;
      total_compute += computed;
      total_exchange += exchange_waited;
      step_compute += computed;
      step_exchange += exchange_waited;
      if (!result.skipped && !std::isfinite(result.loss)) {
        // Its gradients have gone: the shards refuse them too.
        return MarkDiverged(
            absl::InternalError(absl::StrCat("training diverged at step ", step, ": the loss is ",
                                             result.loss, NonFiniteGradient(*model))));
      }
      step_examples += batch.size;
      if (batches > 1 && !result.skipped) {
        step_mean.Add(*model, Gradients(*model, false));
        loss_sum += result.loss;
        ++trained;
      }
    }
    if (batches > 1) {
      result.skipped = trained == 0;
      if (trained > 0) {
        result.loss = static_cast<float>(loss_sum / trained);
        step_mean.Scale(1.f / static_cast<float>(trained));
      }
    }
    // A step that FP16 loss scaling skipped is pushed as skipped in every
    // mode: the shards count it as this worker's step but take no gradient
    // from it (a SYNC step completes with the workers that brought one; SSP's
    // bound and the final pull see the worker's progress).
    CheckpointWorkerState checkpoint;
    if (checkpoint_due) {
      checkpoint.set_step(step + 1);
      checkpoint.set_attempt(task_.attempt());
      ASSIGN_OR_RETURN(*checkpoint.mutable_state(), SaveWorkerState(*model));
    }
    if (sparse) {
      // The rows' gradients go, and the next batch's rows come, beside the
      // dense exchange.
      const Batch* next = nullptr;
      if (!final_step) {
        // A bad record recurs on a restart (as the reads above).
        permanent_ = true;
        ASSIGN_OR_RETURN(have_next, reader->Next(&next_batch));
        permanent_ = false;
        if (!have_next) return absl::InternalError("training data ended");
        next = &next_batch;
      }
      RETURN_IF_ERROR(PermanentIfBadData(
          input_stage_->Exchange(step, *model->whole_model(), next, min_version(step + 1),
                                 min_worker_steps(step + 1), checkpoint_due ? step + 1 : 0)));
    }
    std::vector<const float*> grads =
        batches > 1 ? step_mean.Gradients() : Gradients(*model, result.skipped);
    if (push_every > 1) {
      accumulated.Add(*model, grads);
      grads = accumulated.Gradients();
    }
    const double exchange_began = MonotonicSeconds();
    if (stream) {
      // In flight: the next step finishes it (or what needs the whole
      // parameters first: an evaluation, a plain exchange, the end).
      pending_uploads = upload != nullptr;
    } else if (push && fetch) {
      RETURN_IF_ERROR(PushGradientsAndPull(model, step, grads, min_version(step + 1),
                                           min_worker_steps(step + 1)));
    } else if (push) {
      RETURN_IF_ERROR(PushGradients(step, grads));
    } else if (fetch) {
      RETURN_IF_ERROR(PullParameters(model, min_version(step + 1), min_worker_steps(step + 1)));
    }
    const double exchanged = MonotonicSeconds() - exchange_began;
    total_exchange += exchanged;
    step_exchange += exchanged;
    if (push) accumulated.Clear();
    // A last step pulls nothing; should the rank's steps grow, the next one
    // pulls first.
    pulled = !final_step;

    window_loss += result.loss;
    ++window_steps;
    window_examples += step_examples;
    if (!stream) steps_completed_.store(step + 1);  // Else once its exchange is.
    const double step_took = MonotonicSeconds() - step_began;
    total_step_seconds += step_took;
    if (metrics.steps) {
      metrics.steps->Increment();
      metrics.examples->Increment(static_cast<double>(step_examples));
      metrics.step_seconds->Observe(step_took);
      metrics.compute_seconds->Observe(step_compute);
      metrics.exchange_seconds->Observe(step_exchange);
      metrics.input_wait_seconds->Observe(step_input_wait);
    }
    const bool last = step + 1 == steps_.load();
    if ((step + 1) % spec.log_every_steps() == 0 || last || checkpoint.step() > 0) {
      const double now = MonotonicSeconds();
      ReportProgressRequest progress;
      // The steps whose exchange is done (an overlapped step's is still in
      // flight): what a drain or a taker of the rank counts on.
      progress.set_step(steps_completed_.load());
      last_loss = window_loss / window_steps;
      progress.set_loss(last_loss);
      last_rate = window_examples / std::max(1e-9, now - window_start);
      progress.set_examples_per_sec(last_rate);
      if (metrics.loss) metrics.loss->Set(progress.loss());
      if (metrics.examples_per_second) {
        metrics.examples_per_second->Set(progress.examples_per_sec());
      }
      progress.set_finished(last && rank != 0);
      if (checkpoint.step() > 0) *progress.mutable_checkpoint() = std::move(checkpoint);
      Report(progress, /*final=*/progress.finished());
      window_start = now;
      window_loss = 0;
      window_steps = window_examples = 0;
    }
    // Rank 0's periodic evaluation of the parameters it just pulled (the
    // last step's is the final one below).
    if (rank == 0 && spec.eval_every_steps() > 0 && (step + 1) % spec.eval_every_steps() == 0 &&
        !last) {
      const double began = MonotonicSeconds();
      RETURN_IF_ERROR(finish_pending());
      RETURN_IF_ERROR(input_stage_ ? input_stage_->Finish() : absl::OkStatus());
      ASSIGN_OR_RETURN(std::unique_ptr<BatchReader> test_set, OpenTestSet());
      // The rows as of the parameters pulled: no wait.
      ASSIGN_OR_RETURN(TestMetrics tested, EvaluateTestSet(model, test_set.get(), 0, 0));
      if (metrics.test_accuracy) metrics.test_accuracy->Set(tested.accuracy);
      std::string said = absl::StrCat("job ", task_.job_id(), ": ");
      tested.Describe(&said);
      Log(absl::StrCat(said, " at step ", step + 1));
      ReportProgressRequest evaluated;
      evaluated.set_step(step + 1);
      evaluated.set_loss(last_loss);
      evaluated.set_examples_per_sec(last_rate);
      evaluated.mutable_evaluation()->set_step(step + 1);
      evaluated.mutable_evaluation()->set_accuracy(tested.accuracy);
      if (tested.auc) evaluated.mutable_evaluation()->set_auc(*tested.auc);
      if (tested.log_loss) evaluated.mutable_evaluation()->set_log_loss(*tested.log_loss);
      Report(evaluated, /*final=*/false);
      // The evaluation is not training time.
      window_start += MonotonicSeconds() - began;
    }
  }
  RETURN_IF_ERROR(finish_pending());
  if (input_stage_ != nullptr) RETURN_IF_ERROR(input_stage_->Finish());
  if (total_step_seconds > 0) {
    // Where a step's time went (the rest: accumulating, checkpoint state,
    // progress reports).
    const int64_t trained = std::max<int64_t>(1, steps_.load() - first_step);
    const double ms = 1000.0 / static_cast<double>(trained);
    Log(absl::StrFormat(
        "job %s: rank %d trained %d steps in %.2f s, %.1f%% of it waiting for input; per step "
        "%.3f ms: input %.3f, compute %.3f, exchange %.3f, other %.3f",
        task_.job_id(), rank, trained, total_step_seconds,
        100 * total_input_wait / total_step_seconds, total_step_seconds * ms, total_input_wait * ms,
        total_compute * ms, total_exchange * ms,
        (total_step_seconds - total_input_wait - total_compute - total_exchange) * ms));
  }
  if (rank != 0) {
    // A rank taken over after its last step has nothing to train.
    if (first_step >= steps_.load()) {
      ReportProgressRequest done;
      done.set_step(steps_.load());
      done.set_finished(true);
      Report(done, /*final=*/true);
    }
    return absl::OkStatus();
  }

  // Rank 0 evaluates the final model: every worker's last update applied.
  const int64_t final_version = mode == ConsistencySpec::SYNC ? spec.steps() : 0;
  const int64_t final_worker_steps = mode == ConsistencySpec::SYNC ? 0 : spec.steps();
  RETURN_IF_ERROR(PullParameters(model, final_version, final_worker_steps));
  ASSIGN_OR_RETURN(TestMetrics tested,
                   EvaluateTestSet(model, test_reader.get(), final_version, final_worker_steps));
  if (metrics.test_accuracy) metrics.test_accuracy->Set(tested.accuracy);
  ReportProgressRequest done;
  if (task_.checkpoints()) {
    // The final checkpoint: what export takes away.
    RETURN_IF_ERROR(exchange_->CaptureNow(spec.steps(), steps_.load() - 1, [this] {
      return cancelled_.load() || job_ended_.load();
    }));
    done.mutable_checkpoint()->set_step(spec.steps());
    done.mutable_checkpoint()->set_attempt(task_.attempt());
    ASSIGN_OR_RETURN(*done.mutable_checkpoint()->mutable_state(), SaveWorkerState(*model));
  }
  std::string said = absl::StrCat("job ", task_.job_id(), ": ");
  tested.Describe(&said);
  Log(said);
  done.set_step(steps_.load());
  done.set_loss(last_loss);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(tested.accuracy);
  if (tested.auc) done.set_test_auc(*tested.auc);
  if (tested.log_loss) done.set_test_log_loss(*tested.log_loss);
  Report(done, /*final=*/true);
  return absl::OkStatus();
}

}  // namespace downpour
