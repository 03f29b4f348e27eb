#include "data/augment.h"

#include <algorithm>
#include <cstring>

namespace downpour {
namespace data {

AugmentDraw DrawAugmentation(const AugmentOptions& options, std::mt19937_64* rng) {
  AugmentDraw draw;
  const int padding = std::max(0, options.crop_padding);
  draw.offset_y = padding;
  draw.offset_x = padding;
  if (options.crop_padding > 0) {
    std::uniform_int_distribution<int> offset(0, 2 * padding);
    draw.offset_y = offset(*rng);
    draw.offset_x = offset(*rng);
  }
  if (options.flip_left_right) draw.flip = std::uniform_int_distribution<int>(0, 1)(*rng) == 1;
  return draw;
}

void ApplyAugmentation(const AugmentOptions& options, const AugmentDraw& draw,
                       const ImageShape& shape, const float* in, float* out) {
  const int64_t height = shape.height, width = shape.width, channels = shape.channels;
  const int64_t padding = std::max(0, options.crop_padding);
  const int64_t shift_y = draw.offset_y - padding;
  const int64_t shift_x = draw.offset_x - padding;
  for (int64_t y = 0; y < height; ++y) {
    float* out_row = out + y * width * channels;
    const int64_t src_y = y + shift_y;
    if (src_y < 0 || src_y >= height) {
      std::fill(out_row, out_row + width * channels, 0.0f);
      continue;
    }
    const float* in_row = in + src_y * width * channels;
    for (int64_t x = 0; x < width; ++x) {
      const int64_t src_x = (draw.flip ? width - 1 - x : x) + shift_x;
      float* dst = out_row + x * channels;
      if (src_x < 0 || src_x >= width) {
        std::fill(dst, dst + channels, 0.0f);
      } else {
        std::memcpy(dst, in_row + src_x * channels, channels * sizeof(float));
      }
    }
  }
}

}  // namespace data
}  // namespace downpour
