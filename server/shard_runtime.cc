#include "server/shard_runtime.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "spec/shard_map.h"

namespace downpour {

ShardRuntime::ShardRuntime(ParameterStore* store, MetricsRegistry* metrics)
    : store_(store),
      jobs_gauge_(metrics->GetGauge("downpour_ps_jobs", "Jobs hosted on this shard.")),
      bytes_gauge_(metrics->GetGauge("downpour_ps_parameter_bytes",
                                     "Parameter bytes hosted on this shard.")) {}

void ShardRuntime::OnTasks(const std::vector<Task>& tasks) {
  absl::MutexLock lock(&mu_);
  std::set<std::string> current;
  for (const Task& task : tasks) {
    current.insert(task.job_id());
    if (hosted_.count(task.job_id()) || refused_.count(task.job_id())) continue;
    absl::Status added = Host(task);
    if (!added.ok()) {
      // The coordinator validated the spec, so this is a version mismatch or
      // a resource problem; workers get the reason with their next request
      // and fail the job with it.
      Log(absl::StrCat("job ", task.job_id(), ": cannot host: ", added.message()));
      store_->RefuseJob(task.job_id(), added);
      refused_.insert(task.job_id());
    }
  }
  // A job that could not be hosted is forgotten once it ends.
  for (auto it = refused_.begin(); it != refused_.end();) {
    if (current.count(*it)) {
      ++it;
      continue;
    }
    store_->DropJob(*it);
    it = refused_.erase(it);
  }
  for (auto it = hosted_.begin(); it != hosted_.end();) {
    if (current.count(it->first)) {
      ++it;
      continue;
    }
    store_->DropJob(it->first);
    Log(absl::StrCat("job ", it->first, ": ended, partitions dropped"));
    bytes_ -= it->second;
    it = hosted_.erase(it);
  }
  jobs_gauge_->Set(hosted_.size());
  bytes_gauge_->Set(bytes_);
}

std::vector<std::string> ShardRuntime::HostedJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [id, bytes] : hosted_) jobs.push_back(id);
  return jobs;
}

absl::Status ShardRuntime::Host(const Task& task) {
  const int shards = task.placement().shard_nodes_size();
  if (task.rank() < 0 || task.rank() >= shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard index ", task.rank(), " is outside the job's ", shards, " shards"));
  }
  const std::vector<PartitionPlacement> partitions(task.placement().partitions().begin(),
                                                   task.placement().partitions().end());
  absl::Status added = store_->AddJob(task.job_id(), task.spec(), task.rank(), partitions);
  if (!added.ok()) return added;
  const int64_t bytes = BytesPerShard(partitions, shards)[task.rank()];
  hosted_[task.job_id()] = bytes;
  bytes_ += bytes;
  Log(absl::StrCat("job ", task.job_id(), ": hosting shard ", task.rank(), " (", bytes,
                   " parameter bytes)"));
  return absl::OkStatus();
}

}  // namespace downpour
