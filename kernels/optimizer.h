// Server-side optimizer updates over float arrays: SGD, momentum, Adagrad and
// Adam, each with optional L2 weight decay (added to the gradient).
//
// Each update is a pure function of (hyperparameters, pointers, sizes): it
// reads `grad`, and updates `param` and the optimizer's slots in place. This
// is the CPU reference; a CUDA version with the same signatures lives beside
// it. Thread-compatible: concurrent calls on disjoint arrays are safe; the
// caller serialises calls on the same arrays. Nothing is owned or retained.
//
// REQUIRES (every update): the arrays hold `n` elements and do not overlap.
#ifndef DOWNPOUR_KERNELS_OPTIMIZER_H_
#define DOWNPOUR_KERNELS_OPTIMIZER_H_

#include <cstdint>

namespace downpour {

enum class OptimizerKind { kSgd, kMomentum, kAdagrad, kAdam };

// Hyperparameters of one update, already resolved (no zero-means-default
// here; see core/lr_schedule for the defaults of a job spec).
struct OptimizerHyperparams {
  float learning_rate = 0.f;  // At this step (after the schedule).
  float momentum = 0.9f;      // Momentum.
  float beta1 = 0.9f;         // Adam.
  float beta2 = 0.999f;       // Adam.
  float epsilon = 1e-8f;      // Adam and Adagrad.
  float weight_decay = 0.f;   // L2: grad += weight_decay * param.
  // 1-based count of updates including this one (Adam's bias correction).
  int64_t step = 1;
};

// Number of float slots of `n` elements the optimizer keeps per parameter
// array: SGD 0, momentum 1 (velocity), Adagrad 1 (accumulator), Adam 2 (m, v).
int NumOptimizerSlots(OptimizerKind kind);

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
// Adam's bias corrections at hp.step (1 at the least), in double once per
// update: step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t).
// Shared by every backend so their updates round alike.
struct AdamCorrections {
  float step_size;
  float inv_sqrt_bc2;
};
AdamCorrections AdamBiasCorrections(const OptimizerHyperparams& hp);

void AdamUpdate(const OptimizerHyperparams& hp, const float* grad, int64_t n, float* param,
                float* m, float* v);

// Dispatches on `kind`; `slots` holds NumOptimizerSlots(kind) arrays of `n`
// elements in the order listed above (may be null for SGD).
void ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp, const float* grad,
                    int64_t n, float* param, float* const* slots);

}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_OPTIMIZER_H_
