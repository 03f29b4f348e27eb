// ShardRuntime: what a downpour-ps process does with the coordinator's task
// list — host the partitions of every job placed on this shard in its
// ParameterStore (from the checkpoint the task names, when the job resumes
// one), refuse (with the reason, which workers then see) a job it cannot
// host, and drop a job's partitions once the job is no longer its task. With
// a CheckpointWriter it writes the snapshots the store captures and reports
// them with every heartbeat. It exports the hosted jobs and bytes as
// metrics, each job's memory (downpour_ps_memory_bytes{job}) and sparse
// tables (downpour_shard_sparse_rows and _evictions_total{job,table}), and
// through serving() the traffic of each job (server/shard_metrics.h).
//
// Thread-safe (the node agent calls OnTasks and AddToHeartbeat from its
// thread). The store, the writer and the metrics registry are not owned and
// must outlive the runtime.
#ifndef DOWNPOUR_SERVER_SHARD_RUNTIME_H_
#define DOWNPOUR_SERVER_SHARD_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "proto/coordinator.pb.h"
#include "ps/checkpoint.h"
#include "ps/parameter_store.h"
#include "server/shard_metrics.h"

namespace downpour {

class ShardRuntime {
 public:
  // Runs `free_memory`, which drops jobs, and hands what it freed back to
  // the kernel (common/platform/malloc_tuning.h's ReleaseMemoryFreedBy in
  // the daemon).
  using MemoryReleaser = std::function<void(const std::function<void()>& free_memory)>;

  // `writer` may be null: no checkpoints on this shard. A task list that
  // drops a job is applied through `release_memory` (if set), so that a
  // long-lived shard does not keep each job's peak.
  ShardRuntime(ParameterStore* store, CheckpointWriter* writer, MetricsRegistry* metrics,
               MemoryReleaser release_memory = nullptr);

  // What the coordinator hears from this shard: each hosted job's steps by
  // worker rank, and the checkpoint files written for running jobs.
  void AddToHeartbeat(HeartbeatRequest* request);

  // Makes the hosted jobs those of `tasks` (every running job this shard
  // takes part in).
  void OnTasks(const std::vector<Task>& tasks);

  // Whether node `peer` is worker rank `rank` of job `job_id` as the
  // coordinator last placed it (PermissionDenied if not;
  // ParameterStore::CheckWorkerNode). A job this shard does not host is left
  // to the store, which answers that it is not hosted here (or why not).
  absl::Status AuthorizeWorker(const std::string& peer, const std::string& job_id, int rank) const;

  // Jobs hosted now, sorted.
  std::vector<std::string> HostedJobs() const;

  // What the shard's gRPC service serves: the store, with each hosted job's
  // requests measured.
  ParameterShard* serving() { return &measured_; }

 private:
  // OnTasks' work, under the lock.
  void HostTasks(const std::vector<Task>& tasks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `tasks` end (or start again) a job hosted or refused here.
  bool DropsAJob(const std::vector<Task>& tasks) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hosts the task's job, and tells the store who holds each rank.
  absl::Status Host(const Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the store who holds each rank of the task's job and, unless it is
  // `hosting` the job now, which ranks are absent.
  void SetWorkers(const Task& task, bool hosting);
  // Reads this shard's file of the task's checkpoint.
  absl::StatusOr<ShardSnapshot> ReadRestore(const Task& task) const;
  void Drop(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterStore* const store_;
  CheckpointWriter* const writer_;
  MetricsRegistry* const metrics_;
  const MemoryReleaser release_memory_;
  MeasuredShard measured_;
  Gauge* const jobs_gauge_;
  Gauge* const bytes_gauge_;
  mutable absl::Mutex mu_;
  struct Hosted {
    int64_t bytes = 0;    // Parameter bytes.
    int64_t attempt = 0;  // Task::attempt: a later start is hosted afresh.
    // Late pushes by rank as last exported (downpour_ps_late_pushes_total).
    std::vector<int64_t> late_pushes;
    // Evictions by sparse table as last exported
    // (downpour_shard_sparse_evictions_total).
    std::vector<int64_t> evictions;
  };
  // Brings the job's memory gauge, late-push counters and sparse table
  // series up to the store's.
  void ExportJob(const std::string& job_id, Hosted* hosted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings the job's late-push counters up to the store's counts.
  void ExportLatePushes(const std::string& job_id, Hosted* hosted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, Hosted> hosted_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> refused_ ABSL_GUARDED_BY(mu_);  // Job -> attempt.
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SERVER_SHARD_RUNTIME_H_
