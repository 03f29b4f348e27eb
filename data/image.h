// Decoding of the PNG and JPEG images that tf.train.Example features hold
// (TensorFlow's "image/encoded" convention), with Debian's libpng and
// libjpeg-turbo, into uint8 pixels laid out as the model's input: row-major
// height x width x channels.
//
// Thread-safety: the functions are pure and safe to call from any thread.
// Ownership: callers own all buffers; nothing is retained.
#ifndef DOWNPOUR_DATA_IMAGE_H_
#define DOWNPOUR_DATA_IMAGE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace downpour {
namespace data {

// The model's input seen as an image. All zero when the input is not an
// image of rank 3 (e.g. input_shape [784]).
struct ImageShape {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;  // 1 (grayscale) or 3 (RGB).

  bool known() const { return height > 0 && width > 0 && channels > 0; }
  int64_t size() const { return height * width * channels; }
};

enum class ImageFormat { kUnknown, kPng, kJpeg };

// The format of `bytes` by its magic bytes (PNG's 8-byte signature, JPEG's
// SOI marker FF D8 FF).
ImageFormat SniffImageFormat(absl::string_view bytes);
const char* ImageFormatName(ImageFormat format);

// Decodes a PNG or JPEG image (by its magic bytes) into `pixels`.
//
// With a known `shape`, the decoded image must be shape.height x shape.width
// (else InvalidArgumentError naming both sizes) and is converted to
// shape.channels as TensorFlow's decode_image(channels=N) does: grayscale is
// replicated into RGB, RGB is reduced to luma, alpha is dropped, palettes and
// 16-bit samples become 8-bit. With an unknown shape, the image keeps its own
// channels (gray or RGB) and must have exactly `size` elements.
// A damaged image (bad header, truncated data, bad checksum) is
// InvalidArgumentError "corrupt PNG image: <what the decoder said>"; bytes that
// are neither PNG nor JPEG are InvalidArgumentError as well.
// REQUIRES: `pixels` has room for `size` bytes; with a known shape, size ==
// shape.size().
absl::Status DecodeImage(absl::string_view encoded, const ImageShape& shape, int64_t size,
                         uint8_t* pixels);

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_IMAGE_H_
