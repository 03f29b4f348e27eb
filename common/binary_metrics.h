// AUC and log loss of predicted probabilities against binary labels: the
// metrics of a click-through-rate model (JobSpec.metrics AUC and LOG_LOSS),
// shared by the CTR generator (its Bayes figures) and the worker's test-set
// evaluation.
//
// Thread-safety: a BinaryMetrics is used by one thread at a time; threads (or
// batches) that each keep their own combine them with Merge.
// Ownership: it owns copies of the scores added; nothing is borrowed.
#ifndef DOWNPOUR_COMMON_BINARY_METRICS_H_
#define DOWNPOUR_COMMON_BINARY_METRICS_H_

#include <cstdint>
#include <vector>

namespace downpour {

// -log of the probability given to the label's class: `probability` (of
// class 1) when label != 0, else 1 - probability. The probability is clamped
// to at least 1e-15 first, so a confident mistake costs about 34.5 rather
// than infinity.
double BinaryCrossEntropy(double probability, int label);

// AUC and log loss, examples added one at a time. AUC is exact (the fraction
// of (positive, negative) pairs the positive scores higher, ties counting one
// half), from the sorted scores of each class: 8 bytes per example are kept,
// so a million examples take 8 MB.
class BinaryMetrics {
 public:
  // `probability` is the predicted P(label == 1); label != 0 is positive.
  void Add(double probability, int label);
  // Adds every example `other` holds, as if each had been added here.
  void Merge(const BinaryMetrics& other);

  int64_t examples() const { return positives() + negatives(); }
  int64_t positives() const { return static_cast<int64_t>(positives_.size()); }
  int64_t negatives() const { return static_cast<int64_t>(negatives_.size()); }

  // The mean BinaryCrossEntropy; NaN without examples.
  double LogLoss() const;
  // NaN when either class is missing. Sorts the kept scores (hence not const).
  double Auc();

 private:
  std::vector<double> positives_;
  std::vector<double> negatives_;
  double log_loss_sum_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_BINARY_METRICS_H_
