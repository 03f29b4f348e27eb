#include "common/wire_dtype.h"

#include <cstring>

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

}  // namespace

int BytesPerElement(WireDtype dtype) { return dtype == WireDtype::kFloat32 ? 4 : 2; }

DOWNPOUR_VECTOR_CLONES void EncodeFloats(WireDtype dtype, const float* in, int64_t n, char* out) {
  if (dtype == WireDtype::kFloat32) {
    std::memcpy(out, in, n * sizeof(float));
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

}  // namespace downpour
