#include "common/float_arrays.h"

#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

// Every length up to past two AVX-512 vectors (the vector body and its
// tail), against a plain loop, bit for bit.
TEST(FloatArraysTest, AddAndScaleEqualAPlainLoopAtEveryLength) {
  for (int64_t n = 0; n <= 40; ++n) {
    std::vector<float> x(n), sum(n), expected(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = 0.1f * static_cast<float>(i) - 1.3f;
      sum[i] = expected[i] = 1.f / static_cast<float>(i + 3);
    }
    AddInto(x.data(), n, sum.data());
    for (int64_t i = 0; i < n; ++i) expected[i] += x[i];
    EXPECT_EQ(sum, expected) << n;
    ScaleInPlace(0.25f, n, sum.data());
    for (int64_t i = 0; i < n; ++i) expected[i] *= 0.25f;
    EXPECT_EQ(sum, expected) << n;
  }
}

}  // namespace
}  // namespace downpour
