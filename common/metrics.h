// Prometheus metrics: a registry of counters, gauges and histograms and their
// text exposition (format 0.0.4). prometheus-cpp is not packaged on Debian,
// so this small layer is ours; MetricsHttpServer serves it at /metrics.
//
// Thread-safe: metrics are created under the registry's lock and updated with
// atomics; pointers returned by the registry live as long as the registry, or
// until RemoveSeries removes their series (callers of RemoveSeries make sure
// nobody still updates them). Collectors (AddCollector) run on the thread that
// asks for the exposition.
#ifndef DOWNPOUR_COMMON_METRICS_H_
#define DOWNPOUR_COMMON_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

using MetricLabels = std::map<std::string, std::string>;

// A value that only goes up (requests, bytes, steps).
class Counter {
 public:
  void Increment(double delta = 1.0);
  // Brings the counter up to `total` (never down): for totals read from
  // elsewhere at scrape time (a process's CPU seconds from /proc).
  void RaiseTo(double total);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (loss, queue depth, live nodes).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted in buckets with upper bounds (Prometheus `le`), plus
// their sum and count: latencies and sizes whose distribution matters.
class Histogram {
 public:
  // REQUIRES: `upper_bounds` finite and strictly increasing (+Inf is implied).
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // Per bound, then +Inf (== count).
    double sum = 0;
    uint64_t count = 0;
  };
  // The buckets as cumulative counts: one read of each, so count equals the
  // +Inf bucket even while observations arrive.
  Snapshot Read() const;
  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1.
  std::atomic<double> sum_{0.0};
};

// Bounds for durations in seconds, 100 us to 60 s (about x2.5 apart): a GPU
// step or a loopback RPC in the first buckets, a CPU step or a SYNC pull
// waiting for stragglers in the last.
const std::vector<double>& SecondsBuckets();

// Seconds from `start` to now, to observe into a SecondsBuckets histogram.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the metric for (name, labels), creating it on first use.
  // REQUIRES: a name is used for one kind of metric only, with the same help
  // (and, for a histogram, the same bounds: the first call's are kept).
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const MetricLabels& labels = {},
                          const std::vector<double>& upper_bounds = SecondsBuckets());

  // Removes every series of `name` whose labels include all of `match` (e.g.
  // a finished job's series).
  void RemoveSeries(const std::string& name, const MetricLabels& match);
  // The same for every metric (all of a finished job's series at once).
  void RemoveSeries(const MetricLabels& match);

  // `collect` runs at the start of every Exposition, outside the registry's
  // lock, to bring metrics read from elsewhere up to date (a process's
  // /proc numbers, a GPU's memory). It may call the registry. Whatever it
  // refers to must outlive the registry's last exposition.
  void AddCollector(std::function<void()> collect);

  // The whole registry in Prometheus text exposition format.
  std::string Exposition() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Family {
    std::string help;
    Kind kind = Kind::kGauge;
    std::vector<double> upper_bounds;  // Histograms.
    std::map<MetricLabels, std::unique_ptr<Counter>> counters;
    std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
    std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  };
  Family* FamilyFor(const std::string& name, const std::string& help, Kind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex collectors_mu_;  // Serialises collectors; taken before mu_.
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(collectors_mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value for the exposition format.
std::string EscapeLabelValue(const std::string& value);

// A sample value as the exposition writes it: integers in full, others in
// the shortest form that reads back exactly; NaN, +Inf, -Inf.
std::string FormatMetricValue(double value);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_METRICS_H_
