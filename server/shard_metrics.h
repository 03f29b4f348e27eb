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
//
// Only jobs between AddJob and RemoveJob are measured, so a request that
// comes for a job after it was dropped leaves no series behind.
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
  };

  ParameterShard* const shard_;
  MetricsRegistry* const metrics_;
  // Read-locked while a request's numbers are recorded, so RemoveJob never
  // removes a series being updated.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobMetrics> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_SERVER_SHARD_METRICS_H_
