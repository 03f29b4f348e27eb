#include "spec/params.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(InitParamRangeTest, PartitionsMatchWholeTensor) {
  ParamInfo p;
  p.id = 3;
  p.num_elements = 1000;
  p.init = ParamInit::kHeUniform;
  p.fan_in = 100;
  std::vector<float> whole(1000), parts(1000);
  InitParamRange(p, 42, 0, 1000, whole.data());
  InitParamRange(p, 42, 0, 300, parts.data());
  InitParamRange(p, 42, 300, 700, parts.data() + 300);
  EXPECT_EQ(whole, parts);
}

TEST(InitParamRangeTest, HeUniformStaysInBoundsAndVaries) {
  ParamInfo p;
  p.id = 0;
  p.init = ParamInit::kHeUniform;
  p.fan_in = 24;
  std::vector<float> v(4096);
  InitParamRange(p, 7, 0, v.size(), v.data());
  const float limit = std::sqrt(6.f / 24.f);
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_LE(std::fabs(x), limit);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / v.size(), 0.0, 0.05);
  // Variance of U(-a, a) is a^2 / 3.
  EXPECT_NEAR(sq / v.size(), limit * limit / 3, 0.05);
}

// PyTorch's nn.Linear / nn.Conv2d default: U(-1 / sqrt(fan_in), +...).
TEST(InitParamRangeTest, FanInUniformIsPyTorchsDefaultScale) {
  ParamInfo p;
  p.init = ParamInit::kFanInUniform;
  p.fan_in = 64;
  p.fan_out = 1000;  // Not part of it.
  std::vector<float> v(4096);
  InitParamRange(p, 7, 0, v.size(), v.data());
  const float limit = 1.f / 8.f;
  double sq = 0;
  float largest = 0;
  for (float x : v) {
    largest = std::max(largest, std::fabs(x));
    sq += x * x;
  }
  EXPECT_LE(largest, limit);
  EXPECT_GT(largest, 0.95f * limit);
  EXPECT_NEAR(sq / v.size(), limit * limit / 3, 0.1 * limit * limit / 3);
}

TEST(InitParamRangeTest, SeedAndIdChangeValues) {
  ParamInfo a;
  a.init = ParamInit::kGlorotUniform;
  a.fan_in = a.fan_out = 10;
  ParamInfo b = a;
  b.id = 1;
  float x[4], y[4], z[4];
  InitParamRange(a, 1, 0, 4, x);
  InitParamRange(a, 2, 0, 4, y);
  InitParamRange(b, 1, 0, 4, z);
  EXPECT_NE(x[0], y[0]);
  EXPECT_NE(x[0], z[0]);
}

}  // namespace
}  // namespace downpour
