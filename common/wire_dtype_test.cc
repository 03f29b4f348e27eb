#include "common/wire_dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(WireDtypeTest, HalfWidthsRoundTripWithinTheirPrecision) {
  const float values[] = {0.f, 1.f, -2.5f, 1e-3f, 65504.f, 3e-6f, 1e-8f};
  for (WireDtype dtype : {WireDtype::kBfloat16, WireDtype::kFloat16}) {
    ASSERT_EQ(BytesPerElement(dtype), 2);
    char wire[sizeof(values) / 2];
    float back[7];
    EncodeFloats(dtype, values, 7, wire);
    DecodeFloats(dtype, wire, 7, back);
    for (int i = 0; i < 7; ++i) {
      const float tolerance = dtype == WireDtype::kBfloat16 ? 1.f / 128 : 1.f / 1024;
      EXPECT_NEAR(back[i], values[i], std::abs(values[i]) * tolerance + 6e-8f)
          << static_cast<int>(dtype) << " " << values[i];
    }
  }
}

TEST(WireDtypeTest, Float32IsACopy) {
  const float values[] = {1.f, -0.f, std::numeric_limits<float>::denorm_min(), 3.25f};
  char wire[sizeof(values)];
  float back[4];
  ASSERT_EQ(BytesPerElement(WireDtype::kFloat32), 4);
  EncodeFloats(WireDtype::kFloat32, values, 4, wire);
  DecodeFloats(WireDtype::kFloat32, wire, 4, back);
  EXPECT_EQ(std::memcmp(values, back, sizeof(values)), 0);
}

TEST(WireDtypeTest, Float16OverflowIsInfinityAndNanStaysNan) {
  const float values[] = {70000.f, -1e30f, std::numeric_limits<float>::quiet_NaN()};
  char wire[6];
  float back[3];
  EncodeFloats(WireDtype::kFloat16, values, 3, wire);
  DecodeFloats(WireDtype::kFloat16, wire, 3, back);
  EXPECT_EQ(back[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(back[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(back[2]));
  EncodeFloats(WireDtype::kBfloat16, values + 2, 1, wire);
  DecodeFloats(WireDtype::kBfloat16, wire, 1, back);
  EXPECT_TRUE(std::isnan(back[0]));
}

TEST(WireDtypeTest, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between two bfloat16 values: even (1.0) wins; and
  // 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
  const float values[] = {1.f + 1.f / 256, 1.f + 3.f / 256};
  char wire[4];
  float back[2];
  EncodeFloats(WireDtype::kBfloat16, values, 2, wire);
  DecodeFloats(WireDtype::kBfloat16, wire, 2, back);
  EXPECT_EQ(back[0], 1.f);
  EXPECT_EQ(back[1], 1.f + 1.f / 64);
}

}  // namespace
}  // namespace downpour
