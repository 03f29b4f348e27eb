#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

void AtomicAdd(std::atomic<double>* target, double delta) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

std::string FormatLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : labels) {
    absl::StrAppend(&out, first ? "" : ",", key, "=\"", EscapeLabelValue(value), "\"");
    first = false;
  }
  return out + "}";
}

// HELP text escapes backslash and newline (not quotes).
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool Matches(const MetricLabels& labels, const MetricLabels& match) {
  for (const auto& [key, value] : match) {
    auto it = labels.find(key);
    if (it == labels.end() || it->second != value) return false;
  }
  return true;
}

template <typename Map>
void EraseMatching(Map& series, const MetricLabels& match) {
  for (auto it = series.begin(); it != series.end();) {
    it = Matches(it->first, match) ? series.erase(it) : std::next(it);
  }
}

}  // namespace

void Counter::Increment(double delta) { AtomicAdd(&value_, delta); }

void Counter::RaiseTo(double total) {
  double current = value_.load(std::memory_order_relaxed);
  while (current < total &&
         !value_.compare_exchange_weak(current, total, std::memory_order_relaxed)) {
  }
}

void Gauge::Add(double delta) { AtomicAdd(&value_, delta); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // The first bucket whose bound is >= value (Prometheus' `le`).
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative[i] = running;
  }
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

const std::vector<double>& SecondsBuckets() {
  static const auto* const kBuckets =
      new std::vector<double>{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                              0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *kBuckets;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Byte and step totals in full (absl::StrCat would round them to six
  // digits); 2^53 is where doubles stop holding every integer.
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // Plain decimals where they are short (a timestamp, a latency), an
  // exponent only for the very small and very large.
  const double magnitude = std::fabs(value);
  const std::chars_format format =
      magnitude >= 1e-4 && magnitude < 1e15 ? std::chars_format::fixed : std::chars_format::general;
  char buffer[400];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, format);
  return std::string(buffer, result.ptr);
}

MetricsRegistry::Family* MetricsRegistry::FamilyFor(const std::string& name,
                                                    const std::string& help, Kind kind) {
  auto [it, added] = families_.try_emplace(name);
  if (added) {
    it->second.help = help;
    it->second.kind = kind;
  }
  return &it->second;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, Kind::kCounter)->counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, Kind::kGauge)->gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const MetricLabels& labels,
                                         const std::vector<double>& upper_bounds) {
  absl::MutexLock lock(&mu_);
  Family* family = FamilyFor(name, help, Kind::kHistogram);
  if (family->histograms.empty() && family->upper_bounds.empty()) {
    family->upper_bounds = upper_bounds;
  }
  auto& slot = family->histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(family->upper_bounds);
  return slot.get();
}

void MetricsRegistry::RemoveSeries(const std::string& name, const MetricLabels& match) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  EraseMatching(it->second.counters, match);
  EraseMatching(it->second.gauges, match);
  EraseMatching(it->second.histograms, match);
}

void MetricsRegistry::RemoveSeries(const MetricLabels& match) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, family] : families_) {
    EraseMatching(family.counters, match);
    EraseMatching(family.gauges, match);
    EraseMatching(family.histograms, match);
  }
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&collectors_mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Exposition() const {
  {
    absl::MutexLock lock(&collectors_mu_);
    for (const auto& collect : collectors_) collect();
  }
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    // A family whose series all went (a finished job's) is left out whole:
    // HELP and TYPE with no sample say nothing.
    if (family.counters.empty() && family.gauges.empty() && family.histograms.empty()) continue;
    const char* type = family.kind == Kind::kCounter ? "counter"
                       : family.kind == Kind::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family.help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, counter] : family.counters) {
      absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatMetricValue(counter->value()),
                      "\n");
    }
    for (const auto& [labels, gauge] : family.gauges) {
      absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatMetricValue(gauge->value()),
                      "\n");
    }
    for (const auto& [labels, histogram] : family.histograms) {
      const Histogram::Snapshot snapshot = histogram->Read();
      const std::vector<double>& bounds = histogram->upper_bounds();
      MetricLabels with_le = labels;
      for (size_t i = 0; i <= bounds.size(); ++i) {
        with_le["le"] = i < bounds.size() ? FormatMetricValue(bounds[i]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket", FormatLabels(with_le), " ", snapshot.cumulative[i],
                        "\n");
      }
      absl::StrAppend(&out, name, "_sum", FormatLabels(labels), " ",
                      FormatMetricValue(snapshot.sum), "\n");
      absl::StrAppend(&out, name, "_count", FormatLabels(labels), " ", snapshot.count, "\n");
    }
  }
  return out;
}

}  // namespace downpour
