#include "worker/worker_metrics.h"

#include <cctype>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace downpour {

MeasuredShardClient::MeasuredShardClient(std::unique_ptr<ParameterShard> shard,
                                         MetricsRegistry* metrics, const std::string& job_id,
                                         int shard_index)
    : shard_(std::move(shard)),
      push_seconds_(metrics->GetHistogram(
          "downpour_worker_push_seconds",
          "Round trip of a push message to a shard, until the shard acknowledged it (a combined "
          "push and pull counts here and in downpour_worker_pull_seconds).",
          {{"job", job_id}, {"shard", absl::StrCat(shard_index)}})),
      pull_seconds_(metrics->GetHistogram(
          "downpour_worker_pull_seconds",
          "Round trip of a pull message to a shard, until the parameters arrived (SYNC: "
          "including the wait for the step's last worker).",
          {{"job", job_id}, {"shard", absl::StrCat(shard_index)}})),
      pushed_bytes_(metrics->GetCounter("downpour_worker_pushed_bytes_total",
                                        "Gradient bytes sent to a shard, every attempt counted.",
                                        {{"job", job_id}, {"shard", absl::StrCat(shard_index)}})),
      pulled_bytes_(metrics->GetCounter("downpour_worker_pulled_bytes_total",
                                        "Parameter bytes received from a shard.",
                                        {{"job", job_id}, {"shard", absl::StrCat(shard_index)}})),
      retries_(metrics->GetCounter(
          "downpour_worker_rpc_retries_total",
          "Calls to a shard repeating one that failed: a push re-sent under its request id, a "
          "pull asked again after the shard was unreachable or did not host the job.",
          {{"job", job_id}, {"shard", absl::StrCat(shard_index)}})) {}

MeasuredShardClient::PullKey MeasuredShardClient::KeyOf(const PullRequest& request) {
  const bool any = request.keys_size() > 0;
  return PullKey(any ? request.keys(0).tensor_id() : -1, any ? request.keys(0).partition() : -1,
                 request.min_version(), request.min_worker_steps());
}

void MeasuredShardClient::BeforePush(const PushRequest& request) {
  // Nothing failed (the usual case): no lock on the exchange's hot path.
  if (remembered_.load(std::memory_order_acquire) == 0) return;
  absl::MutexLock lock(&mu_);
  if (failed_pushes_.erase(request.request_id().sequence()) > 0) {
    remembered_.fetch_sub(1, std::memory_order_release);
    retries_->Increment();
  }
}

void MeasuredShardClient::BeforePull(const PullRequest& request) {
  if (remembered_.load(std::memory_order_acquire) == 0) return;
  absl::MutexLock lock(&mu_);
  if (failed_pulls_.erase(KeyOf(request)) > 0) {
    remembered_.fetch_sub(1, std::memory_order_release);
    retries_->Increment();
  }
}

void MeasuredShardClient::PushFailed(const PushRequest& request) {
  absl::MutexLock lock(&mu_);
  if (failed_pushes_.insert(request.request_id().sequence()).second) {
    remembered_.fetch_add(1, std::memory_order_release);
  }
}

void MeasuredShardClient::PullFailed(const PullRequest& request, const absl::Status& status) {
  // A pull that waited its slice out (SYNC, SSP: other workers are behind)
  // is reissued by design, not retried.
  if (absl::IsDeadlineExceeded(status)) return;
  absl::MutexLock lock(&mu_);
  if (failed_pulls_.insert(KeyOf(request)).second) {
    remembered_.fetch_add(1, std::memory_order_release);
  }
}

absl::StatusOr<PushResponse> MeasuredShardClient::Push(const PushRequest& request,
                                                       const Payload& payload) {
  BeforePush(request);
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<PushResponse> response = shard_->Push(request, payload);
  pushed_bytes_->Increment(static_cast<double>(payload.size()));
  if (response.ok()) {
    push_seconds_->Observe(SecondsSince(started));
  } else {
    PushFailed(request);
  }
  return response;
}

absl::StatusOr<PullResponse> MeasuredShardClient::Pull(const PullRequest& request,
                                                       absl::Time deadline, Payload* payload) {
  BeforePull(request);
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<PullResponse> response = shard_->Pull(request, deadline, payload);
  if (response.ok()) {
    pull_seconds_->Observe(SecondsSince(started));
    pulled_bytes_->Increment(static_cast<double>(payload->size()));
  } else {
    PullFailed(request, response.status());
  }
  return response;
}

