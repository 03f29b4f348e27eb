#include "worker/trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/binary_metrics.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/process_metrics.h"
#include "common/status.h"
#include "common/work_pool.h"
#include "data/data_roots.h"
#include "data/dataset.h"
#include "spec/proto_dtype.h"
#include "spec/shard_map.h"
#include "worker/worker_metrics.h"

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
  // Automatic: half the cores the worker may use (UsableCores), up to 8 (the sparse tables'
  // pooling, below, takes the other half in bursts while the shards apply a step). A click log's
  // examples (26 lists of ids each) are dear to decode: on one H200 host (16 cores) the click job
  // waited 1.1-1.6 ms a step for its input with 4 threads, 0.05-0.1 ms with 8.
  const int cores = UsableCores();
  options->decode_threads =
      data.decode_threads() > 0 ? data.decode_threads() : std::clamp(cores / 2, 1, 8);
  options->compression = data.compression() == DatasetSpec::NONE   ? data::Compression::kNone
                         : data.compression() == DatasetSpec::GZIP ? data::Compression::kGzip
                                                                   : data::Compression::kAuto;
}

}  // namespace

JobTrainer::JobTrainer(Task task, TrainerOptions options, std::vector<ParameterShard*> shards,
                       Reporter reporter)
    : task_(std::move(task)),
      options_(std::move(options)),
      shards_(std::move(shards)),
      reporter_(std::move(reporter)) {
  takes_checkpoints_.store(task_.takes_checkpoints());
  evaluates_.store(task_.evaluates());
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
  // Requests are numbered per rank: a node may train two ranks of a SYNC
  // job at once (a lost rank no free worker took), and the shards keep
  // each sender's numbers apart. "<node>#..." passes their check that the
  // node holds the rank.
  exchange.worker_id = absl::StrCat(options_.node_id, "#r", task_.rank());
  exchange.incarnation = options_.incarnation;
  // Each start of the job in this process numbers its requests above the
  // last start's (2^32 requests apart), and each run within a start above
  // the last run's (2^24 apart).
  exchange.first_sequence = (task_.attempt() << 32) + (options_.run_index << 24);
  exchange.attempt = task_.attempt();
  exchange.gradient_dtype = *dtype;
  if (task_.spec().parameter_wire_dtype() == INT8) exchange.parameter_dtype = WireDtype::kInt8;
  if (options_.pull_reduced_weights) {
    exchange.reduced_tensors = model.reduced_weight_params();
    exchange.reduced_dtype = model.precision() == FP16 ? WireDtype::kFloat16 : WireDtype::kBfloat16;
  }
  // A shutdown (drain) stops the waits but not a push under way: the rank's
  // step reaches every shard or none, unless the shards do not take it
  // within kShutdownPushGrace (the job ended there, or they are gone).
  exchange.push_cancelled = [this] {
    if (abandoned_.load() || job_ended_.load()) return true;
    const int64_t shutdown = shutdown_at_ms_.load();
    return shutdown > 0 && absl::ToUnixMillis(absl::Now()) - shutdown >
                               absl::ToInt64Milliseconds(kShutdownPushGrace);
  };
  const std::vector<std::string> stall = absl::StrSplit(options_.testing_stall_mid_push, ':');
  int rank = 0;
  int64_t step = 0;
  if ((stall.size() == 3 || (stall.size() == 4 && stall[3] == "stale")) &&
      stall[0] == task_.job_id() && absl::SimpleAtoi(stall[1], &rank) && rank == task_.rank() &&
      absl::SimpleAtoi(stall[2], &step) && !task_.has_join()) {
    exchange.testing_stall_step = step;
    exchange.testing_stale_push = stall.size() == 4;
    testing_pushes_after_cancel_.store(exchange.testing_stale_push);
  }
  // Messages keep ExchangeOptions' size (partitions are never split, so a
  // larger partition is a message of its own): a model of many small
  // partitions then costs a few exchanges per step, not one per partition.
  exchange_ = std::make_unique<ParameterExchange>(exchange, partitions, shards_);
  if (options_.tune_window) {
    ExchangeWindow::Options window;
    window.depths.erase(std::remove_if(window.depths.begin(), window.depths.end(),
                                       [&](int depth) { return depth > exchange.max_inflight; }),
                        window.depths.end());
    exchange_window_ = std::make_unique<ExchangeWindow>(window);
  } else {
    exchange_window_ =
        std::make_unique<ExchangeWindow>(ExchangeWindow::Fixed(exchange.max_inflight));
  }
  exchange_->SetWindow(exchange_window_->depth());
  if (!shape_.inputs.empty()) {
    // Sparse tables are planned, pooled and their gradients gathered table
    // by table on half the usable cores, up to 16 (with the trainer's own thread):
    // pooling and gathering sit on a SYNC step's critical path while the
    // shards wait, so they take what the machine has. On one H200 host (16
    // cores) the click job's step went from 9.4 ms with 2 threads to 7.4
    // with 6 (bench/ctr_session.sh).
    const int table_threads = std::clamp(UsableCores() / 2, 0, 16);
    input_stage_ = std::make_unique<InputStage>(
        shape_, exchange, shards_, stopped_, table_threads,
        /*sync=*/task_.spec().consistency().mode() == ConsistencySpec::SYNC);
  }
  return absl::OkStatus();
}

