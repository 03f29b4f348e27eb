#include "data/augment.h"

#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace data {
namespace {

// A 2x3 image of 2 channels: value = 10 * (y * 3 + x) + channel + 1 (never 0).
constexpr ImageShape kShape{2, 3, 2};
std::vector<float> Image() {
  std::vector<float> v;
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 3; ++x) {
      for (int c = 0; c < 2; ++c) v.push_back(10 * (y * 3 + x) + c + 1);
    }
  }
  return v;
}

std::vector<float> Apply(const AugmentOptions& o, const AugmentDraw& d) {
  const std::vector<float> in = Image();
  std::vector<float> out(in.size(), -1);
  ApplyAugmentation(o, d, kShape, in.data(), out.data());
  return out;
}

TEST(AugmentTest, IdentityWindowWithoutFlipChangesNothing) {
  AugmentOptions o;
  o.crop_padding = 2;
  EXPECT_EQ(Apply(o, AugmentDraw{2, 2, false}), Image());
}

TEST(AugmentTest, FlipMirrorsEachRowKeepingChannels) {
  AugmentOptions o;
  o.flip_left_right = true;
  EXPECT_EQ(Apply(o, AugmentDraw{0, 0, true}),
            (std::vector<float>{21, 22, 11, 12, 1, 2, 51, 52, 41, 42, 31, 32}));
}

TEST(AugmentTest, ShiftedWindowFillsWithZeros) {
  AugmentOptions o;
  o.crop_padding = 1;
  // offset (0, 0): the window starts one pixel above and left of the image.
  EXPECT_EQ(Apply(o, AugmentDraw{0, 0, false}),
            (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 11, 12}));
  // offset (1, 2): one pixel to the right.
  EXPECT_EQ(Apply(o, AugmentDraw{1, 2, false}),
            (std::vector<float>{11, 12, 21, 22, 0, 0, 41, 42, 51, 52, 0, 0}));
  // Cropped, then mirrored.
  EXPECT_EQ(Apply(o, AugmentDraw{1, 2, true}),
            (std::vector<float>{0, 0, 21, 22, 11, 12, 0, 0, 51, 52, 41, 42}));
}

TEST(AugmentTest, DrawsCoverEveryWindowAndBothFlipsDeterministically) {
  AugmentOptions o;
  o.crop_padding = 2;
  o.flip_left_right = true;
  std::mt19937_64 a(7), b(7);
  std::set<std::tuple<int, int, bool>> seen;
  for (int i = 0; i < 2000; ++i) {
    const AugmentDraw d = DrawAugmentation(o, &a);
    const AugmentDraw e = DrawAugmentation(o, &b);
    ASSERT_EQ(std::tie(d.offset_y, d.offset_x, d.flip), std::tie(e.offset_y, e.offset_x, e.flip));
    ASSERT_GE(d.offset_y, 0);
    ASSERT_LE(d.offset_y, 4);
    ASSERT_GE(d.offset_x, 0);
    ASSERT_LE(d.offset_x, 4);
    seen.insert({d.offset_y, d.offset_x, d.flip});
  }
  EXPECT_EQ(seen.size(), 5u * 5u * 2u);

  AugmentOptions off;
  std::mt19937_64 c(7);
  const AugmentDraw d = DrawAugmentation(off, &c);
  EXPECT_FALSE(d.flip);
  EXPECT_EQ(d.offset_y, 0);
  EXPECT_FALSE(off.enabled());
}

}  // namespace
}  // namespace data
}  // namespace downpour
