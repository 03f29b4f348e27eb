// A worker's part of a checkpoint: the model state the parameter server does
// not hold — the model's local state (batch norm's running statistics, by
// name, e.g. "bn1/running_mean") and FP16's loss scale ("loss_scale", F64) —
// as safetensors bytes. Rank 0 saves its own (replica 0's, or every
// pipeline stage's); on a restore every worker loads them into every
// replica or stage.
//
// Thread-compatible: the model must not be stepping meanwhile.
#ifndef DOWNPOUR_WORKER_WORKER_STATE_H_
#define DOWNPOUR_WORKER_WORKER_STATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "spec/checkpoint_files.h"
#include "worker/model_runner.h"

namespace downpour {

absl::StatusOr<std::string> SaveWorkerState(const ModelRunner& model);
// DataLoss naming the tensor when the bytes are not a safetensors file of
// this model's state (a missing tensor, a wrong shape).
absl::Status LoadWorkerState(const std::string& bytes, ModelRunner* model);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_WORKER_STATE_H_