void JobTrainer::Cancel(std::string why) {
  {
    absl::MutexLock lock(&cancel_mu_);
    if (cancel_why_.empty()) cancel_why_ = std::move(why);
  }
  abandoned_.store(true);
  cancelled_.store(true);
}

std::string JobTrainer::StopReason(bool handed_back) {
  const std::string rank = absl::StrCat("rank ", task_.rank());
  if (handed_back) {
    return absl::StrCat(rank,
                        " was handed back to the coordinator for another worker (this worker is "
                        "shutting down); this worker stops its run");
  }
  {
    absl::MutexLock lock(&cancel_mu_);
    if (!cancel_why_.empty()) return cancel_why_;
  }
  // The coordinator answers so also to a run of an attempt that is over.
  if (job_ended_.load()) {
    return "the coordinator says the job ended (or started again); this worker stops its run";
  }
  return absl::StrCat("the job is no longer this worker's task (it ended, or ", rank,
                      " went to another worker); this worker stops its run");
}

absl::Status JobTrainer::Run() {
  absl::Status status = Train();
  bool handed_back = false;
  if (shutting_down_.load() && !job_ended_.load()) {
    // One attempt: the process is exiting. The rank goes to another worker.
    ReportProgressRequest drained;
    drained.set_drained(true);
    drained.set_step(steps_completed_.load());
    Report(drained, /*final=*/true);
    handed_back = true;
  } else if (!status.ok() && !cancelled_.load() && !job_ended_.load()) {
    ReportProgressRequest failed;
    failed.set_error(std::string(status.message()));
    // Memory refused (a shard's budget, the device's) is refused again on a
    // restart: the job fails once, saying so.
    failed.set_permanent(permanent_ || absl::IsResourceExhausted(status));
    // Marked where the loss (here) or a gradient (a shard) was not finite.
    failed.set_diverged(IsDiverged(status));
    CountFailure(options_.metrics, FailureReason(status, failed.diverged()));
    Report(failed, /*final=*/true);
    failed_.store(true);
  }
  // Whichever wait noticed the stop said only "job ended", also where the
  // job goes on without this run.
  if (absl::IsCancelled(status) && (cancelled_.load() || job_ended_.load())) {
    return absl::CancelledError(StopReason(handed_back));
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

absl::StatusOr<std::unique_ptr<BatchReader>> JobTrainer::OpenTestSet(
    const ModelRunner& model) const {
  const JobSpec& spec = task_.spec();
  BatchReaderOptions options;
  ASSIGN_OR_RETURN(std::vector<std::string> files,
                   data::ListRecordFiles(spec.dataset().test_files(), options_.data_dir));
  RETURN_IF_ERROR(CheckDataFiles(files));
  options.slices = data::WholeFiles(files);
  options.data_dir = options_.data_dir;
  SetExampleFormat(spec, shape_, &options);
  // Batches of at least 1,000 test examples, or as many as a training
  // step holds on the evaluating device where that is more: each batch has
  // fixed costs (its rows' pull, launches, reading its logits back). A
  // click model of 4,096 examples a step evaluated a million test examples
  // in 1.65 s on one H200 with batches of 1,000, in 1.0 s with 4,096.
  options.batch_size = std::max<int64_t>(1000, model.EvaluateBatch(spec.dataset().batch_size()));
  options.repeat = false;
  return BatchReader::Create(options);
}

absl::Status JobTrainer::PermanentIfBadData(absl::Status status) {
  // InvalidArgument from the input stage is the data's (an id outside its
  // table's exact vocabulary) or the request's: it recurs on a restart.
  if (absl::IsInvalidArgument(status)) permanent_ = true;
  return status;
}

absl::Status JobTrainer::BadTestData(absl::Status status) {
  // The test set is read again, the same, on a restart (and only after
  // training again to the step that evaluates it).
  if (!status.ok()) permanent_ = true;
  return status;
}

absl::Status JobTrainer::CheckDataFiles(const std::vector<std::string>& files) const {
  ASSIGN_OR_RETURN(const data::DataRoots roots,
                   data::DataRoots::Create(options_.data_dir, options_.data_roots));
  for (const std::string& file : files) RETURN_IF_ERROR(roots.Check(file));
  return absl::OkStatus();
}

bool JobTrainer::CheckpointDue(int64_t step) {
  if (!task_.checkpoints() || !takes_checkpoints_.load() || step + 1 >= JobSteps()) return false;
  const int64_t wanted = checkpoint_wanted_ms_.load();
  const int64_t every = task_.spec().checkpoint().every_steps();
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

void JobTrainer::UpdateData(std::vector<DataPart> data, int64_t data_step, int64_t steps) {
  // Only ever more steps (a run that already ended keeps its end).
  int64_t known = steps_.load();
  while (steps > known && !steps_.compare_exchange_weak(known, steps)) {
  }
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

absl::StatusOr<std::unique_ptr<BatchReader>> JobTrainer::OpenData(int64_t* data_step) {
  ASSIGN_OR_RETURN(std::vector<DataPart> parts, TrainingData(data_step));
  ASSIGN_OR_RETURN(std::unique_ptr<BatchReader> reader, OpenTrainingData(parts, *data_step));
  // News that came while the data was being asked for is news only if it
  // differs.
  absl::MutexLock lock(&data_mu_);
  if (data_changed_.load() && new_data_step_ == *data_step && SameData(new_data_, parts)) {
    data_changed_.store(false);
  }
  data_ = std::move(parts);
  data_step_ = *data_step;
  return reader;
}

InputStage::PoolOnDevice JobTrainer::DevicePooling(ModelRunner* model) {
  return [model](int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
                 const std::vector<StoredRows>& stored) {
    return model->PooledStaging(batch, rows, ids, stored);
  };
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
  int64_t correct = 0, total = 0;
  BinaryMetrics binary;
  std::vector<float> logits;
  // InvalidArgument from the input stage is the batch's (an id outside its
  // table's exact vocabulary), which knows its files by the spec's pattern
  // only.
  auto bad_ids = [&](const absl::Status& status) {
    return absl::IsInvalidArgument(status)
               ? BadTestData(
                     Annotate(status, absl::StrCat("test set ", spec.dataset().test_files())))
               : status;
  };
  // A test batch read and its rows pulled, on `prep`'s thread while the
  // model evaluates the batch before; its errors kept as they came, for the
  // trainer's thread to say what they are (a read's: the test data's; the
  // rows': bad ids or the shards').
  struct Ready {
    Batch batch;
    bool more = false;
    double reading = 0, rows = 0;  // Seconds, on the thread that read it.
    absl::Status read, rows_status;
  };
  auto make_ready = [&](Ready* ready) {
    ready->reading = ready->rows = 0;
    ready->rows_status = absl::OkStatus();
    Laps laps;
    // The reader's errors name the file (and the record's offset).
    absl::StatusOr<bool> more = reader->Next(&ready->batch);
    ready->read = more.status();
    ready->more = more.ok() && *more;
    if (ready->more && input_stage_ != nullptr) {
      ready->rows_status =
          input_stage_->BeginEvalFeatures(ready->batch, min_version, min_worker_steps);
      laps.Add(&ready->reading);
      if (ready->rows_status.ok()) ready->rows_status = input_stage_->AwaitEvalRows();
      laps.Add(&ready->rows);
    } else {
      laps.Add(&ready->reading);
    }
  };
  // A sparse model's rows are pooled on the device where it can (as a
  // step's), its input laid out in the buffer it goes up from.
  const InputStage::PoolOnDevice pool_on_device = DevicePooling(model);
  std::vector<float> pooled;  // The input, where not in the staging buffer.
  if (input_stage_ != nullptr) input_stage_->NewEvaluation();
  absl::Cleanup end_evaluation = [this] {
    if (input_stage_ != nullptr) input_stage_->EndEvaluation();
  };
  // Where the evaluation's time goes, said in the log with its size.
  const double began = MonotonicSeconds();
  double reading = 0, rows = 0, laying = 0, evaluating = 0, waiting = 0;
  WorkPool prep(1, "eval-input");
  Ready ready[2];
  int current = 0;
  make_ready(&ready[current]);
  std::shared_ptr<WorkPool::Batch> next;
  // On every way out, the batch being read is waited for: it reads the
  // reader and the input stage.
  absl::Cleanup await_next = [&next] {
    if (next != nullptr) next->Wait();
  };
  while (true) {
    Ready& batch = ready[current];
    reading += batch.reading;
    rows += batch.rows;
    if (!batch.read.ok()) return BadTestData(batch.read);
    RETURN_IF_ERROR(bad_ids(batch.rows_status));
    if (!batch.more) break;
    Laps laps;
    const float* features = batch.batch.features.data();
    bool on_device = false;
    if (input_stage_ != nullptr) {
      ASSIGN_OR_RETURN(float* staging, model->FeatureStaging(batch.batch.size));
      absl::StatusOr<const float*> packed =
          input_stage_->EvalFeatures(batch.batch, staging, &pooled, pool_on_device, &on_device);
      RETURN_IF_ERROR(bad_ids(packed.status()));
      features = *packed;
    }
    laps.Add(&laying);
    Ready* following = &ready[1 - current];
    next = prep.Start(1, [&make_ready, following](int) { make_ready(following); });
    ASSIGN_OR_RETURN(EvalResult result,
                     model->Evaluate(features, batch.batch.labels.data(), batch.batch.size,
                                     auc || log_loss ? &logits : nullptr, on_device));
    if (auc || log_loss) {
      // Two classes: P(class 1) = sigmoid(logit 1 - logit 0).
      for (int64_t i = 0; i < batch.batch.size; ++i) {
        const double margin = logits[2 * i + 1] - logits[2 * i];
        binary.Add(1.0 / (1.0 + std::exp(-margin)), batch.batch.labels[i]);
      }
    }
    laps.Add(&evaluating);
    correct += result.correct;
    total += batch.batch.size;
    next->Wait();
    next.reset();
    laps.Add(&waiting);
    current = 1 - current;
  }
  if (total == 0) {
    return BadTestData(absl::FailedPreconditionError(
        absl::StrCat("test set ", spec.dataset().test_files(), " holds no examples")));
  }
  TestMetrics metrics;
  metrics.accuracy = static_cast<double>(correct) / total;
  if (auc) metrics.auc = binary.Auc();
  if (log_loss) metrics.log_loss = binary.LogLoss();
  const std::string rows_read =
      input_stage_ != nullptr && input_stage_->sparse()
          ? absl::StrFormat("; sparse rows: read %d, pulled %d", input_stage_->eval_rows_read(),
                            input_stage_->eval_rows_pulled())
          : "";
  Log(absl::StrFormat(
      "job %s: evaluated %d test examples in %.3f s (laying the input out %.3f, the model and "
      "metrics %.3f, waiting for the next batch %.3f; beside the model, reading and planning "
      "batches %.3f, waiting for their rows %.3f%s)",
      task_.job_id(), total, MonotonicSeconds() - began, laying, evaluating, waiting, reading, rows,
      rows_read));
  return metrics;
}

void TestMetrics::Describe(std::string* text) const {
  absl::StrAppend(text, "test accuracy ", accuracy);
  if (auc) absl::StrAppend(text, ", AUC ", *auc);
  if (log_loss) absl::StrAppend(text, ", log loss ", *log_loss);
}

}  // namespace downpour
