#include "coordinator/coordinator_metrics.h"

#include <cmath>
#include <set>

namespace downpour {
namespace {

constexpr JobState kStates[] = {PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED};

bool Ended(JobState state) { return state == SUCCEEDED || state == FAILED || state == STOPPED; }

// The time of the job's last progress as far as its status tells, for a job
// first seen (after a coordinator restart, its steps came earlier).
double FirstProgressSeconds(const JobStatus& job, absl::Time now) {
  if (Ended(job.state()) && job.end_time_ms() > 0) return job.end_time_ms() / 1000.0;
  if (job.step_time_ms() > 0) return job.step_time_ms() / 1000.0;
  if (job.step() == 0 && job.start_time_ms() > 0) return job.start_time_ms() / 1000.0;
  if (job.step() == 0 && job.submit_time_ms() > 0) return job.submit_time_ms() / 1000.0;
  return absl::ToDoubleSeconds(now - absl::UnixEpoch());
}

}  // namespace

void CoordinatorMetrics::Update(const std::vector<NodeInfo>& nodes,
                                const std::vector<JobStatus>& jobs, absl::Time now) {
  int64_t alive_shards = 0, alive_workers = 0;
  for (const NodeInfo& node : nodes) {
    if (!node.alive()) continue;
    (node.role() == SHARD ? alive_shards : alive_workers)++;
  }
  metrics_->GetGauge("downpour_nodes_alive", "Nodes heartbeating.", {{"role", "shard"}})
      ->Set(alive_shards);
  metrics_->GetGauge("downpour_nodes_alive", "Nodes heartbeating.", {{"role", "worker"}})
      ->Set(alive_workers);
  std::map<JobState, int64_t> counts;
  std::set<std::string> listed;
  for (const JobStatus& job : jobs) {
    counts[job.state()]++;
    listed.insert(job.id());
    UpdateJob(job, now);
  }
  for (JobState s : kStates) {
    metrics_->GetGauge("downpour_jobs", "Jobs by state.", {{"state", JobState_Name(s)}})
        ->Set(counts[s]);
  }
  // Jobs gone from the store take their series with them.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (listed.count(it->first)) {
      ++it;
      continue;
    }
    metrics_->RemoveSeries({{"job", it->first}});
    it = jobs_.erase(it);
  }
}

void CoordinatorMetrics::UpdateJob(const JobStatus& job, absl::Time now) {
  const MetricLabels labels = {{"job", job.id()}};
  auto [seen, first] = jobs_.try_emplace(job.id());
  if (first) {
    seen->second.step = job.step();
    seen->second.progress_seconds = FirstProgressSeconds(job, now);
  } else if (job.step() != seen->second.step) {
    seen->second.step = job.step();
    seen->second.progress_seconds = job.step_time_ms() > 0
                                        ? job.step_time_ms() / 1000.0
                                        : absl::ToDoubleSeconds(now - absl::UnixEpoch());
  }
  for (JobState s : kStates) {
    MetricLabels state = labels;
    state["state"] = JobState_Name(s);
    metrics_
        ->GetGauge("downpour_job_state", "1 for the job's current state, 0 for the others.", state)
        ->Set(job.state() == s ? 1 : 0);
  }
  metrics_->GetGauge("downpour_job_step", "The job's step: its slowest worker's.", labels)
      ->Set(job.step());
  metrics_
      ->GetGauge("downpour_job_last_progress_timestamp_seconds",
                 "When the job's step last changed, in seconds since the Unix epoch.", labels)
      ->Set(seen->second.progress_seconds);
  metrics_
      ->GetGauge("downpour_job_checkpoint_failures",
                 "Checkpoints of the job given up so far: a shard could not write its file, the "
                 "manifest could not be written, or one never completed (a full or lost disk).",
                 labels)
      ->Set(job.checkpoint_failures());
  metrics_
      ->GetGauge("downpour_job_final_checkpoint_missing",
                 "1 for a SUCCEEDED job whose final state was not saved (export then refuses "
                 "and names the older checkpoints).",
                 labels)
      ->Set(job.state() == SUCCEEDED && !job.final_checkpoint_missing().empty() ? 1 : 0);
  metrics_
      ->GetGauge("downpour_job_examples_per_second",
                 "The job's training throughput: the sum over its workers.", labels)
      ->Set(job.examples_per_sec());
  // A loss and an accuracy once there is one (no series before: a 0 would
  // read as a perfect loss, a -1 as an accuracy).
  bool reported = job.step() > 0;
  for (const WorkerProgress& w : job.workers()) reported = reported || w.step() > 0;
  if (reported) {
    metrics_
        ->GetGauge("downpour_job_loss", "Mean of the job's workers' latest training losses.",
                   labels)
        ->Set(job.loss());
  }
  const double accuracy = job.test_accuracy() >= 0     ? job.test_accuracy()
                          : job.evaluations_size() > 0 ? job.evaluations().rbegin()->accuracy()
                                                       : -1;
  if (accuracy >= 0) {
    metrics_
        ->GetGauge("downpour_job_test_accuracy",
                   "The job's test-set accuracy: the final evaluation, or the latest before it.",
                   labels)
        ->Set(accuracy);
  }
  // Only for jobs whose metrics ask for them, and only once known: a restart
  // clears them, and a NaN (a test set of one class) is no AUC.
  const auto known = [](bool has, double value) { return has && std::isfinite(value); };
  if (known(job.has_test_auc(), job.test_auc())) {
    metrics_
        ->GetGauge("downpour_job_test_auc",
                   "The job's test-set AUC (JobSpec.metrics AUC): the final evaluation, or the "
                   "latest before it.",
                   labels)
        ->Set(job.test_auc());
  } else {
    metrics_->RemoveSeries("downpour_job_test_auc", labels);
  }
  if (known(job.has_test_log_loss(), job.test_log_loss())) {
    metrics_
        ->GetGauge("downpour_job_test_log_loss",
                   "The job's test-set log loss (JobSpec.metrics LOG_LOSS): the final "
                   "evaluation, or the latest before it.",
                   labels)
        ->Set(job.test_log_loss());
  } else {
    metrics_->RemoveSeries("downpour_job_test_log_loss", labels);
  }
}

}  // namespace downpour
