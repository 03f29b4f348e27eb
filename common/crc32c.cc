#include "common/crc32c.h"

#include <array>
#include <cstddef>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define DOWNPOUR_CRC32C_X86 1
#endif

namespace downpour {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

// tables[k][b]: CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  constexpr Tables() : t() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? kPolyReflected : 0u);
      t[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
    }
  }
};

constexpr Tables kTables;

inline uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

// Appending zero bytes to a message as an operator on the raw CRC register
// (zlib's crc32_combine, for CRC32C), so that CRCs computed side by side over
// consecutive blocks can be joined: crc(A B) = Shift_len(B)(crc(A)) ^ crc(B)
// for raw registers, crc(B) started at 0. Each operator is a 32x32 matrix
// over GF(2), applied a byte of the register at a time from 4 tables.
struct ZerosOperator {
  std::array<std::array<uint32_t, 256>, 4> t;

  static constexpr uint32_t Times(const std::array<uint32_t, 32>& mat, uint32_t vec) {
    uint32_t sum = 0;
    for (int i = 0; vec != 0; ++i, vec >>= 1) {
      if (vec & 1u) sum ^= mat[i];
    }
    return sum;
  }
  static constexpr std::array<uint32_t, 32> Square(const std::array<uint32_t, 32>& mat) {
    std::array<uint32_t, 32> out{};
    for (int i = 0; i < 32; ++i) out[i] = Times(mat, mat[i]);
    return out;
  }
  // The operator for `len` zero bytes (len a power of two, >= 1).
  explicit constexpr ZerosOperator(size_t len) : t() {
    std::array<uint32_t, 32> op{};  // One zero bit.
    op[0] = kPolyReflected;
    for (int i = 1; i < 32; ++i) op[i] = uint32_t{1} << (i - 1);
    for (int bits = 0; bits < 3; ++bits) op = Square(op);  // One zero byte.
    for (; len > 1; len >>= 1) op = Square(op);
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 0; k < 4; ++k) t[k][b] = Times(op, b << (8 * k));
    }
  }
  constexpr uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xffu] ^ t[1][(crc >> 8) & 0xffu] ^ t[2][(crc >> 16) & 0xffu] ^
           t[3][crc >> 24];
  }
};

#ifdef DOWNPOUR_CRC32C_X86
// Three blocks side by side: crc32q has a latency of 3 cycles and a
// throughput of 1, so three independent streams run about 3x one stream's
// rate (a checkpoint's tens of MB are checksummed as they are written).
constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;
constexpr ZerosOperator kLongZeros(kLongBlock);
constexpr ZerosOperator kShortZeros(kShortBlock);

template <size_t kBlock>
__attribute__((target("sse4.2"))) inline const uint8_t* ThreeStreams(const ZerosOperator& zeros,
                                                                     uint64_t* crc,
                                                                     const uint8_t* p, size_t* n) {
  uint64_t c0 = *crc;
  while (*n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    for (const uint8_t* end = p + kBlock; p < end; p += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p, sizeof(v0));
      std::memcpy(&v1, p + kBlock, sizeof(v1));
      std::memcpy(&v2, p + 2 * kBlock, sizeof(v2));
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c0 = zeros.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = zeros.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 2 * kBlock;
    *n -= 3 * kBlock;
  }
  *crc = c0;
  return p;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  p = ThreeStreams<kLongBlock>(kLongZeros, &c, p, &n);
  p = ThreeStreams<kShortBlock>(kShortZeros, &c, p, &n);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

bool DetectSse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif

}  // namespace

namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const auto& t = kTables.t;
  uint32_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
    --n;
  }
  while (n >= 8) {
    uint64_t v = LoadLE64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
    --n;
  }
  return ~c;
}

}  // namespace crc32c_internal

bool Crc32cIsHardwareAccelerated() {
#ifdef DOWNPOUR_CRC32C_X86
  static const bool kHasSse42 = DetectSse42();
  return kHasSse42;
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#ifdef DOWNPOUR_CRC32C_X86
  if (Crc32cIsHardwareAccelerated()) return ExtendSse42(crc, data, n);
#endif
  return crc32c_internal::ExtendPortable(crc, data, n);
}

}  // namespace downpour
