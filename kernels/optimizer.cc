#include "kernels/optimizer.h"

#include <cmath>

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

AdamCorrections AdamBiasCorrections(const OptimizerHyperparams& hp) {
  const double t = static_cast<double>(hp.step < 1 ? 1 : hp.step);
  return {static_cast<float>(hp.learning_rate / (1.0 - std::pow(static_cast<double>(hp.beta1), t))),
          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(hp.beta2), t)))};
}

}  // namespace downpour
