#include "worker/trainer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "data/dataset.h"

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

bool Retryable(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status) ||
         absl::IsNotFound(status);
}

}  // namespace

JobTrainer::JobTrainer(Task task, TrainerOptions options, std::vector<ParameterShard*> shards,
                       Reporter reporter)
    : task_(std::move(task)),
      options_(std::move(options)),
      shards_(std::move(shards)),
      reporter_(std::move(reporter)) {
  partitions_by_shard_.resize(shards_.size());
  for (const PartitionPlacement& p : task_.placement().partitions()) {
    if (p.shard() >= 0 && p.shard() < static_cast<int>(shards_.size())) {
      partitions_by_shard_[p.shard()].push_back(p);
    }
  }
}

absl::Status JobTrainer::Run() {
  absl::Status status = Train();
  if (!status.ok() && !cancelled_.load() && !job_ended_.load()) {
    ReportProgressRequest failed;
    failed.set_error(std::string(status.message()));
    Report(failed, /*final=*/true);
  }
  return status;
}

void JobTrainer::Report(ReportProgressRequest request, bool final) {
  request.set_job_id(task_.job_id());
  request.set_node_id(options_.node_id);
  request.set_rank(task_.rank());
  const absl::Time give_up = absl::Now() + options_.final_report_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::StatusOr<bool> ended = reporter_(request);
    if (ended.ok()) {
      if (!coordinator_reachable_) {
        Log(absl::StrCat("job ", task_.job_id(), ": progress reports delivered again"));
      }
      coordinator_reachable_ = true;
      if (*ended) job_ended_.store(true);
      return;
    }
    if (coordinator_reachable_) {
      Log(absl::StrCat("job ", task_.job_id(), ": cannot report progress (",
                       ended.status().message(), ")", final ? "; retrying" : ""));
    }
    coordinator_reachable_ = false;
    // A result the coordinator rejected outright will not be accepted later.
    if (!final || cancelled_.load() || absl::IsPermissionDenied(ended.status()) ||
        absl::IsNotFound(ended.status()) || absl::Now() + backoff > give_up) {
      return;
    }
    absl::SleepFor(backoff);  // Backoff between delivery attempts of a result.
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

absl::Status JobTrainer::PullParameters(Model* model, int64_t min_version,
                                        int64_t min_worker_steps) {
  for (size_t shard = 0; shard < shards_.size(); ++shard) {
    PullRequest request;
    request.set_job_id(task_.job_id());
    request.set_worker_rank(task_.rank());
    request.set_min_version(min_version);
    request.set_min_worker_steps(min_worker_steps);
    request.set_dtype(FLOAT32);
    for (const PartitionPlacement& p : partitions_by_shard_[shard]) {
      PartitionKey* key = request.add_keys();
      key->set_tensor_id(p.tensor_id());
      key->set_partition(p.partition());
    }
    const absl::Time give_up = absl::Now() + options_.pull_timeout;
    absl::StatusOr<PullResponse> response;
    while (true) {
      if (cancelled_.load() || job_ended_.load()) return absl::CancelledError("job ended");
      response =
          shards_[shard]->Pull(request, std::min(give_up, absl::Now() + options_.pull_slice));
      if (response.ok() || !Retryable(response.status()) || absl::Now() >= give_up) break;
    }
    if (!response.ok()) {
      return Annotate(response.status(), absl::StrCat("pulling from shard ", shard));
    }
    if (response->partitions_size() != request.keys_size()) {
      return absl::InternalError(absl::StrCat("shard ", shard, " returned ",
                                              response->partitions_size(), " partitions, asked ",
                                              request.keys_size()));
    }
    const char* bytes = response->payload().data();
    size_t offset = 0;
    for (int i = 0; i < response->partitions_size(); ++i) {
      const PartitionPlacement& p = partitions_by_shard_[shard][i];
      const size_t size = p.num_elements() * sizeof(float);
      if (response->partitions(i).num_elements() != p.num_elements() ||
          offset + size > response->payload().size()) {
        return absl::InternalError(absl::StrCat("shard ", shard, " returned a malformed pull"));
      }
      std::memcpy(model->param(p.tensor_id()) + p.offset(), bytes + offset, size);
      offset += size;
    }
  }
  return absl::OkStatus();
}

absl::Status JobTrainer::PushGradients(const Model& model, int64_t step) {
  for (size_t shard = 0; shard < shards_.size(); ++shard) {
    PushRequest request;
    request.set_job_id(task_.job_id());
    request.set_worker_rank(task_.rank());
    request.set_step(step);
    RequestId* id = request.mutable_request_id();
    id->set_worker_id(options_.node_id);
    id->set_incarnation(options_.incarnation);
    id->set_sequence(++sequence_);
    std::string* payload = request.mutable_payload();
    int64_t total = 0;
    for (const PartitionPlacement& p : partitions_by_shard_[shard]) total += p.num_elements();
    payload->reserve(total * sizeof(float));
    for (const PartitionPlacement& p : partitions_by_shard_[shard]) {
      PartitionHeader* header = request.add_partitions();
      header->mutable_key()->set_tensor_id(p.tensor_id());
      header->mutable_key()->set_partition(p.partition());
      header->set_dtype(FLOAT32);
      header->set_num_elements(p.num_elements());
      payload->append(reinterpret_cast<const char*>(model.grad(p.tensor_id()) + p.offset()),
                      p.num_elements() * sizeof(float));
    }
    auto response = shards_[shard]->Push(request);
    if (!response.ok())
      return Annotate(response.status(), absl::StrCat("pushing to shard ", shard));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> JobTrainer::EvaluateTestSet(Model* model) {
  const JobSpec& spec = task_.spec();
  BatchReaderOptions options;
  options.file_pattern = spec.dataset().test_files();
  options.data_dir = options_.data_dir;
  options.feature_key = spec.dataset().feature_key();
  options.label_key = spec.dataset().label_key();
  options.feature_size = FeatureSize(spec.model());
  options.batch_size = 1000;
  options.repeat = false;
  ASSIGN_OR_RETURN(auto reader, BatchReader::Create(options));
  Batch batch;
  int64_t correct = 0, total = 0;
  while (true) {
    ASSIGN_OR_RETURN(bool more, reader->Next(&batch));
    if (!more) break;
    ASSIGN_OR_RETURN(EvalResult result,
                     model->Evaluate(batch.features.data(), batch.labels.data(), batch.size));
    correct += result.correct;
    total += batch.size;
  }
  if (total == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("test set ", spec.dataset().test_files(), " holds no examples"));
  }
  return static_cast<double>(correct) / total;
}

absl::Status JobTrainer::Train() {
  const JobSpec& spec = task_.spec();
  const int rank = task_.rank();
  ASSIGN_OR_RETURN(auto model, Model::Create(spec.model(), spec.seed()));

  BatchReaderOptions data;
  data.file_pattern = spec.dataset().train_files();
  data.data_dir = options_.data_dir;
  data.feature_key = spec.dataset().feature_key();
  data.label_key = spec.dataset().label_key();
  data.feature_size = FeatureSize(spec.model());
  data.batch_size = spec.dataset().batch_size();
  data.shuffle_buffer = spec.dataset().shuffle_buffer();
  data.seed = spec.seed();
  data.rank = rank;
  data.num_workers = spec.num_workers();
  data.repeat = true;
  ASSIGN_OR_RETURN(auto reader, BatchReader::Create(data));

  const ConsistencySpec::Mode mode = spec.consistency().mode();
  const MetricLabels labels = {{"job", task_.job_id()}};
  Counter* steps_done = nullptr;
  Gauge* loss_gauge = nullptr;
  Gauge* rate_gauge = nullptr;
  if (options_.metrics != nullptr) {
    steps_done =
        options_.metrics->GetCounter("downpour_worker_steps_total", "Training steps run.", labels);
    loss_gauge =
        options_.metrics->GetGauge("downpour_worker_loss", "Latest training loss.", labels);
    rate_gauge = options_.metrics->GetGauge("downpour_worker_examples_per_second",
                                            "Training throughput.", labels);
  }

  Batch batch;
  double window_start = MonotonicSeconds();
  double window_loss = 0, last_loss = 0;
  int64_t window_steps = 0, window_examples = 0;
  for (int64_t step = 0; step < spec.steps(); ++step) {
    if (cancelled_.load() || job_ended_.load()) return absl::CancelledError("job ended");
    const int64_t min_version = mode == ConsistencySpec::SYNC ? step : 0;
    const int64_t min_worker_steps =
        mode == ConsistencySpec::SSP ? std::max<int64_t>(0, step - spec.consistency().staleness())
                                     : 0;
    RETURN_IF_ERROR(PullParameters(model.get(), min_version, min_worker_steps));
    ASSIGN_OR_RETURN(bool have_batch, reader->Next(&batch));
    if (!have_batch) return absl::InternalError("training data ended");
    ASSIGN_OR_RETURN(StepResult result, model->TrainStep(batch.features.data(), batch.labels.data(),
                                                         batch.size, step));
    RETURN_IF_ERROR(PushGradients(*model, step));

    window_loss += result.loss;
    ++window_steps;
    window_examples += batch.size;
    if (steps_done) steps_done->Increment();
    if ((step + 1) % spec.log_every_steps() == 0 || step + 1 == spec.steps()) {
      const double now = MonotonicSeconds();
      ReportProgressRequest progress;
      progress.set_step(step + 1);
      last_loss = window_loss / window_steps;
      progress.set_loss(last_loss);
      progress.set_examples_per_sec(window_examples / std::max(1e-9, now - window_start));
      if (loss_gauge) loss_gauge->Set(progress.loss());
      if (rate_gauge) rate_gauge->Set(progress.examples_per_sec());
      progress.set_finished(step + 1 == spec.steps() && rank != 0);
      Report(progress, /*final=*/progress.finished());
      window_start = now;
      window_loss = 0;
      window_steps = window_examples = 0;
    }
  }
  if (rank != 0) return absl::OkStatus();

  // Rank 0 evaluates the final model: every worker's last update applied.
  RETURN_IF_ERROR(PullParameters(model.get(), mode == ConsistencySpec::SYNC ? spec.steps() : 0,
                                 mode == ConsistencySpec::SYNC ? 0 : spec.steps()));
  ASSIGN_OR_RETURN(double accuracy, EvaluateTestSet(model.get()));
  Log(absl::StrCat("job ", task_.job_id(), ": test accuracy ", accuracy));
  ReportProgressRequest done;
  done.set_step(spec.steps());
  done.set_loss(last_loss);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(accuracy);
  Report(done, /*final=*/true);
  return absl::OkStatus();
}

}  // namespace downpour
