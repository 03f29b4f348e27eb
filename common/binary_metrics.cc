#include "common/binary_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace downpour {

double BinaryCrossEntropy(double probability, int label) {
  constexpr double kFloor = 1e-15;
  return -std::log(std::max(label != 0 ? probability : 1.0 - probability, kFloor));
}

void BinaryMetrics::Add(double probability, int label) {
  (label != 0 ? positives_ : negatives_).push_back(probability);
  log_loss_sum_ += BinaryCrossEntropy(probability, label);
}

void BinaryMetrics::Merge(const BinaryMetrics& other) {
  positives_.insert(positives_.end(), other.positives_.begin(), other.positives_.end());
  negatives_.insert(negatives_.end(), other.negatives_.begin(), other.negatives_.end());
  log_loss_sum_ += other.log_loss_sum_;
}

double BinaryMetrics::LogLoss() const {
  const int64_t n = examples();
  return n == 0 ? std::numeric_limits<double>::quiet_NaN() : log_loss_sum_ / n;
}

double BinaryMetrics::Auc() {
  if (positives_.empty() || negatives_.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(positives_.begin(), positives_.end());
  std::sort(negatives_.begin(), negatives_.end());
  // For each negative: the positives scored above it, plus half of those tied.
  // Counted in halves so the sum stays an exact integer.
  int64_t twice_correct = 0;
  size_t below = 0, not_above = 0;  // Positives < score and <= score.
  for (double score : negatives_) {
    while (below < positives_.size() && positives_[below] < score) ++below;
    if (not_above < below) not_above = below;
    while (not_above < positives_.size() && positives_[not_above] <= score) ++not_above;
    twice_correct += 2 * static_cast<int64_t>(positives_.size() - not_above) +
                     static_cast<int64_t>(not_above - below);
  }
  return static_cast<double>(twice_correct) /
         (2.0 * static_cast<double>(positives_.size()) * static_cast<double>(negatives_.size()));
}

}  // namespace downpour
