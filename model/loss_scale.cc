#include "model/loss_scale.h"

#include <algorithm>

namespace downpour {

void DynamicLossScale::Update(bool overflow) {
  if (overflow) {
    scale_ = std::max(1.0, scale_ / 2);
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ >= kGrowthInterval) {
    scale_ = std::min(kMaxScale, scale_ * 2);
    clean_steps_ = 0;
  }
}

}  // namespace downpour
