// The server-side optimizer settings of a job at a given step: the learning
// rate from the job's schedule (constant, step decay, cosine, each with
// optional linear warmup) and the hyperparameters with their defaults filled
// in for fields left at zero.
//
// Pure functions of the spec and the job's progress; thread-safe. `progress`
// is 0-based: the steps the job has made before the update being computed
// (see OptimizerSpec in proto/job.proto: a SYNC partition's version, an
// ASYNC/SSP one's pushes divided by num_workers).
#ifndef DOWNPOUR_PS_LR_SCHEDULE_H_
#define DOWNPOUR_PS_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/optimizer.h"
#include "proto/job.pb.h"

namespace downpour {

// Defaults for zero fields of OptimizerSpec.
inline constexpr float kDefaultMomentum = 0.9f;
inline constexpr float kDefaultBeta1 = 0.9f;
inline constexpr float kDefaultBeta2 = 0.999f;
inline constexpr float kDefaultAdamEpsilon = 1e-8f;
inline constexpr float kDefaultAdagradEpsilon = 1e-10f;

// Learning rate for the update at `progress` (p):
//   warmup (p < warmup_steps): lr * (p + 1) / warmup_steps
//   then, with s = p - warmup_steps (decay starts after warmup):
//   CONSTANT: lr
//   STEP:     lr * decay_rate ^ floor(s / decay_steps)        (decay_steps > 0)
//   COSINE:   lr * 0.5 * (1 + cos(pi * min(s, decay_steps) / decay_steps))
// A decay with decay_steps <= 0 leaves the rate constant.
double LearningRateAt(const OptimizerSpec& spec, int64_t progress);

// The optimizer kind of `spec`, or InvalidArgument naming the field for an
// unknown enum value.
absl::StatusOr<OptimizerKind> OptimizerKindOf(const OptimizerSpec& spec);

// Hyperparameters of an update: the learning rate at `progress`, zero fields
// replaced by their defaults, and Adam's step count t = `update`, the 1-based
// count of updates applied to the parameters including this one (fewer than
// the progress when steps were skipped).
OptimizerHyperparams HyperparamsAt(const OptimizerSpec& spec, int64_t progress, int64_t update);

}  // namespace downpour

#endif  // DOWNPOUR_PS_LR_SCHEDULE_H_
