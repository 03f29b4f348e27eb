#include "common/metrics.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(MetricsRegistryTest, ExpositionHasHelpTypeAndLabelledSeries) {
  MetricsRegistry registry;
  registry.GetCounter("dp_pushes_total", "Pushes.", {{"job", "a"}})->Increment(3);
  registry.GetCounter("dp_pushes_total", "Pushes.", {{"job", "b\"x"}})->Increment();
  registry.GetGauge("dp_loss", "Loss.")->Set(0.5);
  const std::string text = registry.Exposition();
  EXPECT_NE(text.find("# HELP dp_pushes_total Pushes.\n# TYPE dp_pushes_total counter\n"),
            std::string::npos);
  EXPECT_NE(text.find("dp_pushes_total{job=\"a\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("dp_pushes_total{job=\"b\\\"x\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE dp_loss gauge\ndp_loss 0.5\n"), std::string::npos);
}

TEST(MetricsRegistryTest, SameNameAndLabelsGiveSameMetric) {
  MetricsRegistry registry;
  Counter* a = registry.GetCounter("c", "h", {{"k", "v"}});
  EXPECT_EQ(a, registry.GetCounter("c", "h", {{"k", "v"}}));
  EXPECT_NE(a, registry.GetCounter("c", "h", {{"k", "w"}}));
}

TEST(MetricsRegistryTest, RemoveSeriesDropsMatchingLabels) {
  MetricsRegistry registry;
  registry.GetGauge("g", "h", {{"job", "a"}, {"rank", "0"}})->Set(1);
  registry.GetGauge("g", "h", {{"job", "b"}, {"rank", "0"}})->Set(2);
  registry.RemoveSeries("g", {{"job", "a"}});
  const std::string text = registry.Exposition();
  EXPECT_EQ(text.find("job=\"a\""), std::string::npos);
  EXPECT_NE(text.find("job=\"b\""), std::string::npos);
}

TEST(MetricsRegistryTest, RemoveSeriesOfEveryMetricDropsAJobsSeries) {
  MetricsRegistry registry;
  registry.GetGauge("g", "h", {{"job", "a"}})->Set(1);
  registry.GetCounter("c", "h", {{"job", "a"}, {"rank", "0"}})->Increment(1);
  registry.GetCounter("c", "h", {{"job", "b"}})->Increment(1);
  registry.GetGauge("up", "h")->Set(1);
  registry.RemoveSeries({{"job", "a"}});
  const std::string text = registry.Exposition();
  EXPECT_EQ(text.find("job=\"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("c{job=\"b\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("up 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace downpour
