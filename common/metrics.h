// Prometheus metrics: a registry of counters and gauges and their text
// exposition (format 0.0.4). prometheus-cpp is not packaged on Debian, so this
// small layer is ours; MetricsHttpServer serves it at /metrics.
//
// Thread-safe: metrics are created under the registry's lock and updated with
// atomics; pointers returned by the registry live as long as the registry.
#ifndef DOWNPOUR_COMMON_METRICS_H_
#define DOWNPOUR_COMMON_METRICS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace downpour {

using MetricLabels = std::map<std::string, std::string>;

// A value that only goes up (requests, bytes, steps).
class Counter {
 public:
  void Increment(double delta = 1.0);
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

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the counter or gauge for (name, labels), creating it on first use.
  // REQUIRES: a name is used for one kind of metric only, with the same help.
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});

  // Removes every series of `name` whose labels include all of `match` (e.g.
  // a finished job's series).
  void RemoveSeries(const std::string& name, const MetricLabels& match);
  // The same for every metric (all of a finished job's series at once).
  void RemoveSeries(const MetricLabels& match);

  // The whole registry in Prometheus text exposition format.
  std::string Exposition() const;

 private:
  struct Family {
    std::string help;
    bool is_counter = false;
    std::map<MetricLabels, std::unique_ptr<Counter>> counters;
    std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
  };
  Family* FamilyFor(const std::string& name, const std::string& help, bool is_counter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value for the exposition format.
std::string EscapeLabelValue(const std::string& value);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_METRICS_H_
