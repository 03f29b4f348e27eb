#include "common/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/platform/vector_clones.h"

namespace downpour {
namespace {

// Branch-free (a select for NaN), so the loops over it vectorize: a pull of
// a bf16 job's weights narrows megabytes of them a step.
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  const uint16_t quiet_nan = static_cast<uint16_t>((u >> 16) | 0x40);
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Overflow: inf.
  if (abs < 0x38800000u) {  // Subnormal half (or zero): round at the 2^-24 grid.
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    // Adding 0.5 moves the value's bits so the low mantissa bits are the
    // half's subnormal mantissa, rounded to nearest even by the FPU.
    const float shifted = magnitude + 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return static_cast<uint16_t>(sign | (bits - 0x3f000000u));
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mantissa_odd;  // Rebias exponent (-112 << 23) and round.
  return static_cast<uint16_t>(sign | (abs >> 13));
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * (1.f / 16777216.f);  // 2^-24.
    std::memcpy(&u, &magnitude, 4);
    u |= sign;
  } else if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Int8 blocks: the scale (float32), then one int8 per element.
constexpr int64_t kScaleBytes = sizeof(float);
constexpr int64_t kInt8BlockBytes = kScaleBytes + kInt8Block;

// One block of `count` values at `out`: the scale and the int8s. Returns the
// scale: max |x| / 127, NaN where a value is not finite. Written to
// vectorise: the largest magnitude from the values' bits (an integer max,
// which orders finite magnitudes as floats and puts infinity and NaN above
// them all), x / scale rounded in the FPU's mode (adding and taking away
// 1.5 * 2^23; nearbyint needs SSE4.1) into int32, then narrowed.
inline float QuantizeBlock(const float* __restrict x, int64_t count, char* __restrict out) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    largest = std::max(largest, bits & 0x7fffffffu);
  }
  float absmax;
  std::memcpy(&absmax, &largest, sizeof(absmax));
  const bool bad = largest >= 0x7f800000u;
  // A block too small for 127 / max |x| to be finite (below 127 x the
  // smallest normal float) goes as zeros, with scale 0: what it held stays
  // in the carry, or in the change still to send.
  const bool tiny = absmax < 127.f * std::numeric_limits<float>::min();
  const float scale = bad ? std::numeric_limits<float>::quiet_NaN() : tiny ? 0.f : absmax / 127.f;
  const float inverse = bad || tiny ? 0.f : 127.f / absmax;
  std::memcpy(out, &scale, sizeof(scale));
  alignas(64) int32_t rounded[kInt8Block];
  for (int64_t i = 0; i < count; ++i) {
    const float r = (x[i] * inverse + 12582912.f) - 12582912.f;
    rounded[i] = static_cast<int32_t>(std::min(127.f, std::max(-127.f, r)));
  }
  int8_t* q = reinterpret_cast<int8_t*>(out + kScaleBytes);
  for (int64_t i = 0; i < count; ++i) q[i] = static_cast<int8_t>(rounded[i]);
  return scale;
}

inline float ScaleOf(const char* block) {
  float scale;
  std::memcpy(&scale, block, sizeof(scale));
  return scale;
}

inline const int8_t* Int8sOf(const char* block) {
  return reinterpret_cast<const int8_t*>(block + kScaleBytes);
}

}  // namespace

int64_t WireBytes(WireDtype dtype, int64_t n) {
  switch (dtype) {
    case WireDtype::kFloat32:
      return 4 * n;
    case WireDtype::kBfloat16:
    case WireDtype::kFloat16:
      return 2 * n;
    case WireDtype::kInt8:
      break;
  }
  return n + kScaleBytes * ((n + kInt8Block - 1) / kInt8Block);
}

DOWNPOUR_VECTOR_CLONES void EncodeFloats(WireDtype dtype, const float* in, int64_t n, char* out) {
  if (dtype == WireDtype::kFloat32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  if (dtype == WireDtype::kInt8) {
    for (int64_t at = 0; at < n; at += kInt8Block, out += kInt8BlockBytes) {
      QuantizeBlock(in + at, std::min(kInt8Block, n - at), out);
    }
    return;
  }
  uint16_t* halves = reinterpret_cast<uint16_t*>(out);
  if (dtype == WireDtype::kBfloat16) {
    for (int64_t i = 0; i < n; ++i) halves[i] = FloatToBf16(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) halves[i] = FloatToFp16(in[i]);
  }
}

DOWNPOUR_VECTOR_CLONES void DecodeFloats(WireDtype dtype, const char* in, int64_t n, float* out) {
  if (dtype == WireDtype::kFloat32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  if (dtype == WireDtype::kInt8) {
    for (int64_t at = 0; at < n; at += kInt8Block, in += kInt8BlockBytes) {
      const int64_t count = std::min(kInt8Block, n - at);
      const float scale = ScaleOf(in);
      const int8_t* q = Int8sOf(in);
      for (int64_t i = 0; i < count; ++i) out[at + i] = static_cast<float>(q[i]) * scale;
    }
    return;
  }
  if (dtype == WireDtype::kBfloat16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      out[i] = Bf16ToFloat(h);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Fp16ToFloat(h);
  }
}

DOWNPOUR_VECTOR_CLONES void EncodeInt8Carrying(const float* x, int64_t n, float* carry, char* out) {
  alignas(64) float sum[kInt8Block];
  for (int64_t at = 0; at < n; at += kInt8Block, out += kInt8BlockBytes) {
    const int64_t count = std::min(kInt8Block, n - at);
    float* __restrict c = carry + at;
    for (int64_t i = 0; i < count; ++i) sum[i] = x[at + i] + c[i];
    const float scale = QuantizeBlock(sum, count, out);
    const int8_t* q = Int8sOf(out);
    if (std::isfinite(scale)) {
      for (int64_t i = 0; i < count; ++i) c[i] = sum[i] - static_cast<float>(q[i]) * scale;
    } else {
      std::fill(c, c + count, 0.f);
    }
  }
}

DOWNPOUR_VECTOR_CLONES void EncodeInt8Change(const float* target, int64_t n, float* held,
                                             char* out) {
  alignas(64) float change[kInt8Block];
  for (int64_t at = 0; at < n; at += kInt8Block, out += kInt8BlockBytes) {
    const int64_t count = std::min(kInt8Block, n - at);
    float* __restrict h = held + at;
    for (int64_t i = 0; i < count; ++i) change[i] = target[at + i] - h[i];
    const float scale = QuantizeBlock(change, count, out);
    const int8_t* q = Int8sOf(out);
    for (int64_t i = 0; i < count; ++i) h[i] = h[i] + static_cast<float>(q[i]) * scale;
  }
}

DOWNPOUR_VECTOR_CLONES void AddInt8(const char* in, int64_t n, float* held) {
  for (int64_t at = 0; at < n; at += kInt8Block, in += kInt8BlockBytes) {
    const int64_t count = std::min(kInt8Block, n - at);
    const float scale = ScaleOf(in);
    const int8_t* q = Int8sOf(in);
    float* __restrict h = held + at;
    for (int64_t i = 0; i < count; ++i) h[i] = h[i] + static_cast<float>(q[i]) * scale;
  }
}

}  // namespace downpour
