// What a worker measures, beside its trainers' own progress:
//
// MeasuredShardClient: a job's client of one shard (its ParameterShard), in
// front of the RemoteParameterShard, recording per job and shard index:
//
//   downpour_worker_push_seconds{job,shard}       histogram: a push message's
//                                                 round trip until the shard
//                                                 acknowledged it
//   downpour_worker_pull_seconds{job,shard}       histogram: a pull's round
//                                                 trip until the parameters
//                                                 arrived (a SYNC pull waits
//                                                 for the step's last worker)
//   downpour_worker_pushed_bytes_total{job,shard} gradient bytes sent (every
//                                                 attempt)
//   downpour_worker_pulled_bytes_total{job,shard} parameter bytes received
//   downpour_worker_rpc_retries_total{job,shard}  calls repeating one that
//                                                 failed: a push re-sent
//                                                 under its request id, a
//                                                 pull asked again after the
//                                                 shard was unreachable or did
//                                                 not host the job
//
// A PushPull (push and pull in one round trip) counts in both histograms
// with its round trip; only calls that succeeded are timed (a failed one
// shows in the retries).
//
// TrainerMetrics: the series a JobTrainer records (worker/trainer.cc).
// FailureReason: the `reason` of downpour_worker_failures_total.
// AddGpuMemoryMetrics: downpour_worker_gpu_memory_used_bytes{device} and
// downpour_worker_gpu_memory_total_bytes{device}.
//
// Thread-safe. Registries are not owned and must outlive what records into
// them; a MeasuredShardClient owns the client it wraps.
#ifndef DOWNPOUR_WORKER_WORKER_METRICS_H_
#define DOWNPOUR_WORKER_WORKER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "ps/parameter_shard.h"

namespace downpour {

class MeasuredShardClient final : public ParameterShard {
 public:
  // `shard` serves shard index `shard_index` of job `job_id`.
  MeasuredShardClient(std::unique_ptr<ParameterShard> shard, MetricsRegistry* metrics,
                      const std::string& job_id, int shard_index);

  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override;
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override;
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload) override;
  void CancelCalls() override { shard_->CancelCalls(); }

 private:
  // What identifies a pull among those of one step: its first partition and
  // the condition it waits for.
  using PullKey = std::tuple<int32_t, int32_t, int64_t, int64_t>;
  static PullKey KeyOf(const PullRequest& request);
  // Counts a retry when this call repeats one that failed.
  void BeforePush(const PushRequest& request);
  void BeforePull(const PullRequest& request);
  // Remembers a failed call, whose repetition is a retry.
  void PushFailed(const PushRequest& request);
  void PullFailed(const PullRequest& request, const absl::Status& status);

  const std::unique_ptr<ParameterShard> shard_;
  Histogram* const push_seconds_;
  Histogram* const pull_seconds_;
  Counter* const pushed_bytes_;
  Counter* const pulled_bytes_;
  Counter* const retries_;
  // Entries in the two sets below: while 0, calls take no lock.
  std::atomic<int> remembered_{0};
  absl::Mutex mu_;
  absl::flat_hash_set<int64_t> failed_pushes_ ABSL_GUARDED_BY(mu_);  // Sequences.
  absl::flat_hash_set<PullKey> failed_pulls_ ABSL_GUARDED_BY(mu_);
};

// A trainer's series of job `job_id` (all null without a registry):
// downpour_worker_{step,compute,exchange,input_wait}_seconds{job}
// (histograms, one observation per step), downpour_worker_steps_total,
// downpour_worker_examples_total, downpour_worker_loss,
// downpour_worker_examples_per_second and, for the rank that evaluates,
// downpour_worker_test_accuracy.
struct TrainerMetrics {
  Histogram* step_seconds = nullptr;
  Histogram* compute_seconds = nullptr;
  Histogram* exchange_seconds = nullptr;
  Histogram* input_wait_seconds = nullptr;
  Counter* steps = nullptr;
  Counter* examples = nullptr;
  Gauge* loss = nullptr;
  Gauge* examples_per_second = nullptr;
  Gauge* test_accuracy = nullptr;
  Gauge* exchange_window = nullptr;

  // The gauges carry the rank too: a worker may train two ranks of a job
  // (the histograms and counters add both up).
  static TrainerMetrics Create(MetricsRegistry* metrics, const std::string& job_id, int rank,
                               bool evaluates);
};

// Why a job's run failed on this worker, for downpour_worker_failures_total
// {reason}: "diverged", or the status code in lower snake case
// ("unavailable", "deadline_exceeded", "resource_exhausted", "data_loss").
std::string FailureReason(const absl::Status& status, bool diverged);

// Counts one failed run (`reason` as FailureReason says).
void CountFailure(MetricsRegistry* metrics, const std::string& reason);

// Exports the memory of each CUDA device in `devices` (device numbers) under
// its name in `names` (as downpour_worker_devices names it), read with
// `read` (used and total bytes of a device; model/devices.h's
// GpuMemoryUsedAndTotal) at every scrape; a failed read keeps the last
// values. Nothing when `devices` is empty (a CPU worker).
// REQUIRES: names.size() == devices.size().
using GpuMemoryReader = std::function<absl::StatusOr<std::pair<int64_t, int64_t>>(int device)>;
void AddGpuMemoryMetrics(MetricsRegistry* metrics, const std::vector<int>& devices,
                         const std::vector<std::string>& names, GpuMemoryReader read);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_WORKER_METRICS_H_
