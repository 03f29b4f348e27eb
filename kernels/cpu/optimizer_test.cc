#include "kernels/cpu/optimizer.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace kernels {
namespace cpu {
namespace {

// Naive double-precision references, written straight from the formulas.
struct Reference {
  std::vector<double> p, s0, s1;
};

void ReferenceStep(OptimizerKind kind, const OptimizerHyperparams& hp,
                   const std::vector<float>& grad, Reference* r) {
  const double lr = hp.learning_rate;
  for (size_t i = 0; i < grad.size(); ++i) {
    const double g = grad[i] + static_cast<double>(hp.weight_decay) * r->p[i];
    switch (kind) {
      case OptimizerKind::kSgd:
        r->p[i] -= lr * g;
        break;
      case OptimizerKind::kMomentum:
        r->s0[i] = hp.momentum * r->s0[i] + g;
        r->p[i] -= lr * r->s0[i];
        break;
      case OptimizerKind::kAdagrad:
        r->s0[i] += g * g;
        r->p[i] -= lr * g / (std::sqrt(r->s0[i]) + hp.epsilon);
        break;
      case OptimizerKind::kAdam: {
        const double b1 = hp.beta1, b2 = hp.beta2, t = static_cast<double>(hp.step);
        r->s0[i] = b1 * r->s0[i] + (1 - b1) * g;
        r->s1[i] = b2 * r->s1[i] + (1 - b2) * g * g;
        const double m_hat = r->s0[i] / (1 - std::pow(b1, t));
        const double v_hat = r->s1[i] / (1 - std::pow(b2, t));
        r->p[i] -= lr * m_hat / (std::sqrt(v_hat) + hp.epsilon);
        break;
      }
    }
  }
}

struct Case {
  OptimizerKind kind;
  float weight_decay;
  int64_t n;
};

class OptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerTest, MatchesDoubleReferenceOverSeveralSteps) {
  const Case c = GetParam();
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);

  std::vector<float> param(c.n);
  for (float& x : param) x = dist(rng);
  std::vector<std::vector<float>> slots(NumOptimizerSlots(c.kind), std::vector<float>(c.n, 0.f));
  std::vector<float*> slot_ptrs;
  for (auto& s : slots) slot_ptrs.push_back(s.data());

  Reference ref;
  ref.p.assign(param.begin(), param.end());
  ref.s0.assign(c.n, 0.0);
  ref.s1.assign(c.n, 0.0);

  OptimizerHyperparams hp;
  hp.learning_rate = 0.05f;
  hp.momentum = 0.9f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.epsilon = c.kind == OptimizerKind::kAdagrad ? 1e-10f : 1e-8f;
  hp.weight_decay = c.weight_decay;

