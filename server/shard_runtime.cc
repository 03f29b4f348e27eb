#include "server/shard_runtime.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "spec/shard_map.h"

namespace downpour {

ShardRuntime::ShardRuntime(ParameterStore* store, CheckpointWriter* writer,
                           MetricsRegistry* metrics, MemoryReleaser release_memory)
    : store_(store),
      writer_(writer),
      metrics_(metrics),
      release_memory_(std::move(release_memory)),
      measured_(store, metrics),
      jobs_gauge_(metrics->GetGauge("downpour_ps_jobs", "Jobs hosted on this shard.")),
      bytes_gauge_(metrics->GetGauge("downpour_ps_parameter_bytes",
                                     "Parameter bytes hosted on this shard.")) {}

absl::Status ShardRuntime::AuthorizeWorker(const std::string& peer, const std::string& job_id,
                                           int rank) const {
  return store_->CheckWorkerNode(job_id, rank, peer);
}

void ShardRuntime::OnTasks(const std::vector<Task>& tasks) {
  auto host = [this, &tasks] {
    absl::MutexLock lock(&mu_);
    HostTasks(tasks);
  };
  bool drops = false;
  if (release_memory_) {
    absl::MutexLock lock(&mu_);
    drops = DropsAJob(tasks);
  }
  // A dropped job's partitions are freed as it is dropped (unless a request
  // still holds them).
  if (drops) {
    release_memory_(host);
  } else {
    host();
  }
}

bool ShardRuntime::DropsAJob(const std::vector<Task>& tasks) const {
  std::map<std::string, int64_t> current;  // Job -> attempt.
  for (const Task& task : tasks) current[task.job_id()] = task.attempt();
  auto gone = [&current](const std::string& job_id, int64_t attempt) {
    auto task = current.find(job_id);
    return task == current.end() || task->second != attempt;
  };
  for (const auto& [job_id, hosted] : hosted_) {
    if (gone(job_id, hosted.attempt)) return true;
  }
  for (const auto& [job_id, attempt] : refused_) {
    if (gone(job_id, attempt)) return true;
  }
  return false;
}

void ShardRuntime::HostTasks(const std::vector<Task>& tasks) {
  std::map<std::string, int64_t> current;  // Job -> attempt.
  for (const Task& task : tasks) current[task.job_id()] = task.attempt();
  // Jobs that ended here, or started again (resumed, recovered: hosted
  // afresh below), are dropped first.
  for (auto it = refused_.begin(); it != refused_.end();) {
    auto task = current.find(it->first);
    if (task != current.end() && task->second == it->second) {
      ++it;
      continue;
    }
    Drop(it->first);
    it = refused_.erase(it);
  }
  for (auto it = hosted_.begin(); it != hosted_.end();) {
    auto task = current.find(it->first);
    if (task != current.end() && task->second == it->second.attempt) {
      ++it;
      continue;
    }
    Drop(it->first);
    Log(absl::StrCat("job ", it->first, task == current.end() ? ": ended" : ": started again",
                     ", partitions dropped"));
    bytes_ -= it->second.bytes;
    it = hosted_.erase(it);
  }
  for (const Task& task : tasks) {
    if (auto it = hosted_.find(task.job_id()); it != hosted_.end()) {
      SetWorkers(task, /*hosting=*/false);
      ExportJob(task.job_id(), &it->second);
      continue;
    }
    if (refused_.count(task.job_id())) continue;
    absl::Status added = Host(task);
    if (!added.ok()) {
      // The coordinator validated the spec, so this is a version mismatch, a
      // resource problem or an unreadable checkpoint; workers get the reason
      // with their next request and fail the job with it.
      Log(absl::StrCat("job ", task.job_id(), ": cannot host: ", added.message()));
      store_->RefuseJob(task.job_id(), added);
      refused_[task.job_id()] = task.attempt();
    }
  }
  jobs_gauge_->Set(hosted_.size());
  bytes_gauge_->Set(bytes_);
}

void ShardRuntime::ExportJob(const std::string& job_id, Hosted* hosted) {
  metrics_
      ->GetGauge("downpour_ps_memory_bytes",
                 "Memory the job holds on this shard: its partitions' values, optimizer slots, "
                 "checkpoint copies and SYNC sums, and its sparse tables' rows.",
                 {{"job", job_id}})
      ->Set(static_cast<double>(store_->MemoryBytes(job_id)));
  ExportLatePushes(job_id, hosted);
  const std::vector<SparseTableStats> tables = store_->SparseTables(job_id);
  hosted->evictions.resize(tables.size(), 0);
  for (size_t t = 0; t < tables.size(); ++t) {
    const MetricLabels labels = {{"job", job_id}, {"table", tables[t].name}};
    metrics_
        ->GetGauge("downpour_shard_sparse_rows",
                   "Rows the sparse table holds on this shard (created on first touch).", labels)
        ->Set(static_cast<double>(tables[t].rows));
    Counter* evictions = metrics_->GetCounter(
        "downpour_shard_sparse_evictions_total",
        "Rows of the sparse table evicted on this shard, past its share of max_rows or the "
        "shard's --memory_limit (recreated afresh on their next touch).",
        labels);
    evictions->Increment(static_cast<double>(tables[t].evictions - hosted->evictions[t]));
    hosted->evictions[t] = tables[t].evictions;
  }
}

void ShardRuntime::ExportLatePushes(const std::string& job_id, Hosted* hosted) {
  const std::vector<int64_t> counts = store_->LatePushes(job_id);
  hosted->late_pushes.resize(counts.size(), 0);
  for (size_t rank = 0; rank < counts.size(); ++rank) {
    if (counts[rank] == hosted->late_pushes[rank]) continue;
    metrics_
        ->GetCounter("downpour_ps_late_pushes_total",
                     "SYNC pushes that came after their step had completed without them: the "
                     "rank is a straggler the backup workers replaced.",
                     {{"job", job_id}, {"rank", absl::StrCat(rank)}})
        ->Increment(counts[rank] - hosted->late_pushes[rank]);
    hosted->late_pushes[rank] = counts[rank];
  }
}

void ShardRuntime::Drop(const std::string& job_id) {
  store_->DropJob(job_id);
  measured_.RemoveJob(job_id);
  metrics_->RemoveSeries("downpour_ps_late_pushes_total", {{"job", job_id}});
  metrics_->RemoveSeries("downpour_ps_memory_bytes", {{"job", job_id}});
  metrics_->RemoveSeries("downpour_shard_sparse_rows", {{"job", job_id}});
  metrics_->RemoveSeries("downpour_shard_sparse_evictions_total", {{"job", job_id}});
  if (writer_ != nullptr) writer_->ForgetJob(job_id);
}

void ShardRuntime::AddToHeartbeat(HeartbeatRequest* request) {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [job_id, hosted] : hosted_) {
      ShardJobSteps* steps = request->add_job_steps();
      steps->set_job_id(job_id);
      steps->set_attempt(hosted.attempt);
      const std::vector<int64_t> pushed = store_->WorkerSteps(job_id);
      steps->mutable_worker_steps()->Assign(pushed.begin(), pushed.end());
    }
  }
  if (writer_ == nullptr) return;
  for (CheckpointPart& part : writer_->Parts()) *request->add_checkpoints() = std::move(part);
}

