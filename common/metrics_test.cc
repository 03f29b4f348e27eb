#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

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

TEST(MetricsRegistryTest, HistogramExposesCumulativeBucketsSumAndCount) {
  MetricsRegistry registry;
  Histogram* h =
      registry.GetHistogram("dp_step_seconds", "Step time.", {{"job", "a"}}, {0.125, 1, 2.5});
  h->Observe(0.0625);
  h->Observe(0.125);  // On a bound: counted in that bucket (le).
  h->Observe(2);
  h->Observe(7);
  const std::string text = registry.Exposition();
  EXPECT_NE(text.find("# HELP dp_step_seconds Step time.\n# TYPE dp_step_seconds histogram\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dp_step_seconds_bucket{job=\"a\",le=\"0.125\"} 2\n"
                      "dp_step_seconds_bucket{job=\"a\",le=\"1\"} 2\n"
                      "dp_step_seconds_bucket{job=\"a\",le=\"2.5\"} 3\n"
                      "dp_step_seconds_bucket{job=\"a\",le=\"+Inf\"} 4\n"
                      "dp_step_seconds_sum{job=\"a\"} 9.1875\n"
                      "dp_step_seconds_count{job=\"a\"} 4\n"),
            std::string::npos)
      << text;
}

TEST(MetricsRegistryTest, HistogramWithoutLabelsAndDefaultBuckets) {
  MetricsRegistry registry;
  registry.GetHistogram("h_seconds", "h")->Observe(0.0001);
  const std::string text = registry.Exposition();
  EXPECT_NE(text.find("h_seconds_bucket{le=\"0.0001\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_bucket{le=\"60\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_count 1\n"), std::string::npos) << text;
  EXPECT_TRUE(std::is_sorted(SecondsBuckets().begin(), SecondsBuckets().end()));
}

TEST(MetricsRegistryTest, HistogramSeriesOfOneNameShareTheFirstBounds) {
  MetricsRegistry registry;
  Histogram* a = registry.GetHistogram("h", "h", {{"k", "a"}}, {1, 2});
  Histogram* b = registry.GetHistogram("h", "h", {{"k", "b"}}, {5});
  EXPECT_EQ(a->upper_bounds(), b->upper_bounds());
  EXPECT_EQ(a, registry.GetHistogram("h", "h", {{"k", "a"}}));
}

TEST(MetricsRegistryTest, HistogramCountsObservationsFromManyThreads) {
  MetricsRegistry registry;
  Histogram* h = registry.GetHistogram("h", "h", {}, {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([h] {
      for (int i = 0; i < 1000; ++i) h->Observe(i % 2 == 0 ? 0.25 : 1.0);
    });
  }
  for (std::thread& t : threads) t.join();
  const Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.count, 4000u);
  EXPECT_EQ(s.cumulative[0], 2000u);
  EXPECT_DOUBLE_EQ(s.sum, 2000 * 0.25 + 2000 * 1.0);
}

TEST(MetricsRegistryTest, RemoveSeriesDropsHistogramsAndEmptyFamilies) {
  MetricsRegistry registry;
  registry.GetHistogram("h", "h", {{"job", "a"}})->Observe(1);
  registry.GetCounter("c_total", "c", {{"job", "a"}})->Increment();
  registry.RemoveSeries({{"job", "a"}});
  EXPECT_EQ(registry.Exposition(), "");
}

TEST(MetricsRegistryTest, CountersRaiseToTotalsReadElsewhereAndNeverGoDown) {
  Counter c;
  c.RaiseTo(2.5);
  EXPECT_EQ(c.value(), 2.5);
  c.RaiseTo(1);
  EXPECT_EQ(c.value(), 2.5);
}

TEST(MetricsRegistryTest, CollectorsRunBeforeEachExposition) {
  MetricsRegistry registry;
  int runs = 0;
  registry.AddCollector([&] { registry.GetGauge("runs", "Collector runs.")->Set(++runs); });
  EXPECT_NE(registry.Exposition().find("runs 1\n"), std::string::npos);
  EXPECT_NE(registry.Exposition().find("runs 2\n"), std::string::npos);
}

TEST(MetricsRegistryTest, ValuesAreWrittenInFullAndHelpIsEscaped) {
  EXPECT_EQ(FormatMetricValue(123456789012.0), "123456789012");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(0.0001), "0.0001");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatMetricValue(1795720226.47), "1795720226.47");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  MetricsRegistry registry;
  registry.GetGauge("g", "a\\b\nc")->Set(1);
  EXPECT_NE(registry.Exposition().find("# HELP g a\\\\b\\nc\n"), std::string::npos)
      << registry.Exposition();
}

}  // namespace
}  // namespace downpour
