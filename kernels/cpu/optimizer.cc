#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <cstring>

#include "common/platform/vector_clones.h"

namespace downpour {
namespace kernels {
namespace cpu {

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

// One element of each update, written once for the in-place loops and
// their out-of-place twins below (so both compute the same bits): takes the
// gradient, the parameter and the slots, writes the new slots and returns
// the new parameter.
#define DOWNPOUR_ELEMENT static inline __attribute__((always_inline))

struct MomentumConstants {
  explicit MomentumConstants(const OptimizerHyperparams& hp)
      : lr(hp.learning_rate), mu(hp.momentum), wd(hp.weight_decay) {}
  float lr, mu, wd;
};
DOWNPOUR_ELEMENT float MomentumStep(const MomentumConstants& k, float grad, float param,
                                    float velocity, float* velocity_out) {
  const float g = grad + k.wd * param;
  const float v = k.mu * velocity + g;
  *velocity_out = v;
  return param - k.lr * v;
}

struct AdagradConstants {
  explicit AdagradConstants(const OptimizerHyperparams& hp)
      : lr(hp.learning_rate), eps(hp.epsilon), wd(hp.weight_decay) {}
  float lr, eps, wd;
};
DOWNPOUR_ELEMENT float AdagradStep(const AdagradConstants& k, float grad, float param,
                                   float accumulator, float* accumulator_out) {
  const float g = grad + k.wd * param;
  const float a = accumulator + g * g;
  *accumulator_out = a;
  return param - k.lr * g / (std::sqrt(a) + k.eps);
}

struct AdamConstants {
  // Bias corrections once per call (a sparse table calls once per row); the
  // loop stays in float.
  explicit AdamConstants(const OptimizerHyperparams& hp)
      : AdamConstants(hp, AdamBiasCorrections(hp)) {}
  AdamConstants(const OptimizerHyperparams& hp, const AdamCorrections& c)
      : b1(hp.beta1),
        b2(hp.beta2),
        eps(hp.epsilon),
        wd(hp.weight_decay),
        step_size(c.step_size),
        inv_sqrt_bc2(c.inv_sqrt_bc2),
        one_minus_b1(1.f - hp.beta1),
        one_minus_b2(1.f - hp.beta2) {}
  float b1, b2, eps, wd, step_size, inv_sqrt_bc2, one_minus_b1, one_minus_b2;
};
DOWNPOUR_ELEMENT float AdamStep(const AdamConstants& k, float grad, float param, float m, float v,
                                float* m_out, float* v_out) {
  const float g = grad + k.wd * param;
  const float mi = k.b1 * m + k.one_minus_b1 * g;
  const float vi = k.b2 * v + k.one_minus_b2 * g * g;
  *m_out = mi;
  *v_out = vi;
  return param - k.step_size * mi / (std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps);
}

DOWNPOUR_VECTOR_CLONES void MomentumUpdate(const OptimizerHyperparams& hp,
                                           const float* __restrict grad, int64_t n,
                                           float* __restrict param, float* __restrict velocity) {
  const MomentumConstants k(hp);
  for (int64_t i = 0; i < n; ++i) {
    param[i] = MomentumStep(k, grad[i], param[i], velocity[i], &velocity[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void AdagradUpdate(const OptimizerHyperparams& hp,
                                          const float* __restrict grad, int64_t n,
                                          float* __restrict param, float* __restrict accumulator) {
  const AdagradConstants k(hp);
  for (int64_t i = 0; i < n; ++i) {
    param[i] = AdagradStep(k, grad[i], param[i], accumulator[i], &accumulator[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void AdamUpdate(const OptimizerHyperparams& hp, const float* __restrict grad,
                                       int64_t n, float* __restrict param, float* __restrict m,
                                       float* __restrict v) {
  const AdamConstants k(hp);
  for (int64_t i = 0; i < n; ++i) {
    param[i] = AdamStep(k, grad[i], param[i], m[i], v[i], &m[i], &v[i]);
  }
}

namespace {

// 1 where x is not finite (its exponent bits all set), else 0: an integer
// test, so the loops below reduce with OR and vectorise (a float probe
// would need reassociation).
DOWNPOUR_ELEMENT uint32_t NotFinite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

}  // namespace

DOWNPOUR_VECTOR_CLONES bool AllFinite(const float* __restrict v, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= NotFinite(v[i]);
  return bad == 0;
}

DOWNPOUR_VECTOR_CLONES bool ScaleAndCheckFinite(float scale, int64_t n, float* __restrict v) {
  uint32_t bad = 0;
  if (scale == 1.f) return AllFinite(v, n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] *= scale;
    bad |= NotFinite(v[i]);
  }
  return bad == 0;
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
  const MomentumConstants k(hp);
  for (int64_t i = 0; i < n; ++i) {
    param_out[i] = MomentumStep(k, grad[i], param_in[i], velocity_in[i], &velocity_out[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void AdagradUpdateTo(const OptimizerHyperparams& hp,
                                            const float* __restrict grad, int64_t n,
                                            const float* __restrict param_in,
                                            const float* __restrict accumulator_in,
                                            float* __restrict param_out,
                                            float* __restrict accumulator_out) {
  const AdagradConstants k(hp);
  for (int64_t i = 0; i < n; ++i) {
    param_out[i] = AdagradStep(k, grad[i], param_in[i], accumulator_in[i], &accumulator_out[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void AdamUpdateTo(const OptimizerHyperparams& hp,
                                         const float* __restrict grad, int64_t n,
                                         const float* __restrict param_in,
                                         const float* __restrict m_in, const float* __restrict v_in,
                                         float* __restrict param_out, float* __restrict m_out,
                                         float* __restrict v_out) {
  const AdamConstants k(hp);
  for (int64_t i = 0; i < n; ++i) {
    param_out[i] = AdamStep(k, grad[i], param_in[i], m_in[i], v_in[i], &m_out[i], &v_out[i]);
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