absl::StatusOr<PushPullResponse> MeasuredShardClient::PushPull(const PushRequest& push,
                                                               const Payload& push_payload,
                                                               const PullRequest& pull,
                                                               absl::Time deadline,
                                                               Payload* pull_payload) {
  BeforePush(push);
  BeforePull(pull);
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<PushPullResponse> response =
      shard_->PushPull(push, push_payload, pull, deadline, pull_payload);
  pushed_bytes_->Increment(static_cast<double>(push_payload.size()));
  if (response.ok()) {
    const double took = SecondsSince(started);
    push_seconds_->Observe(took);
    pull_seconds_->Observe(took);
    pulled_bytes_->Increment(static_cast<double>(pull_payload->size()));
  } else {
    // Whether the push was applied is unknown: re-sending it is a retry.
    PushFailed(push);
    PullFailed(pull, response.status());
  }
  return response;
}

TrainerMetrics TrainerMetrics::Create(MetricsRegistry* metrics, const std::string& job_id, int rank,
                                      bool evaluates) {
  TrainerMetrics m;
  if (metrics == nullptr) return m;
  const MetricLabels labels = {{"job", job_id}};
  const MetricLabels rank_labels = {{"job", job_id}, {"rank", absl::StrCat(rank)}};
  m.step_seconds = metrics->GetHistogram(
      "downpour_worker_step_seconds",
      "Time of a training step: input wait, compute and exchange, and the rest (checkpoint "
      "state, progress reports).",
      labels);
  m.compute_seconds = metrics->GetHistogram(
      "downpour_worker_compute_seconds",
      "Time a training step spent computing forward and backward (to the gradients on the "
      "host), less the exchange it waited for meanwhile.",
      labels);
  m.exchange_seconds = metrics->GetHistogram(
      "downpour_worker_exchange_seconds",
      "Time a training step spent waiting for its push and pull (what the overlap with "
      "backward did not hide).",
      labels);
  m.input_wait_seconds = metrics->GetHistogram(
      "downpour_worker_input_wait_seconds",
      "Time a training step waited for its input batch (input-starved when a large share of "
      "the step).",
      labels);
  m.steps = metrics->GetCounter("downpour_worker_steps_total", "Training steps run.", labels);
  m.examples = metrics->GetCounter("downpour_worker_examples_total",
                                   "Training examples this worker computed on.", labels);
  m.loss = metrics->GetGauge("downpour_worker_loss", "Latest training loss.", rank_labels);
  m.examples_per_second =
      metrics->GetGauge("downpour_worker_examples_per_second", "Training throughput.", rank_labels);
  m.exchange_window = metrics->GetGauge(
      "downpour_worker_exchange_window",
      "Push/pull messages the exchange keeps in flight (chosen from step times unless "
      "--max_inflight fixes it).",
      rank_labels);
  if (evaluates) {
    m.test_accuracy = metrics->GetGauge("downpour_worker_test_accuracy",
                                        "Latest test-set accuracy (rank 0).", labels);
  }
  return m;
}

std::string FailureReason(const absl::Status& status, bool diverged) {
  if (diverged) return "diverged";
  // absl's name ("DEADLINE_EXCEEDED") in lower case.
  std::string reason = absl::StatusCodeToString(status.code());
  for (char& c : reason) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return reason;
}

void CountFailure(MetricsRegistry* metrics, const std::string& reason) {
  if (metrics == nullptr) return;
  metrics
      ->GetCounter("downpour_worker_failures_total",
                   "Job runs that failed on this worker, by reason: diverged, or the error's "
                   "status code (unavailable: a shard unreachable; resource_exhausted: out of "
                   "memory; data_loss: a corrupt record file).",
                   {{"reason", reason}})
      ->Increment();
}

void AddGpuMemoryMetrics(MetricsRegistry* metrics, const std::vector<int>& devices,
                         const std::vector<std::string>& names, GpuMemoryReader read) {
  for (size_t i = 0; i < devices.size(); ++i) {
    Gauge* used = metrics->GetGauge("downpour_worker_gpu_memory_used_bytes",
                                    "Memory in use on the GPU, by every process (as the driver "
                                    "counts it: total less free).",
                                    {{"device", names[i]}});
    Gauge* total = metrics->GetGauge("downpour_worker_gpu_memory_total_bytes", "Memory of the GPU.",
                                     {{"device", names[i]}});
    auto collect = [device = devices[i], used, total, read] {
      absl::StatusOr<std::pair<int64_t, int64_t>> memory = read(device);
      if (!memory.ok()) return;
      used->Set(static_cast<double>(memory->first));
      total->Set(static_cast<double>(memory->second));
    };
    collect();
    metrics->AddCollector(collect);
  }
}

}  // namespace downpour
