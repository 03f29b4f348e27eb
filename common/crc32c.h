// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum
// of TFRecord framing and of checkpoint manifests, plus TFRecord's masking.
//
// Thread-safety: all functions are pure and safe to call from any thread.
// Ownership: callers keep ownership of the bytes passed in; nothing is retained.
//
// On x86-64 CPUs with SSE4.2 the hardware crc32 instruction is used (checked at
// run time); elsewhere a slicing-by-8 table implementation.
#ifndef DOWNPOUR_COMMON_CRC32C_H_
#define DOWNPOUR_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace downpour {

// Returns the CRC32C of crc32c(A) extended with `data[0, n)`, where `crc` is
// crc32c(A). Crc32cExtend(0, data, n) == Crc32c(data, n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// Returns the CRC32C of `data[0, n)`.
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// Masks a CRC as TFRecord does (rotate right by 15 bits, add 0xa282ead8), so a
// CRC stored next to the data it covers is not itself a valid CRC of it.
inline uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Inverse of MaskCrc.
inline uint32_t UnmaskCrc(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

// True when the hardware (SSE4.2) path is in use; exposed for tests and benchmarks.
bool Crc32cIsHardwareAccelerated();

namespace crc32c_internal {
// The portable slicing-by-8 implementation, exposed so tests can compare it
// with the hardware path.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
}  // namespace crc32c_internal

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_CRC32C_H_
