#include "ps/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

float OrDefault(float value, float fallback) { return value != 0.f ? value : fallback; }

}  // namespace

double LearningRateAt(const OptimizerSpec& spec, int64_t progress) {
  const double base = spec.learning_rate();
  const LearningRateSchedule& schedule = spec.schedule();
  if (progress < 0) progress = 0;
  const int64_t warmup = schedule.warmup_steps();
  if (warmup > 0 && progress < warmup) {
    return base * static_cast<double>(progress + 1) / static_cast<double>(warmup);
  }
  const int64_t s = progress - std::max<int64_t>(warmup, 0);
  const int64_t decay_steps = schedule.decay_steps();
  switch (schedule.kind()) {
    case LearningRateSchedule::STEP:
      if (decay_steps <= 0) return base;
      return base * std::pow(static_cast<double>(schedule.decay_rate()),
                             static_cast<double>(s / decay_steps));
    case LearningRateSchedule::COSINE: {
      if (decay_steps <= 0) return base;
      const double fraction =
          static_cast<double>(std::min(s, decay_steps)) / static_cast<double>(decay_steps);
      return base * 0.5 * (1.0 + std::cos(M_PI * fraction));
    }
    case LearningRateSchedule::CONSTANT:
    default:
      return base;
  }
}

absl::StatusOr<OptimizerKind> OptimizerKindOf(const OptimizerSpec& spec) {
  switch (spec.kind()) {
    case OptimizerSpec::SGD:
      return OptimizerKind::kSgd;
    case OptimizerSpec::MOMENTUM:
      return OptimizerKind::kMomentum;
    case OptimizerSpec::ADAGRAD:
      return OptimizerKind::kAdagrad;
    case OptimizerSpec::ADAM:
      return OptimizerKind::kAdam;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.kind: unknown optimizer ", static_cast<int>(spec.kind())));
  }
}

OptimizerHyperparams HyperparamsAt(const OptimizerSpec& spec, int64_t progress, int64_t update) {
  OptimizerHyperparams hp;
  hp.learning_rate = static_cast<float>(LearningRateAt(spec, progress));
  hp.momentum = OrDefault(spec.momentum(), kDefaultMomentum);
  hp.beta1 = OrDefault(spec.beta1(), kDefaultBeta1);
  hp.beta2 = OrDefault(spec.beta2(), kDefaultBeta2);
  hp.epsilon =
      OrDefault(spec.epsilon(), spec.kind() == OptimizerSpec::ADAGRAD ? kDefaultAdagradEpsilon
                                                                      : kDefaultAdamEpsilon);
  hp.weight_decay = spec.weight_decay();
  hp.step = update < 1 ? 1 : update;
  return hp;
}

}  // namespace downpour
