// A worker's part of a checkpoint: the model state the parameter server does
// not hold — each replica's local state (batch norm's running statistics,
// by name, e.g. "bn1/running_mean") and FP16's loss scale ("loss_scale",
// F64) — as safetensors bytes. Rank 0 saves its own; on a restore every
// worker and every replica loads them.
//
// Thread-compatible: the model must not be stepping meanwhile.
#ifndef DOWNPOUR_WORKER_WORKER_STATE_H_
#define DOWNPOUR_WORKER_WORKER_STATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/replica_set.h"
#include "spec/checkpoint_files.h"

namespace downpour {

absl::StatusOr<std::string> SaveWorkerState(const Model& model);
// DataLoss naming the tensor when the bytes are not a safetensors file of
// this model's state (a missing tensor, a wrong shape).
absl::Status LoadWorkerState(const std::string& bytes, ReplicaSet* replicas);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_WORKER_STATE_H_
