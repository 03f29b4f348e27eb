#include "kernels/cpu/optimizer.h"

#include <cmath>

namespace downpour {
namespace kernels {
namespace cpu {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DOWNPOUR_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DOWNPOUR_VECTOR_CLONES
#endif

// The loops below are written so that GCC/Clang vectorise them: restrict
// pointers, no calls but sqrt (see the copts in BUILD.bazel), no branches on
// data. Weight decay is hoisted out so the common wd == 0 case pays nothing.
//
// Each update is also compiled for AVX2 and AVX-512 and picked at load time
// (target_clones): the default x86-64 build has SSE2's 4 lanes, and a
// shard's apply of a cache-resident partition is bound by the sqrt and
// divide, 2-4x faster at 8 or 16 lanes. sqrt and divide are correctly
// rounded at every width and contraction into FMA is off (BUILD.bazel), so
// every clone computes the same bits.

DOWNPOUR_VECTOR_CLONES void SgdUpdate(const OptimizerHyperparams& hp, const float* __restrict grad,
                                      int64_t n, float* __restrict param) {
  const float lr = hp.learning_rate;
  const float wd = hp.weight_decay;
  if (wd == 0.f) {
    for (int64_t i = 0; i < n; ++i) param[i] -= lr * grad[i];
  } else {
    for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void MomentumUpdate(const OptimizerHyperparams& hp,
                                           const float* __restrict grad, int64_t n,
                                           float* __restrict param, float* __restrict velocity) {
  const float lr = hp.learning_rate;
  const float mu = hp.momentum;
  const float wd = hp.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    const float v = mu * velocity[i] + g;
    velocity[i] = v;
    param[i] -= lr * v;
  }
}

DOWNPOUR_VECTOR_CLONES void AdagradUpdate(const OptimizerHyperparams& hp,
                                          const float* __restrict grad, int64_t n,
                                          float* __restrict param, float* __restrict accumulator) {
  const float lr = hp.learning_rate;
  const float eps = hp.epsilon;
  const float wd = hp.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    const float a = accumulator[i] + g * g;
    accumulator[i] = a;
    param[i] -= lr * g / (std::sqrt(a) + eps);
  }
}

DOWNPOUR_VECTOR_CLONES void AdamUpdate(const OptimizerHyperparams& hp, const float* __restrict grad,
                                       int64_t n, float* __restrict param, float* __restrict m,
                                       float* __restrict v) {
  const float b1 = hp.beta1;
  const float b2 = hp.beta2;
  const float eps = hp.epsilon;
  const float wd = hp.weight_decay;
  // Bias corrections once per call; the loop stays in float.
  const AdamCorrections c = AdamBiasCorrections(hp);
  const float step_size = c.step_size;
  const float inv_sqrt_bc2 = c.inv_sqrt_bc2;
  const float one_minus_b1 = 1.f - b1;
  const float one_minus_b2 = 1.f - b2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] -= step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void ApplyOptimizer(OptimizerKind kind, const OptimizerHyperparams& hp, const float* grad,
                    int64_t n, float* param, float* const* slots) {
  if (n <= 0) return;
  switch (kind) {
    case OptimizerKind::kSgd:
      SgdUpdate(hp, grad, n, param);
      return;
    case OptimizerKind::kMomentum:
      MomentumUpdate(hp, grad, n, param, slots[0]);
      return;
    case OptimizerKind::kAdagrad:
      AdagradUpdate(hp, grad, n, param, slots[0]);
      return;
    case OptimizerKind::kAdam:
      AdamUpdate(hp, grad, n, param, slots[0], slots[1]);
      return;
  }
}

// The out-of-place twins of the updates above: the same expressions in the
// same order (so the same bits), inputs and outputs apart.

DOWNPOUR_VECTOR_CLONES void SgdUpdateTo(const OptimizerHyperparams& hp,
                                        const float* __restrict grad, int64_t n,
                                        const float* __restrict param_in,
                                        float* __restrict param_out) {
  const float lr = hp.learning_rate;
  const float wd = hp.weight_decay;
  if (wd == 0.f) {
    for (int64_t i = 0; i < n; ++i) param_out[i] = param_in[i] - lr * grad[i];
  } else {
    for (int64_t i = 0; i < n; ++i) param_out[i] = param_in[i] - lr * (grad[i] + wd * param_in[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void MomentumUpdateTo(const OptimizerHyperparams& hp,
                                             const float* __restrict grad, int64_t n,
                                             const float* __restrict param_in,
                                             const float* __restrict velocity_in,
                                             float* __restrict param_out,
                                             float* __restrict velocity_out) {
  const float lr = hp.learning_rate;
  const float mu = hp.momentum;
  const float wd = hp.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param_in[i];
    const float v = mu * velocity_in[i] + g;
    velocity_out[i] = v;
    param_out[i] = param_in[i] - lr * v;
  }
}

DOWNPOUR_VECTOR_CLONES void AdagradUpdateTo(const OptimizerHyperparams& hp,
                                            const float* __restrict grad, int64_t n,
                                            const float* __restrict param_in,
                                            const float* __restrict accumulator_in,
                                            float* __restrict param_out,
                                            float* __restrict accumulator_out) {
  const float lr = hp.learning_rate;
  const float eps = hp.epsilon;
  const float wd = hp.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param_in[i];
    const float a = accumulator_in[i] + g * g;
    accumulator_out[i] = a;
    param_out[i] = param_in[i] - lr * g / (std::sqrt(a) + eps);
  }
}

DOWNPOUR_VECTOR_CLONES void AdamUpdateTo(const OptimizerHyperparams& hp,
                                         const float* __restrict grad, int64_t n,
                                         const float* __restrict param_in,
                                         const float* __restrict m_in, const float* __restrict v_in,
                                         float* __restrict param_out, float* __restrict m_out,
                                         float* __restrict v_out) {
  const float b1 = hp.beta1;
  const float b2 = hp.beta2;
  const float eps = hp.epsilon;
  const float wd = hp.weight_decay;
  const AdamCorrections c = AdamBiasCorrections(hp);
  const float step_size = c.step_size;
  const float inv_sqrt_bc2 = c.inv_sqrt_bc2;
  const float one_minus_b1 = 1.f - b1;
  const float one_minus_b2 = 1.f - b2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param_in[i];
    const float mi = b1 * m_in[i] + one_minus_b1 * g;
    const float vi = b2 * v_in[i] + one_minus_b2 * g * g;
    m_out[i] = mi;
    v_out[i] = vi;
    param_out[i] = param_in[i] - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void ApplyOptimizerTo(OptimizerKind kind, const OptimizerHyperparams& hp, const float* grad,
                      int64_t n, const float* param_in, const float* const* slots_in,
                      float* param_out, float* const* slots_out) {
  if (n <= 0) return;
  switch (kind) {
    case OptimizerKind::kSgd:
      SgdUpdateTo(hp, grad, n, param_in, param_out);
      return;
    case OptimizerKind::kMomentum:
      MomentumUpdateTo(hp, grad, n, param_in, slots_in[0], param_out, slots_out[0]);
      return;
    case OptimizerKind::kAdagrad:
      AdagradUpdateTo(hp, grad, n, param_in, slots_in[0], param_out, slots_out[0]);
      return;
    case OptimizerKind::kAdam:
      AdamUpdateTo(hp, grad, n, param_in, slots_in[0], slots_in[1], param_out, slots_out[0],
                   slots_out[1]);
      return;
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour
