// The optimizer updates on host float arrays: the CPU reference of
// kernels/optimizer.h, which the parameter shards run on every push and the
// CPU backend runs for a device-resident loop. The CUDA twin is
// kernels/cuda/optimizer.h.
//
// Each update is a pure function of (hyperparameters, pointers, sizes): it
// reads `grad`, and updates `param` and the optimizer's slots in place.
// Thread-compatible: concurrent calls on disjoint arrays are safe; the
// caller serialises calls on the same arrays. Nothing is owned or retained.
//
// REQUIRES (every update): the arrays hold `n` elements and do not overlap.
#ifndef DOWNPOUR_KERNELS_CPU_OPTIMIZER_H_
#define DOWNPOUR_KERNELS_CPU_OPTIMIZER_H_

#include <cstdint>

#include "kernels/optimizer.h"

namespace downpour {
namespace kernels {
namespace cpu {

// p -= lr * g
void SgdUpdate(const OptimizerHyperparams& hp, const float* grad, int64_t n, float* param);

// v = momentum * v + g; p -= lr * v
void MomentumUpdate(const OptimizerHyperparams& hp, const float* grad, int64_t n, float* param,
                    float* velocity);

// a += g^2; p -= lr * g / (sqrt(a) + epsilon)
void AdagradUpdate(const OptimizerHyperparams& hp, const float* grad, int64_t n, float* param,
                   float* accumulator);

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + epsilon), t = hp.step.
// REQUIRES: hp.step >= 1.
void AdamUpdate(const OptimizerHyperparams& hp, const float* grad, int64_t n, float* param,
                float* m, float* v);

// Dispatches on `kind`; `slots` holds NumOptimizerSlots(kind) arrays of `n`
// elements in the order listed above (may be null for SGD).
void ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp, const float* grad,
                    int64_t n, float* param, float* const* slots);

// ApplyOptimizer out of place, to the same bits: reads the parameters and
// slots from `param_in` / `slots_in` and writes the updated ones to
// `param_out` / `slots_out`, leaving the inputs as they were. A parameter
// shard updates so a partition whose arrays a checkpoint is still writing
// (ps/parameter_store.h): no copy first, and the same bytes read and written
// as in place.
// REQUIRES: no output array overlaps an input or another output.
void ApplyOptimizerTo(OptimizerKind kind, const OptimizerHyperparams& hp, const float* grad,
                      int64_t n, const float* param_in, const float* const* slots_in,
                      float* param_out, float* const* slots_out);

// Whether every element of v[0, n) is finite (no NaN, no infinity).
bool AllFinite(const float* v, int64_t n);

// v *= scale, element by element, and whether every result is finite: a
// SYNC step's sum made its mean and checked before it is applied, in one
// pass.
bool ScaleAndCheckFinite(float scale, int64_t n, float* v);

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CPU_OPTIMIZER_H_
