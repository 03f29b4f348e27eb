#include "spec/params.h"

#include <cmath>

#include "common/splitmix64.h"

namespace downpour {
namespace {

// Uniform in [-1, 1).
float Symmetric(uint64_t seed, int32_t id, int64_t index) {
  const uint64_t bits = SplitMix64(SplitMix64(seed ^ (static_cast<uint64_t>(id) << 40)) + index);
  return static_cast<float>((bits >> 40) * (1.0 / (1ULL << 24)) * 2.0 - 1.0);
}

}  // namespace

void InitParamRange(const ParamInfo& param, uint64_t seed, int64_t offset, int64_t count,
                    float* out) {
  float limit = 0.f;
  switch (param.init) {
    case ParamInit::kZeros:
      for (int64_t i = 0; i < count; ++i) out[i] = 0.f;
      return;
    case ParamInit::kOnes:
      for (int64_t i = 0; i < count; ++i) out[i] = 1.f;
      return;
    case ParamInit::kHeUniform:
      limit = std::sqrt(6.f / static_cast<float>(param.fan_in > 0 ? param.fan_in : 1));
      break;
    case ParamInit::kGlorotUniform:
      limit =
          std::sqrt(6.f / static_cast<float>(
                              param.fan_in + param.fan_out > 0 ? param.fan_in + param.fan_out : 1));
      break;
    case ParamInit::kFanInUniform:
      limit = 1.f / std::sqrt(static_cast<float>(param.fan_in > 0 ? param.fan_in : 1));
      break;
  }
  for (int64_t i = 0; i < count; ++i) out[i] = limit * Symmetric(seed, param.id, offset + i);
}

}  // namespace downpour
