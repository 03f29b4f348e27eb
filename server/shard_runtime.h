// ShardRuntime: what a downpour-ps process does with the coordinator's task
// list — host the partitions of every job placed on this shard in its
// ParameterStore, refuse (with the reason, which workers then see) a job it
// cannot host, and drop a job's partitions once the job is no longer its
// task. It exports the hosted jobs and bytes as metrics.
//
// Thread-safe (the node agent calls OnTasks from its thread). The store and
// the metrics registry are not owned and must outlive the runtime.
#ifndef DOWNPOUR_SERVER_SHARD_RUNTIME_H_
#define DOWNPOUR_SERVER_SHARD_RUNTIME_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "proto/coordinator.pb.h"
#include "ps/parameter_store.h"

namespace downpour {

class ShardRuntime {
 public:
  ShardRuntime(ParameterStore* store, MetricsRegistry* metrics);

  // Makes the hosted jobs those of `tasks` (every running job this shard
  // takes part in).
  void OnTasks(const std::vector<Task>& tasks);

  // Jobs hosted now, sorted.
  std::vector<std::string> HostedJobs() const;

 private:
  absl::Status Host(const Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterStore* const store_;
  Gauge* const jobs_gauge_;
  Gauge* const bytes_gauge_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> hosted_ ABSL_GUARDED_BY(mu_);  // Job -> parameter bytes.
  std::set<std::string> refused_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SERVER_SHARD_RUNTIME_H_
