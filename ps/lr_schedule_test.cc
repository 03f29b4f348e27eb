#include "ps/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "spec/memory_needs.h"

namespace downpour {
namespace {

OptimizerSpec Spec(LearningRateSchedule::Kind kind, int64_t warmup, int64_t decay_steps,
                   float decay_rate) {
  OptimizerSpec spec;
  spec.set_learning_rate(0.1f);
  spec.mutable_schedule()->set_kind(kind);
  spec.mutable_schedule()->set_warmup_steps(warmup);
  spec.mutable_schedule()->set_decay_steps(decay_steps);
  spec.mutable_schedule()->set_decay_rate(decay_rate);
  return spec;
}

TEST(LrScheduleTest, Constant) {
  const OptimizerSpec spec = Spec(LearningRateSchedule::CONSTANT, 0, 0, 0);
  EXPECT_NEAR(LearningRateAt(spec, 0), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 100000), 0.1, 1e-7);
}

TEST(LrScheduleTest, StepDecay) {
  const OptimizerSpec spec = Spec(LearningRateSchedule::STEP, 0, 10, 0.5f);
  EXPECT_NEAR(LearningRateAt(spec, 0), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 9), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 10), 0.05, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 25), 0.025, 1e-7);
}

TEST(LrScheduleTest, Cosine) {
  const OptimizerSpec spec = Spec(LearningRateSchedule::COSINE, 0, 100, 0);
  EXPECT_NEAR(LearningRateAt(spec, 0), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 50), 0.05, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 100), 0.0, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 1000), 0.0, 1e-7);
}

TEST(LrScheduleTest, LinearWarmupThenDecayFromTheEndOfWarmup) {
  const OptimizerSpec spec = Spec(LearningRateSchedule::COSINE, 4, 100, 0);
  EXPECT_NEAR(LearningRateAt(spec, 0), 0.025, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 1), 0.05, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 3), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 4), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(spec, 54), 0.05, 1e-7);
}

TEST(LrScheduleTest, ZeroDecayStepsMeansNoDecay) {
  EXPECT_NEAR(LearningRateAt(Spec(LearningRateSchedule::STEP, 0, 0, 0.5f), 50), 0.1, 1e-7);
  EXPECT_NEAR(LearningRateAt(Spec(LearningRateSchedule::COSINE, 0, 0, 0), 50), 0.1, 1e-7);
}

TEST(LrScheduleTest, DefaultsForZeroFields) {
  OptimizerSpec spec;
  spec.set_kind(OptimizerSpec::ADAM);
  spec.set_learning_rate(0.01f);
  OptimizerHyperparams hp = HyperparamsAt(spec, /*progress=*/6, /*update=*/7);
  EXPECT_FLOAT_EQ(hp.learning_rate, 0.01f);
  EXPECT_FLOAT_EQ(hp.beta1, 0.9f);
  EXPECT_FLOAT_EQ(hp.beta2, 0.999f);
  EXPECT_FLOAT_EQ(hp.epsilon, 1e-8f);
  EXPECT_FLOAT_EQ(hp.momentum, 0.9f);
  EXPECT_EQ(hp.step, 7);
  // Adam's t counts the updates applied, not the progress.
  EXPECT_EQ(HyperparamsAt(spec, /*progress=*/6, /*update=*/3).step, 3);
  EXPECT_EQ(HyperparamsAt(spec, /*progress=*/0, /*update=*/0).step, 1);

  spec.set_kind(OptimizerSpec::ADAGRAD);
  EXPECT_FLOAT_EQ(HyperparamsAt(spec, 0, 1).epsilon, 1e-10f);

  spec.set_kind(OptimizerSpec::MOMENTUM);
  spec.set_momentum(0.5f);
  spec.set_weight_decay(1e-4f);
  hp = HyperparamsAt(spec, 0, 1);
  EXPECT_FLOAT_EQ(hp.momentum, 0.5f);
  EXPECT_FLOAT_EQ(hp.weight_decay, 1e-4f);
}

TEST(LrScheduleTest, OptimizerKindOf) {
  OptimizerSpec spec;
  spec.set_kind(OptimizerSpec::ADAGRAD);
  EXPECT_EQ(OptimizerKindOf(spec).value(), OptimizerKind::kAdagrad);
  spec.set_kind(static_cast<OptimizerSpec::Kind>(42));
  EXPECT_EQ(OptimizerKindOf(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

// The coordinator admits a job with spec/memory_needs's slot count; the
// shard's optimizer allocates NumOptimizerSlots of them.
TEST(OptimizerKindOfTest, SlotsAgreeWithWhatAdmissionCounts) {
  for (OptimizerSpec::Kind kind :
       {OptimizerSpec::SGD, OptimizerSpec::MOMENTUM, OptimizerSpec::ADAGRAD, OptimizerSpec::ADAM}) {
    OptimizerSpec spec;
    spec.set_kind(kind);
    spec.set_learning_rate(0.1f);
    absl::StatusOr<OptimizerKind> ours = OptimizerKindOf(spec);
    ASSERT_TRUE(ours.ok()) << ours.status();
    EXPECT_EQ(NumOptimizerSlots(*ours), OptimizerSlots(kind)) << kind;
  }
}

}  // namespace
}  // namespace downpour
