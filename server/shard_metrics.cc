#include "server/shard_metrics.h"

#include <chrono>

namespace downpour {
namespace {

const char* const kSeries[] = {"downpour_ps_apply_seconds", "downpour_ps_received_bytes_total",
                               "downpour_ps_sent_bytes_total",
                               "downpour_ps_deduplicated_pushes_total"};

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
  }
  return response;
}

absl::StatusOr<PullResponse> MeasuredShard::Pull(const PullRequest& request, absl::Time deadline,
                                                 Payload* payload) {
  absl::StatusOr<PullResponse> response = shard_->Pull(request, deadline, payload);
  if (!response.ok()) return response;
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_.find(request.job_id());
  if (it != jobs_.end()) it->second.sent->Increment(static_cast<double>(payload->size()));
  return response;
}

}  // namespace downpour