absl::StatusOr<ShardSnapshot> ShardRuntime::ReadRestore(const Task& task) const {
  const CheckpointRestore& restore = task.restore();
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job resumes from its checkpoint at step ", restore.step(),
                     " but this shard has no --checkpoint_root to read it from"));
  }
  const CheckpointFile* file = nullptr;
  for (const CheckpointFile& f : restore.files()) {
    if (f.shard() == task.rank()) file = &f;
  }
  if (file == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint at step ", restore.step(),
                                                      " has no file for shard ", task.rank()));
  }
  return ReadShardSnapshot(absl::StrCat(writer_->root(), "/", restore.dir(), "/", file->name()),
                           *file);
}

std::vector<std::string> ShardRuntime::HostedJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [id, hosted] : hosted_) jobs.push_back(id);
  return jobs;
}

void ShardRuntime::SetWorkers(const Task& task, bool hosting) {
  // Hosting, the absent ranks wait for the next task list: the task that
  // hosts a job may be older than a taker the coordinator placed a moment
  // later, and steps completed without the rank meanwhile would have
  // skipped its batch (a rank absent for good waits a heartbeat longer).
  std::vector<int> absent;
  if (!hosting) absent.assign(task.absent_ranks().begin(), task.absent_ranks().end());
  store_->SetWorkers(
      task.job_id(), absent,
      {task.placement().worker_nodes().begin(), task.placement().worker_nodes().end()});
}

absl::Status ShardRuntime::Host(const Task& task) {
  const int shards = task.placement().shard_nodes_size();
  if (task.rank() < 0 || task.rank() >= shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard index ", task.rank(), " is outside the job's ", shards, " shards"));
  }
  const std::vector<PartitionPlacement> partitions(task.placement().partitions().begin(),
                                                   task.placement().partitions().end());
  // A restored job is hosted once restored: no worker pulls the fresh
  // values, or pushes onto them, meanwhile.
  std::optional<ShardSnapshot> restore;
  if (task.has_restore()) {
    absl::StatusOr<ShardSnapshot> read = ReadRestore(task);
    if (!read.ok()) return read.status();
    restore = *std::move(read);
  }
  RETURN_IF_ERROR(store_->AddJob(task.job_id(), task.spec(), task.rank(), partitions,
                                 task.attempt(), restore ? &*restore : nullptr));
  if (restore) {
    Log(absl::StrCat("job ", task.job_id(), ": restored shard ", task.rank(),
                     " from the checkpoint at step ", task.restore().step(), " (",
                     task.restore().dir(), ")"));
  }
  SetWorkers(task, /*hosting=*/true);
  const int64_t bytes = BytesPerShard(partitions, shards)[task.rank()];
  Hosted& hosted = hosted_[task.job_id()] = Hosted{bytes, task.attempt()};
  measured_.AddJob(task.job_id());
  ExportJob(task.job_id(), &hosted);
  bytes_ += bytes;
  Log(absl::StrCat("job ", task.job_id(), ": hosting shard ", task.rank(), " (", bytes,
                   " parameter bytes)"));
  return absl::OkStatus();
}

}  // namespace downpour
