#include "common/binary_metrics.h"

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

void AddAll(const std::vector<std::pair<double, int>>& examples, BinaryMetrics* metrics) {
  for (const auto& [probability, label] : examples) metrics->Add(probability, label);
}

TEST(BinaryMetricsTest, AucOfASmallSetWithTies) {
  BinaryMetrics metrics;
  AddAll({{0.8, 1}, {0.4, 0}, {0.6, 1}, {0.2, 0}, {0.4, 1}, {0.7, 0}}, &metrics);
  EXPECT_EQ(metrics.examples(), 6);
  EXPECT_EQ(metrics.positives(), 3);
  EXPECT_EQ(metrics.negatives(), 3);
  // Positives 0.8, 0.6, 0.4 against negatives 0.2, 0.4, 0.7: 0.8 beats 3;
  // 0.6 beats 2; 0.4 beats 1 and ties 1 (one half). 6.5 of 9 pairs.
  EXPECT_DOUBLE_EQ(metrics.Auc(), 6.5 / 9);
}

TEST(BinaryMetricsTest, EveryScoreTiedIsOneHalf) {
  BinaryMetrics metrics;
  AddAll({{0.3, 1}, {0.3, 0}, {0.3, 0}, {0.3, 1}}, &metrics);
  EXPECT_DOUBLE_EQ(metrics.Auc(), 0.5);
}

TEST(BinaryMetricsTest, PerfectRankingIsOneAndInverseIsZero) {
  BinaryMetrics perfect, inverse;
  for (int i = 0; i < 10; ++i) {
    const double p = (i + 0.5) / 10;
    const int label = i >= 5 ? 1 : 0;
    perfect.Add(p, label);
    inverse.Add(p, 1 - label);
  }
  EXPECT_DOUBLE_EQ(perfect.Auc(), 1.0);
  EXPECT_DOUBLE_EQ(inverse.Auc(), 0.0);
}

TEST(BinaryMetricsTest, LogLossIsTheMeanCrossEntropy) {
  BinaryMetrics metrics;
  AddAll({{0.8, 1}, {0.25, 0}, {0.5, 1}}, &metrics);
  // -(ln 0.8 + ln 0.75 + ln 0.5) / 3 = -ln(0.3) / 3.
  EXPECT_NEAR(metrics.LogLoss(), 0.4013242681, 1e-9);
}

TEST(BinaryMetricsTest, CertainMistakesAreClamped) {
  EXPECT_NEAR(BinaryCrossEntropy(0.0, 1), -std::log(1e-15), 1e-9);
  EXPECT_NEAR(BinaryCrossEntropy(1.0, 0), -std::log(1e-15), 1e-9);
  EXPECT_DOUBLE_EQ(BinaryCrossEntropy(1.0, 1), 0.0);
  BinaryMetrics metrics;
  metrics.Add(0.0, 1);
  metrics.Add(1.0, 1);
  EXPECT_TRUE(std::isfinite(metrics.LogLoss()));
  EXPECT_NEAR(metrics.LogLoss(), -std::log(1e-15) / 2, 1e-9);
}

TEST(BinaryMetricsTest, NaNWhenAClassIsMissing) {
  BinaryMetrics empty;
  EXPECT_TRUE(std::isnan(empty.Auc()));
  EXPECT_TRUE(std::isnan(empty.LogLoss()));
  BinaryMetrics positives_only, negatives_only;
  positives_only.Add(0.3, 1);
  positives_only.Add(0.6, 1);
  negatives_only.Add(0.3, 0);
  EXPECT_TRUE(std::isnan(positives_only.Auc()));
  EXPECT_TRUE(std::isnan(negatives_only.Auc()));
  // Log loss needs no second class.
  EXPECT_NEAR(positives_only.LogLoss(), -(std::log(0.3) + std::log(0.6)) / 2, 1e-12);
}

TEST(BinaryMetricsTest, MergedAccumulatorsEqualOne) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uniform(0, 1);
  BinaryMetrics whole;
  std::vector<BinaryMetrics> parts(3);
  for (int i = 0; i < 999; ++i) {
    // Scores on a coarse grid so that ties occur across the parts.
    const double p = std::floor(uniform(rng) * 20) / 20;
    const int label = uniform(rng) < p ? 1 : 0;
    whole.Add(p, label);
    parts[i % 3].Add(p, label);
  }
  // A part whose scores were already sorted by Auc merges the same.
  parts[1].Auc();
  BinaryMetrics merged;
  for (const BinaryMetrics& part : parts) merged.Merge(part);
  EXPECT_EQ(merged.examples(), whole.examples());
  EXPECT_EQ(merged.positives(), whole.positives());
  EXPECT_DOUBLE_EQ(merged.Auc(), whole.Auc());
  EXPECT_NEAR(merged.LogLoss(), whole.LogLoss(), 1e-12);
  // Merging nothing changes nothing.
  merged.Merge(BinaryMetrics());
  EXPECT_DOUBLE_EQ(merged.Auc(), whole.Auc());
}

}  // namespace
}  // namespace downpour