  for (int step = 1; step <= 5; ++step) {
    std::vector<float> grad(c.n);
    for (float& g : grad) g = dist(rng);
    hp.step = step;
    ApplyOptimizer(c.kind, hp, grad.data(), c.n, param.data(), slot_ptrs.data());
    ReferenceStep(c.kind, hp, grad, &ref);
  }
  for (int64_t i = 0; i < c.n; ++i) {
    ASSERT_NEAR(param[i], ref.p[i], 1e-5 * (1 + std::fabs(ref.p[i]))) << "element " << i;
  }
  if (!slots.empty()) {
    for (int64_t i = 0; i < c.n; ++i) {
      ASSERT_NEAR(slots[0][i], ref.s0[i], 1e-5 * (1 + std::fabs(ref.s0[i]))) << "slot0 " << i;
    }
  }
  if (slots.size() > 1) {
    for (int64_t i = 0; i < c.n; ++i) {
      ASSERT_NEAR(slots[1][i], ref.s1[i], 1e-5 * (1 + std::fabs(ref.s1[i]))) << "slot1 " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, OptimizerTest,
                         ::testing::Values(Case{OptimizerKind::kSgd, 0.f, 1},
                                           Case{OptimizerKind::kSgd, 0.f, 1031},
                                           Case{OptimizerKind::kSgd, 0.01f, 1031},
                                           Case{OptimizerKind::kMomentum, 0.f, 7},
                                           Case{OptimizerKind::kMomentum, 0.01f, 1031},
                                           Case{OptimizerKind::kAdagrad, 0.f, 7},
                                           Case{OptimizerKind::kAdagrad, 0.01f, 1031},
                                           Case{OptimizerKind::kAdam, 0.f, 7},
                                           Case{OptimizerKind::kAdam, 0.01f, 1031}));

// Out of place reads the inputs it is given, leaves them alone, and writes
// exactly the bits the update in place would have.
TEST_P(OptimizerTest, OutOfPlaceMatchesInPlaceBitForBit) {
  const Case c = GetParam();
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const int num_slots = NumOptimizerSlots(c.kind);
  std::vector<float> param(c.n), grad(c.n);
  std::vector<std::vector<float>> slots(num_slots, std::vector<float>(c.n));
  for (float& x : param) x = dist(rng);
  for (float& x : grad) x = dist(rng);
  for (auto& s : slots) {
    for (float& x : s) x = c.kind == OptimizerKind::kMomentum ? dist(rng) : std::fabs(dist(rng));
  }
  const std::vector<float> param_before = param;
  const std::vector<std::vector<float>> slots_before = slots;
  std::vector<float> param_out(c.n, -7.f);
  std::vector<std::vector<float>> slots_out(num_slots, std::vector<float>(c.n, -7.f));
  std::vector<const float*> in_ptrs;
  std::vector<float*> out_ptrs, slot_ptrs;
  for (int k = 0; k < num_slots; ++k) {
    in_ptrs.push_back(slots[k].data());
    out_ptrs.push_back(slots_out[k].data());
    slot_ptrs.push_back(slots[k].data());
  }
  OptimizerHyperparams hp;
  hp.learning_rate = 0.05f;
  hp.weight_decay = c.weight_decay;
  hp.step = 3;
  ApplyOptimizerTo(c.kind, hp, grad.data(), c.n, param.data(), in_ptrs.data(), param_out.data(),
                   out_ptrs.data());
  EXPECT_EQ(param, param_before);
  EXPECT_EQ(slots, slots_before);
  ApplyOptimizer(c.kind, hp, grad.data(), c.n, param.data(), slot_ptrs.data());
  EXPECT_EQ(std::memcmp(param.data(), param_out.data(), c.n * sizeof(float)), 0);
  for (int k = 0; k < num_slots; ++k) {
    EXPECT_EQ(std::memcmp(slots[k].data(), slots_out[k].data(), c.n * sizeof(float)), 0)
        << "slot " << k;
  }
}

TEST(OptimizerTest, SgdSimpleValues) {
  OptimizerHyperparams hp;
  hp.learning_rate = 0.5f;
  float p[2] = {1.f, 2.f};
  const float g[2] = {2.f, -4.f};
  SgdUpdate(hp, g, 2, p);
  EXPECT_FLOAT_EQ(p[0], 0.f);
  EXPECT_FLOAT_EQ(p[1], 4.f);
}

TEST(OptimizerTest, AdamFirstStepMovesByLearningRate) {
  // With bias correction, Adam's first step is lr * sign(g) (up to epsilon).
  OptimizerHyperparams hp;
  hp.learning_rate = 0.1f;
  hp.step = 1;
  float p[2] = {0.f, 0.f};
  float m[2] = {0.f, 0.f};
  float v[2] = {0.f, 0.f};
  const float g[2] = {3.f, -0.002f};
  AdamUpdate(hp, g, 2, p, m, v);
  EXPECT_NEAR(p[0], -0.1f, 1e-6);
  EXPECT_NEAR(p[1], 0.1f, 1e-4);
}

// A table of bias corrections gives AdamBiasCorrections' bits at every
// step count, its own and past it, for any learning rate, whichever
// threads fill it in whatever order; and an update given the table is the
// update that computes them.
TEST(AdamBiasTableTest, GivesTheComputedCorrectionsBitForBit) {
  AdamBiasTable table(0.8f, 0.95f);
  auto same = [](const AdamCorrections& a, const AdamCorrections& b) {
    return std::memcmp(&a.step_size, &b.step_size, sizeof(float)) == 0 &&
           std::memcmp(&a.inv_sqrt_bc2, &b.inv_sqrt_bc2, sizeof(float)) == 0;
  };
  // The corrections as Adam defines them, in double.
  auto defined = [](const OptimizerHyperparams& hp) {
    const double t = static_cast<double>(hp.step);
    return AdamCorrections{
        static_cast<float>(hp.learning_rate / (1.0 - std::pow(double{hp.beta1}, t))),
        static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{hp.beta2}, t)))};
  };
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      OptimizerHyperparams hp;
      hp.beta1 = 0.8f;
      hp.beta2 = 0.95f;
      // Each thread its own learning rate and order of steps.
      hp.learning_rate = 0.001f * static_cast<float>(t + 1) / 3.f;
      for (int64_t k = 0; k < 5000; ++k) {
        hp.step = t % 2 == 0 ? k + 1 : 5000 - k;
        OptimizerHyperparams from_table = hp;
        from_table.adam_bias = &table;
        if (!same(table.At(hp), defined(hp)) || !same(AdamBiasCorrections(hp), defined(hp)) ||
            !same(AdamBiasCorrections(from_table), defined(hp))) {
          ++mismatches;
        }
      }
      for (int64_t step : {AdamBiasTable::kSteps, AdamBiasTable::kSteps + 1, int64_t{1} << 40}) {
        hp.step = step;
        OptimizerHyperparams from_table = hp;
        from_table.adam_bias = &table;
        if (!same(table.At(hp), defined(hp)) || !same(AdamBiasCorrections(hp), defined(hp)) ||
            !same(AdamBiasCorrections(from_table), defined(hp))) {
          ++mismatches;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);

  OptimizerHyperparams hp;
  hp.beta1 = 0.8f;
  hp.beta2 = 0.95f;
  hp.learning_rate = 0.01f;
  hp.step = 7;
  std::vector<float> grad = {0.5f, -1.f, 2.f, 1e-3f};
  std::vector<float> computed = {1.f, 2.f, -3.f, 0.25f}, m(4, 0.1f), v(4, 0.2f);
  std::vector<float> given = computed, m_given = m, v_given = v;
  AdamUpdate(hp, grad.data(), 4, computed.data(), m.data(), v.data());
  OptimizerHyperparams from_table = hp;
  from_table.adam_bias = &table;
  AdamUpdate(from_table, grad.data(), 4, given.data(), m_given.data(), v_given.data());
  EXPECT_EQ(std::memcmp(computed.data(), given.data(), 4 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(m.data(), m_given.data(), 4 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v.data(), v_given.data(), 4 * sizeof(float)), 0);
}

// Tables of the same betas are one table while anyone holds it.
TEST(AdamBiasTableTest, SharedByBetas) {
  std::shared_ptr<AdamBiasTable> a = AdamBiasTable::Shared(0.9f, 0.999f);
  EXPECT_EQ(AdamBiasTable::Shared(0.9f, 0.999f), a);
  EXPECT_NE(AdamBiasTable::Shared(0.9f, 0.99f), a);
}

TEST(OptimizerTest, ZeroLengthIsANoOp) {
  OptimizerHyperparams hp;
  ApplyOptimizer(OptimizerKind::kAdam, hp, nullptr, 0, nullptr, nullptr);
  ApplyOptimizer(OptimizerKind::kSgd, hp, nullptr, 0, nullptr, nullptr);
}

// Every position of an odd-length array (the vector body and its tail),
// each kind of non-finite value, and the scaled values themselves.
TEST(FiniteCheckTest, FindsANonFiniteValueAnywhereAndScalesEveryElement) {
  constexpr int64_t kN = 37;
  const float kBad[] = {NAN, INFINITY, -INFINITY};
  for (int64_t at = 0; at < kN; ++at) {
    for (float bad : kBad) {
      std::vector<float> v(kN, 1.5f);
      v[at] = bad;
      EXPECT_FALSE(AllFinite(v.data(), kN)) << at;
      EXPECT_FALSE(ScaleAndCheckFinite(0.5f, kN, v.data())) << at;
    }
  }
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = static_cast<float>(i) - 3.f;
  EXPECT_TRUE(AllFinite(v.data(), kN));
  EXPECT_TRUE(ScaleAndCheckFinite(0.25f, kN, v.data()));
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(v[i], (static_cast<float>(i) - 3.f) * 0.25f);
  // A finite value that overflows when scaled is caught too.
  std::vector<float> big(kN, 3e38f);
  EXPECT_FALSE(ScaleAndCheckFinite(2.f, kN, big.data()));
  EXPECT_TRUE(AllFinite(nullptr, 0));
}

}  // namespace
}  // namespace cpu
}  // namespace kernels
}  // namespace downpour
