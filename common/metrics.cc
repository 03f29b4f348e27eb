#include "common/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

void AtomicAdd(std::atomic<double>* target, double delta) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrCat(v);
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

bool Matches(const MetricLabels& labels, const MetricLabels& match) {
  for (const auto& [key, value] : match) {
    auto it = labels.find(key);
    if (it == labels.end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

void Counter::Increment(double delta) { AtomicAdd(&value_, delta); }

void Gauge::Add(double delta) { AtomicAdd(&value_, delta); }

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

MetricsRegistry::Family* MetricsRegistry::FamilyFor(const std::string& name,
                                                    const std::string& help, bool is_counter) {
  Family& family = families_[name];
  if (family.help.empty()) {
    family.help = help;
    family.is_counter = is_counter;
  }
  return &family;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, /*is_counter=*/true)->counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, /*is_counter=*/false)->gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

namespace {

template <typename Family>
void EraseMatching(Family& family, const MetricLabels& match) {
  for (auto c = family.counters.begin(); c != family.counters.end();) {
    c = Matches(c->first, match) ? family.counters.erase(c) : std::next(c);
  }
  for (auto g = family.gauges.begin(); g != family.gauges.end();) {
    g = Matches(g->first, match) ? family.gauges.erase(g) : std::next(g);
  }
}

}  // namespace

void MetricsRegistry::RemoveSeries(const std::string& name, const MetricLabels& match) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) EraseMatching(it->second, match);
}

void MetricsRegistry::RemoveSeries(const MetricLabels& match) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, family] : families_) EraseMatching(family, match);
}

std::string MetricsRegistry::Exposition() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", family.is_counter ? "counter" : "gauge", "\n");
    for (const auto& [labels, counter] : family.counters) {
      absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatValue(counter->value()), "\n");
    }
    for (const auto& [labels, gauge] : family.gauges) {
      absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatValue(gauge->value()), "\n");
    }
  }
  return out;
}

}  // namespace downpour
