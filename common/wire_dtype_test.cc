#include "common/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(WireDtypeTest, HalfWidthsRoundTripWithinTheirPrecision) {
  const float values[] = {0.f, 1.f, -2.5f, 1e-3f, 65504.f, 3e-6f, 1e-8f};
  for (WireDtype dtype : {WireDtype::kBfloat16, WireDtype::kFloat16}) {
    ASSERT_EQ(WireBytes(dtype, 7), 14);
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
  ASSERT_EQ(WireBytes(WireDtype::kFloat32, 4), 16);
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

// Values of every sign and several magnitudes, the last block partial.
std::vector<float> Mixed(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = normal(gen) * (i % 7 == 0 ? 100.f : 0.01f);
  return v;
}

TEST(WireDtypeTest, Int8IsAScaleABlockAndAByteAnElement) {
  EXPECT_EQ(WireBytes(WireDtype::kInt8, 0), 0);
  EXPECT_EQ(WireBytes(WireDtype::kInt8, 1), 5);
  EXPECT_EQ(WireBytes(WireDtype::kInt8, 256), 260);
  EXPECT_EQ(WireBytes(WireDtype::kInt8, 257), 265);
  // A block's elements come back within half its step (max |x| / 127).
  const int64_t n = 3 * kInt8Block + 77;
  const std::vector<float> x = Mixed(n, 1);
  std::vector<char> wire(WireBytes(WireDtype::kInt8, n));
  std::vector<float> back(n);
  EncodeFloats(WireDtype::kInt8, x.data(), n, wire.data());
  DecodeFloats(WireDtype::kInt8, wire.data(), n, back.data());
  for (int64_t b = 0; b < n; b += kInt8Block) {
    const int64_t end = std::min(n, b + kInt8Block);
    float absmax = 0.f;
    for (int64_t i = b; i < end; ++i) absmax = std::max(absmax, std::abs(x[i]));
    for (int64_t i = b; i < end; ++i) {
      EXPECT_NEAR(back[i], x[i], absmax / 127 / 2 * 1.0001f) << i;
    }
    // The largest element is exact up to one rounding of the scale.
    for (int64_t i = b; i < end; ++i) {
      if (std::abs(x[i]) == absmax) {
        EXPECT_NEAR(std::abs(back[i]), absmax, absmax * 1e-6f);
      }
    }
  }
  // An all-zero block has scale 0 and decodes to zeros.
  std::vector<float> zeros(kInt8Block, 0.f);
  EncodeFloats(WireDtype::kInt8, zeros.data(), kInt8Block, wire.data());
  DecodeFloats(WireDtype::kInt8, wire.data(), kInt8Block, back.data());
  for (int64_t i = 0; i < kInt8Block; ++i) EXPECT_EQ(back[i], 0.f);
}

TEST(WireDtypeTest, Int8BlockWithAValueNotFiniteDecodesAsNan) {
  std::vector<float> x = Mixed(2 * kInt8Block, 2);
  x[kInt8Block + 5] = std::numeric_limits<float>::infinity();
  std::vector<char> wire(WireBytes(WireDtype::kInt8, x.size()));
  std::vector<float> back(x.size());
  EncodeFloats(WireDtype::kInt8, x.data(), x.size(), wire.data());
  DecodeFloats(WireDtype::kInt8, wire.data(), x.size(), back.data());
  for (int64_t i = 0; i < kInt8Block; ++i) EXPECT_TRUE(std::isfinite(back[i])) << i;
  for (int64_t i = kInt8Block; i < 2 * kInt8Block; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  // A carried push forgets such a block rather than carry a NaN on.
  std::vector<float> carry(x.size(), 0.f);
  EncodeInt8Carrying(x.data(), x.size(), carry.data(), wire.data());
  for (int64_t i = kInt8Block; i < 2 * kInt8Block; ++i) EXPECT_EQ(carry[i], 0.f) << i;
}

TEST(WireDtypeTest, Int8BlockTooSmallToScaleGoesAsZerosAndStaysInTheCarry) {
  // max |x| below 127 x the smallest normal float: 127 / max would not be
  // finite, so the block is sent as zeros and kept whole in the carry.
  std::vector<float> x(kInt8Block, 0.f);
  x[3] = 1e-37f;
  x[9] = -2e-38f;
  std::vector<float> carry(kInt8Block, 0.f), back(kInt8Block);
  std::vector<char> wire(WireBytes(WireDtype::kInt8, kInt8Block));
  EncodeInt8Carrying(x.data(), kInt8Block, carry.data(), wire.data());
  DecodeFloats(WireDtype::kInt8, wire.data(), kInt8Block, back.data());
  for (int64_t i = 0; i < kInt8Block; ++i) {
    EXPECT_EQ(back[i], 0.f) << i;
    EXPECT_EQ(carry[i], x[i]) << i;
  }
}

TEST(WireDtypeTest, Int8CarryingLosesNothingOverSteps) {
  // What each push drops is carried into the next, so the sum of what was
  // decoded over many steps trails the sum sent by one carry at most.
  const int64_t n = 2 * kInt8Block + 3;
  std::vector<float> carry(n, 0.f), sent(n, 0.f), received(n, 0.f), back(n);
  std::vector<char> wire(WireBytes(WireDtype::kInt8, n));
  for (uint32_t step = 0; step < 50; ++step) {
    const std::vector<float> g = Mixed(n, 100 + step);
    EncodeInt8Carrying(g.data(), n, carry.data(), wire.data());
    DecodeFloats(WireDtype::kInt8, wire.data(), n, back.data());
    for (int64_t i = 0; i < n; ++i) {
      sent[i] += g[i];
      received[i] += back[i];
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(received[i] + carry[i], sent[i], 1e-3f * (1.f + std::abs(sent[i]))) << i;
    EXPECT_LE(std::abs(carry[i]), 100.f * 5 / 127) << i;  // Half a step of a large block.
  }
}

TEST(WireDtypeTest, Int8ChangesKeepTheTwoCopiesEqualBitForBit) {
  // The shard's copy advanced by EncodeInt8Change and the worker's by
  // AddInt8 of the same bytes stay equal, and follow the target within one
  // step's rounding.
  const int64_t n = 5 * kInt8Block + 11;
  std::vector<float> target = Mixed(n, 7);
  std::vector<float> shard_copy = target, worker_copy = target;
  std::vector<char> wire(WireBytes(WireDtype::kInt8, n));
  std::mt19937 gen(3);
  std::normal_distribution<float> step(0.f, 1e-3f);
  for (int s = 0; s < 100; ++s) {
    for (float& t : target) t += step(gen);
    EncodeInt8Change(target.data(), n, shard_copy.data(), wire.data());
    AddInt8(wire.data(), n, worker_copy.data());
    ASSERT_EQ(std::memcmp(shard_copy.data(), worker_copy.data(), n * sizeof(float)), 0) << s;
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(shard_copy[i], target[i], 1e-4f) << i;
}

}  // namespace
}  // namespace downpour
