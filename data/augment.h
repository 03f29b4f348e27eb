// Random augmentation of image examples for training, as CIFAR-style models
// use it: a random crop after zero padding (pad each side by `padding`
// pixels, then cut a window of the original size at a random position), and
// a random horizontal (left-right) flip with probability 1/2.
//
// The random choices (Draw) are separate from applying them (Apply), so a
// reader draws them in its deterministic example order and applies them
// wherever it decodes.
//
// Thread-safety: Draw uses the generator it is given; Apply is pure.
// Ownership: callers own all buffers.
#ifndef DOWNPOUR_DATA_AUGMENT_H_
#define DOWNPOUR_DATA_AUGMENT_H_

#include <cstdint>
#include <random>

#include "data/image.h"

namespace downpour {
namespace data {

struct AugmentOptions {
  int crop_padding = -1;  // < 0: no random crop; 0: a crop that changes nothing.
  bool flip_left_right = false;

  bool enabled() const { return crop_padding > 0 || flip_left_right; }
};

// One example's random choices: the window's offset in the padded image
// (each in [0, 2 * padding]) and whether to mirror it.
struct AugmentDraw {
  int offset_y = 0;
  int offset_x = 0;
  bool flip = false;
};

// The choices for the next example; without a crop the offsets are `padding`
// (the identity window), without flip `flip` is false.
AugmentDraw DrawAugmentation(const AugmentOptions& options, std::mt19937_64* rng);

// Writes the augmented `in` (an image of `shape`, row-major HWC) to `out`:
//   out(y, x, c) = in(y + offset_y - padding, x' + offset_x - padding, c),
//   x' = flip ? width - 1 - x : x, and 0 where that falls outside the image.
// REQUIRES: shape.known(); `in` and `out` hold shape.size() floats each and do
// not overlap.
void ApplyAugmentation(const AugmentOptions& options, const AugmentDraw& draw,
                       const ImageShape& shape, const float* in, float* out);

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_AUGMENT_H_
