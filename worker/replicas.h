// Data parallelism inside one worker: one model replica per local device.
// Each step's batch is split across the replicas, each runs forward and
// backward on its slice on its own thread (driving its own device), and their
// gradients are averaged on the host into replica 0, the one that exchanges
// with the parameter shards.
#ifndef DOWNPOUR_WORKER_REPLICAS_H_
#define DOWNPOUR_WORKER_REPLICAS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model.h"

namespace downpour {

// Copies replica 0's parameters to the others, trains `batch` examples split
// into contiguous slices (one per replica, at most one replica per example),
// and leaves the batch-mean gradient in replica 0's grad(). The loss is the
// batch mean; if any replica's FP16 step overflowed, the step is skipped and
// replica 0's gradients are zeros. REQUIRES: replicas of the same spec.
absl::StatusOr<StepResult> TrainStepOnReplicas(const std::vector<std::unique_ptr<Model>>& replicas,
                                               const float* features, const int32_t* labels,
                                               int64_t batch, int64_t step);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_REPLICAS_H_
