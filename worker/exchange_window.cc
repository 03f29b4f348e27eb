#include "worker/exchange_window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace downpour {

ExchangeWindow ExchangeWindow::Fixed(int depth) {
  Options options;
  options.depths = {std::max(1, depth)};
  options.start = options.depths[0];
  ExchangeWindow window(std::move(options));
  window.phase_ = Phase::kFixed;
  return window;
}

ExchangeWindow::ExchangeWindow(Options options) : options_(std::move(options)) {
  if (options_.depths.empty()) options_.depths = {1};
  std::sort(options_.depths.begin(), options_.depths.end());
  options_.trial_steps = std::max(1, options_.trial_steps);
  // The largest depth at most `start` (or the smallest).
  for (int i = 0; i < static_cast<int>(options_.depths.size()); ++i) {
    if (options_.depths[i] <= options_.start) index_ = i;
  }
  Try(index_, Phase::kMeasure);
}

void ExchangeWindow::Try(int index, Phase phase) {
  trial_index_ = index;
  phase_ = phase;
  samples_.clear();
  // The first step at a new depth still carries the last one's messages.
  skip_ = 1;
}

void ExchangeWindow::Settle() {
  phase_ = Phase::kSettled;
  trial_index_ = index_;
  settled_for_ = 0;
  moved_ = false;
  last_search_ = std::move(search_);
  search_.clear();
}

int ExchangeWindow::Record(double step_seconds) {
  if (phase_ == Phase::kFixed) return depth();
  if (phase_ == Phase::kSettled) {
    if (++settled_for_ >= options_.settle_steps) Try(index_, Phase::kMeasure);
    return options_.depths[trial_index_];
  }
  if (skip_ > 0) {
    --skip_;
    return options_.depths[trial_index_];
  }
  samples_.push_back(step_seconds);
  if (static_cast<int>(samples_.size()) >= options_.trial_steps) {
    auto middle = samples_.begin() + samples_.size() / 2;
    std::nth_element(samples_.begin(), middle, samples_.end());
    TrialEnded(*middle);
  }
  return options_.depths[trial_index_];
}

bool ExchangeWindow::Probe(int direction) {
  const int next = index_ + direction;
  if (next < 0 || next >= static_cast<int>(options_.depths.size())) return false;
  Try(next, direction > 0 ? Phase::kProbeUp : Phase::kProbeDown);
  return true;
}

void ExchangeWindow::TrialEnded(double median) {
  absl::StrAppendFormat(&search_, "%s%d: %.1f ms", search_.empty() ? "" : ", ",
                        options_.depths[trial_index_], median * 1e3);
  switch (phase_) {
    case Phase::kMeasure:
      best_ = median;
      if (!Probe(+1) && !Probe(-1)) Settle();
      return;
    case Phase::kProbeUp:
    case Phase::kProbeDown: {
      const int direction = phase_ == Phase::kProbeUp ? +1 : -1;
      if (median < best_ * (1 - options_.margin)) {
        // Faster: move there and go on the same way.
        index_ = trial_index_;
        best_ = median;
        moved_ = true;
        if (!Probe(direction)) Settle();
        return;
      }
      // Deeper was no faster: shallower, unless this search moved deeper.
      if (direction > 0 && !moved_ && Probe(-1)) return;
      Settle();
      return;
    }
    case Phase::kSettled:
    case Phase::kFixed:
      return;
  }
}

}  // namespace downpour
