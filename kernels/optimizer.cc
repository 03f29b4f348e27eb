#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <utility>

namespace downpour {

int NumOptimizerSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kAdagrad:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

namespace {

// 1 - beta1^t, in double.
double FirstBias(float beta1, int64_t step) {
  return 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step < 1 ? 1 : step));
}

// 1 / sqrt(1 - beta2^t).
float InvSqrtSecondBias(float beta2, int64_t step) {
  return static_cast<float>(1.0 /
                            std::sqrt(1.0 - std::pow(static_cast<double>(beta2),
                                                     static_cast<double>(step < 1 ? 1 : step))));
}

AdamCorrections Computed(const OptimizerHyperparams& hp) {
  return {static_cast<float>(hp.learning_rate / FirstBias(hp.beta1, hp.step)),
          InvSqrtSecondBias(hp.beta2, hp.step)};
}

}  // namespace

AdamCorrections AdamBiasCorrections(const OptimizerHyperparams& hp) {
  return hp.adam_bias != nullptr ? hp.adam_bias->At(hp) : Computed(hp);
}

struct AdamBiasTable::Powers {
  double first_bias;
  float inv_sqrt_second_bias;
};

std::shared_ptr<AdamBiasTable> AdamBiasTable::Shared(float beta1, float beta2) {
  static std::mutex mu;
  static auto* tables = new std::map<std::pair<float, float>, std::weak_ptr<AdamBiasTable>>();
  std::lock_guard<std::mutex> lock(mu);
  // Those no one holds any more go first.
  for (auto it = tables->begin(); it != tables->end();) {
    it = it->second.expired() ? tables->erase(it) : std::next(it);
  }
  std::weak_ptr<AdamBiasTable>& held = (*tables)[{beta1, beta2}];
  std::shared_ptr<AdamBiasTable> table = held.lock();
  if (table == nullptr) {
    table = std::make_shared<AdamBiasTable>(beta1, beta2);
    held = table;
  }
  return table;
}

AdamBiasTable::AdamBiasTable(float beta1, float beta2)
    // Not value-initialised: a page is touched once a step count on it is.
    : beta1_(beta1), beta2_(beta2), powers_(new Powers[kSteps]) {}

AdamBiasTable::~AdamBiasTable() { delete[] powers_; }

void AdamBiasTable::FillTo(int64_t step) {
  std::lock_guard<std::mutex> lock(fill_mu_);
  int64_t filled = filled_.load(std::memory_order_relaxed);
  // A page's worth at a time.
  const int64_t to = std::min(kSteps, std::max(step, filled + 256));
  for (; filled < to; ++filled) {
    powers_[filled] = {FirstBias(beta1_, filled + 1), InvSqrtSecondBias(beta2_, filled + 1)};
  }
  filled_.store(filled, std::memory_order_release);
}

AdamCorrections AdamBiasTable::At(const OptimizerHyperparams& hp) {
  const int64_t step = hp.step < 1 ? 1 : hp.step;
  if (step > kSteps) return Computed(hp);
  if (step > filled_.load(std::memory_order_acquire)) FillTo(step);
  const Powers& p = powers_[step - 1];
  return {static_cast<float>(hp.learning_rate / p.first_bias), p.inv_sqrt_second_bias};
}

}  // namespace downpour
