#include "common/crc32c.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(Crc32cTest, StandardCheckValue) {
  const char kData[] = "123456789";
  EXPECT_EQ(Crc32c(kData, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_internal::ExtendPortable(0, kData, 9), 0xE3069283u);
}

TEST(Crc32cTest, ThirtyTwoZeroBytes) {
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c_internal::ExtendPortable(0, zeros.data(), zeros.size()), 0x8A9136AAu);
}

// Further vectors from RFC 3720 (iSCSI), section B.4.
TEST(Crc32cTest, Rfc3720Vectors) {
  std::vector<uint8_t> ones(32, 0xff);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::vector<uint8_t> inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(Crc32c(inc.data(), inc.size()), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec.data(), dec.size()), 0x113FDB5Cu);
}

TEST(Crc32cTest, EmptyIsZero) { EXPECT_EQ(Crc32c("", 0), 0u); }

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(1000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {0, 1, 3, 7, 8, 9, 500, 999, 1000}) {
    uint32_t crc = Crc32c(data.data(), split);
    crc = Crc32cExtend(crc, data.data() + split, data.size() - split);
    EXPECT_EQ(crc, whole) << "split at " << split;
  }
}

// Long enough for the three interleaved streams (3 x 8 KiB and 3 x 256
// bytes at a time) and every remainder after them.
TEST(Crc32cTest, HardwareMatchesPortableOnLongInputs) {
  std::mt19937 rng(13);
  std::vector<uint8_t> data(3 * 8192 * 3 + 3 * 256 * 2 + 64);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 5, 8}) {
    for (size_t len : {size_t{3 * 8192 - 1}, size_t{3 * 8192}, size_t{3 * 8192 + 3 * 256 + 13},
                       size_t{2 * 3 * 8192 + 700}, data.size() - offset}) {
      EXPECT_EQ(Crc32c(data.data() + offset, len),
                crc32c_internal::ExtendPortable(0, data.data() + offset, len))
          << "offset " << offset << " length " << len;
    }
  }
}

TEST(Crc32cTest, HardwareMatchesPortableAtAllAlignmentsAndLengths) {
  std::mt19937 rng(11);
  std::vector<uint8_t> data(300);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t len = 0; len + offset <= data.size(); len += 7) {
      EXPECT_EQ(Crc32c(data.data() + offset, len),
                crc32c_internal::ExtendPortable(0, data.data() + offset, len))
          << "offset " << offset << " len " << len;
    }
  }
}

TEST(Crc32cTest, MaskRoundTripAndKnownValue) {
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xffffffffu, 0x12345678u}) {
    EXPECT_NE(MaskCrc(crc), crc);
    EXPECT_EQ(UnmaskCrc(MaskCrc(crc)), crc);
  }
  // rot-right-15 of 0 is 0, so the mask of 0 is the delta itself.
  EXPECT_EQ(MaskCrc(0), 0xa282ead8u);
}

TEST(Crc32cTest, FastEnough) {
  std::vector<uint8_t> data(16 << 20, 0x5a);
  const auto start = std::chrono::steady_clock::now();
  uint32_t crc = 0;
  for (int i = 0; i < 4; ++i) crc = Crc32cExtend(crc, data.data(), data.size());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gb_per_s = 4.0 * data.size() / seconds / 1e9;
  std::printf("crc32c: %.2f GB/s (hardware: %d), crc %08x\n", gb_per_s,
              Crc32cIsHardwareAccelerated(), crc);
  // A loose floor so a debug or loaded machine does not flake; table code alone
  // does ~1 GB/s optimised.
  EXPECT_GT(gb_per_s, 0.1);
}

}  // namespace
}  // namespace downpour
