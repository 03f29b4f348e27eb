#include "server/shard_metrics.h"

#include <chrono>

namespace downpour {
namespace {

const char* const kSeries[] = {"downpour_ps_apply_seconds",
                               "downpour_ps_received_bytes_total",
                               "downpour_ps_sent_bytes_total",
                               "downpour_ps_deduplicated_pushes_total",
                               "downpour_shard_sparse_rows_pushed_total",
                               "downpour_shard_sparse_rows_pulled_total"};

// Rows listed in a request's or response's `sparse`.
template <typename Message>
int64_t SparseRowsOf(const Message& message) {
  int64_t rows = 0;
  for (const SparseRows& table : message.sparse()) rows += table.ids_size();
  return rows;
}

}  // namespace

void MeasuredShard::AddJob(const std::string& job_id) {
  const MetricLabels labels = {{"job", job_id}};
  JobMetrics job;
  job.apply = metrics_->GetHistogram(
      kSeries[0],
      "Time the shard took to take one pushed message: decode, exactly-once check, and the "
      "optimizer update (ASYNC/SSP) or the SYNC sum (and the update once the step is complete).",
      labels);
  job.received = metrics_->GetCounter(kSeries[1], "Gradient bytes received in pushes.", labels);
  job.sent = metrics_->GetCounter(kSeries[2], "Parameter bytes sent in answer to pulls.", labels);
  job.deduplicated = metrics_->GetCounter(
      kSeries[3],
      "Pushes received again (a worker's retry) and answered as duplicates, not applied twice.",
      labels);
  job.rows_pushed = metrics_->GetCounter(
      kSeries[4], "Sparse table rows whose gradients applied pushes brought (skipped ones not).",
      labels);
  job.rows_pulled =
      metrics_->GetCounter(kSeries[5], "Sparse table rows sent in answer to pulls.", labels);
  absl::MutexLock lock(&mu_);
  jobs_[job_id] = job;
}

void MeasuredShard::RemoveJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (jobs_.erase(job_id) == 0) return;
  for (const char* name : kSeries) metrics_->RemoveSeries(name, {{"job", job_id}});
}

absl::StatusOr<PushResponse> MeasuredShard::Push(const PushRequest& request,
                                                 const Payload& payload) {
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<PushResponse> response = shard_->Push(request, payload);
  const double took = SecondsSince(started);
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) return response;
  const JobMetrics& job = it->second;
  job.received->Increment(static_cast<double>(payload.size()));
  if (response.ok()) {
    job.apply->Observe(took);
    if (response->duplicate()) job.deduplicated->Increment();
    if (!response->duplicate() && !request.skipped() && request.sparse_size() > 0) {
      job.rows_pushed->Increment(static_cast<double>(SparseRowsOf(request)));
    }
  }
  return response;
}

absl::StatusOr<PullResponse> MeasuredShard::Pull(const PullRequest& request, absl::Time deadline,
                                                 Payload* payload) {
  absl::StatusOr<PullResponse> response = shard_->Pull(request, deadline, payload);
  if (!response.ok()) return response;
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_.find(request.job_id());
  if (it != jobs_.end()) {
    it->second.sent->Increment(static_cast<double>(payload->size()));
    if (response->sparse_size() > 0) {
      it->second.rows_pulled->Increment(static_cast<double>(SparseRowsOf(*response)));
    }
  }
  return response;
}

void AddMemoryBudgetMetrics(const MemoryBudget* budget, MetricsRegistry* metrics) {
  Gauge* used = metrics->GetGauge(
      "downpour_shard_memory_used_bytes",
      "Bytes reserved from the shard's --memory_limit: the hosted partitions and sparse rows.");
  Gauge* limit = metrics->GetGauge(
      "downpour_shard_memory_limit_bytes",
      "The shard's --memory_limit in bytes (0: none), which partitions and sparse rows reserve "
      "from.");
  Counter* refusals = metrics->GetCounter(
      "downpour_shard_memory_refusals_total",
      "Reservations the --memory_limit refused: a sparse row evicted or a request or job "
      "refused for lack of memory.");
  auto collect = [budget, used, limit, refusals] {
    used->Set(static_cast<double>(budget->used()));
    limit->Set(static_cast<double>(budget->limit()));
    refusals->RaiseTo(static_cast<double>(budget->refusals()));
  };
  collect();
  metrics->AddCollector(collect);
}

}  // namespace downpour
