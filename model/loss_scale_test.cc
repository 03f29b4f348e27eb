#include "model/loss_scale.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

// The schedule alone, no device: halve on overflow (not below 1), double
// after kGrowthInterval clean steps in a row, an overflow restarts the count.
TEST(DynamicLossScaleTest, HalvesOnOverflowDoublesAfterCleanSteps) {
  DynamicLossScale s;
  EXPECT_EQ(s.scale(), 32768.0);
  s.Update(true);
  EXPECT_EQ(s.scale(), 16384.0);
  for (int64_t i = 0; i < DynamicLossScale::kGrowthInterval - 1; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 16384.0);
  s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  for (int64_t i = 0; i < DynamicLossScale::kGrowthInterval - 1; ++i) s.Update(false);
  s.Update(true);  // Resets the clean count.
  EXPECT_EQ(s.scale(), 16384.0);
  for (int64_t i = 0; i < DynamicLossScale::kGrowthInterval - 1; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 16384.0);
  DynamicLossScale low(2.0);
  low.Update(true);
  low.Update(true);
  EXPECT_EQ(low.scale(), 1.0);
  DynamicLossScale high(DynamicLossScale::kMaxScale);
  for (int64_t i = 0; i < DynamicLossScale::kGrowthInterval; ++i) high.Update(false);
  EXPECT_EQ(high.scale(), DynamicLossScale::kMaxScale);
}

}  // namespace
}  // namespace downpour
