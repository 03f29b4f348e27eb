// ParameterExchange: the worker side of one training step's traffic with the
// parameter shards of a job — pushing gradient partitions and pulling the
// parameters back — shared by JobTrainer and the transport benchmark, so the
// benchmark measures exactly what training does.
//
// Thread-compatible: one exchange belongs to one trainer; Push and Pull are
// not called concurrently with each other. The shards are not owned and must
// outlive the exchange.
#ifndef DOWNPOUR_WORKER_PARAM_EXCHANGE_H_
#define DOWNPOUR_WORKER_PARAM_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/parameter_store.h"
#include "proto/job.pb.h"

namespace downpour {

struct ExchangeOptions {
  std::string job_id;
  int rank = 0;
  // Exactly-once identity of this worker process.
  std::string worker_id;
  int64_t incarnation = 0;
  // How long a pull may wait in total (other workers in SYNC, a shard coming
  // up) before it fails.
  absl::Duration pull_timeout = absl::Seconds(120);
  // A blocking pull is issued in slices of this length, so cancellation is
  // noticed.
  absl::Duration pull_slice = absl::Seconds(2);
};

class ParameterExchange {
 public:
  // `partitions` is the job's placement; `shards[i]` serves shard index i.
  ParameterExchange(ExchangeOptions options, const std::vector<PartitionPlacement>& partitions,
                    std::vector<ParameterShard*> shards);

  // Pushes the gradients of `step`: grads[tensor_id] points at the whole
  // tensor's gradient. REQUIRES: every placed tensor has a pointer.
  absl::Status Push(int64_t step, const std::vector<const float*>& grads);

  // Pulls every partition into params[tensor_id] once the shards meet
  // (min_version, min_worker_steps); gives up when `cancelled` returns true.
  absl::Status Pull(int64_t min_version, int64_t min_worker_steps,
                    const std::vector<float*>& params, const std::function<bool()>& cancelled);

 private:
  const ExchangeOptions options_;
  const std::vector<ParameterShard*> shards_;
  std::vector<std::vector<PartitionPlacement>> partitions_by_shard_;
  int64_t sequence_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_PARAM_EXCHANGE_H_
