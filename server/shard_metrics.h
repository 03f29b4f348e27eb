// MeasuredShard: the ParameterShard a shard's gRPC service serves, in front
// of its store: it passes every request on and measures those of the jobs
// the shard hosts, per job:
//
//   downpour_ps_apply_seconds{job}               histogram, one per push
//                                                message (decode, dedup,
//                                                optimizer or SYNC sum)
//   downpour_ps_received_bytes_total{job}        gradient bytes pushed
//   downpour_ps_sent_bytes_total{job}            parameter bytes pulled
//   downpour_ps_deduplicated_pushes_total{job}   retried pushes answered as
//                                                duplicates (applied before)
//   downpour_shard_sparse_rows_pushed_total{job} sparse table rows whose
//                                                gradients pushes brought
//                                                (applied pushes, not
//                                                skipped ones)
//   downpour_shard_sparse_rows_pulled_total{job} sparse table rows pulls
//                                                were answered with
//
// Only jobs between AddJob and RemoveJob are measured, so a request that
// comes for a job after it was dropped leaves no series behind.
//
// The shard's other sparse and memory metrics:
//
//   downpour_shard_sparse_rows{job,table}        gauge: rows the table holds
//                                                on this shard
//   downpour_shard_sparse_evictions_total{job,table}  rows evicted (max_rows
//                                                or the memory limit)
//     (both exported by ShardRuntime with each task list, as
//     downpour_ps_memory_bytes{job}, and removed with the job)
//   downpour_shard_memory_used_bytes             gauge: bytes reserved from
//                                                the --memory_limit budget
//                                                (partitions and rows)
//   downpour_shard_memory_limit_bytes            gauge: --memory_limit (0:
//                                                none; the process's cgroup
//                                                limit is
//                                                downpour_ps_memory_limit_bytes)
//   downpour_shard_memory_refusals_total         reservations the budget
//                                                refused (a row evicted or
//                                                a request failed for it)
//     (AddMemoryBudgetMetrics: read at every scrape)
//
// Thread-safe (the store is). Neither the store nor the registry is owned;
// both must outlive this.
#ifndef DOWNPOUR_SERVER_SHARD_METRICS_H_
#define DOWNPOUR_SERVER_SHARD_METRICS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "ps/memory_budget.h"
#include "ps/parameter_shard.h"

namespace downpour {

class MeasuredShard final : public ParameterShard {
 public:
  MeasuredShard(ParameterShard* shard, MetricsRegistry* metrics)
      : shard_(shard), metrics_(metrics) {}

  // Requests of `job_id` are measured from now on.
  void AddJob(const std::string& job_id);
  // No longer, and the job's series above go.
  void RemoveJob(const std::string& job_id);

  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override;
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override;
  // PushPull: the default, through Push and Pull above.

 private:
  struct JobMetrics {
    Histogram* apply;
    Counter* received;
    Counter* sent;
    Counter* deduplicated;
    Counter* rows_pushed;
    Counter* rows_pulled;
  };

  ParameterShard* const shard_;
  MetricsRegistry* const metrics_;
  // Read-locked while a request's numbers are recorded, so RemoveJob never
  // removes a series being updated.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobMetrics> jobs_ ABSL_GUARDED_BY(mu_);
};

// Exports `budget`'s used bytes, limit and refusals (the downpour_shard_memory_*
// series above), read at every scrape. `budget` must outlive the registry's
// last exposition.
void AddMemoryBudgetMetrics(const MemoryBudget* budget, MetricsRegistry* metrics);

}  // namespace downpour

#endif  // DOWNPOUR_SERVER_SHARD_METRICS_H_
