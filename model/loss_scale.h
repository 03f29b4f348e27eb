// The dynamic loss-scale schedule of FP16 training: start at `initial`,
// halve on a step with non-finite gradients (not below 1), double after
// kGrowthInterval consecutive clean steps (capped at kMaxScale), as PyTorch's
// GradScaler does. Pure and thread-compatible.
#ifndef DOWNPOUR_MODEL_LOSS_SCALE_H_
#define DOWNPOUR_MODEL_LOSS_SCALE_H_

#include <cstdint>

namespace downpour {

class DynamicLossScale {
 public:
  static constexpr double kDefaultInitial = 32768.0;  // 2^15.
  static constexpr int64_t kGrowthInterval = 2000;
  static constexpr double kMaxScale = 16777216.0;  // 2^24.

  explicit DynamicLossScale(double initial = kDefaultInitial) : scale_(initial) {}
  double scale() const { return scale_; }
  // Records one step's outcome and moves the scale.
  void Update(bool overflow);
  // Continues from a saved scale (a checkpoint's).
  void Restore(double scale) {
    scale_ = scale;
    clean_steps_ = 0;
  }

 private:
  double scale_;
  int64_t clean_steps_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_LOSS_SCALE_H_
