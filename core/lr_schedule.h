// The server-side optimizer settings of a job at a given step: the learning
// rate from the job's schedule (constant, step decay, cosine, each with
// optional linear warmup) and the hyperparameters with their defaults filled
// in for fields left at zero.
//
// Pure functions of the spec and the step; thread-safe. `step` is 0-based: the
// number of updates applied before the one being computed (a partition's
// version).
#ifndef DOWNPOUR_CORE_LR_SCHEDULE_H_
#define DOWNPOUR_CORE_LR_SCHEDULE_H_

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

// Learning rate for the update at `step`:
//   warmup (step < warmup_steps): lr * (step + 1) / warmup_steps
//   then, with s = step - warmup_steps (decay starts after warmup):
//   CONSTANT: lr
//   STEP:     lr * decay_rate ^ floor(s / decay_steps)        (decay_steps > 0)
//   COSINE:   lr * 0.5 * (1 + cos(pi * min(s, decay_steps) / decay_steps))
// A decay with decay_steps <= 0 leaves the rate constant.
double LearningRateAt(const OptimizerSpec& spec, int64_t step);

// The optimizer kind of `spec`, or InvalidArgument naming the field for an
// unknown enum value.
absl::StatusOr<OptimizerKind> OptimizerKindOf(const OptimizerSpec& spec);

// Hyperparameters of the update at `step`: learning rate from the schedule,
// zero fields replaced by their defaults, and the 1-based Adam step count
// (step + 1).
OptimizerHyperparams HyperparamsAt(const OptimizerSpec& spec, int64_t step);

}  // namespace downpour

#endif  // DOWNPOUR_CORE_LR_SCHEDULE_H_
