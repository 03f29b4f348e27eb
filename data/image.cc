#include "data/image.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs size_t and FILE declared before it.
#include "absl/strings/str_cat.h"
#include "jerror.h"  // NOLINT: after jpeglib.h, which it needs
#include "jpeglib.h"
#include "png.h"

namespace downpour {
namespace data {
namespace {

constexpr unsigned char kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr unsigned char kJpegSoi[3] = {0xff, 0xd8, 0xff};

absl::Status SizeMismatch(ImageFormat format, int64_t height, int64_t width, int64_t channels,
                          const ImageShape& shape, int64_t size) {
  if (shape.known()) {
    return absl::InvalidArgumentError(absl::StrCat(ImageFormatName(format), " image is ", height,
                                                   "x", width, " (height x width); the model's ",
                                                   "input_shape is [", shape.height, ", ",
                                                   shape.width, ", ", shape.channels, "]"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ImageFormatName(format), " image is ", height, "x", width, "x", channels, " = ",
                   height * width * channels, " values; the model's input has ", size));
}

absl::Status DecodePng(absl::string_view encoded, const ImageShape& shape, int64_t size,
                       uint8_t* pixels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, encoded.data(), encoded.size())) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG image: ", image.message));
  }
  int64_t channels = shape.channels;
  if (!shape.known()) channels = (image.format & PNG_FORMAT_FLAG_COLOR) != 0 ? 3 : 1;
  const int64_t height = image.height, width = image.width;
  if ((shape.known() && (height != shape.height || width != shape.width)) ||
      (!shape.known() && height * width * channels != size)) {
    png_image_free(&image);
    return SizeMismatch(ImageFormat::kPng, height, width, channels, shape, size);
  }
  // Without an alpha flag the simplified API drops alpha (composing onto black).
  image.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  if (!png_image_finish_read(&image, /*background=*/nullptr, pixels, /*row_stride=*/0,
                             /*colormap=*/nullptr)) {
    const std::string what = image.message;
    png_image_free(&image);
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG image: ", what));
  }
  return absl::OkStatus();
}

// libjpeg reports errors through a callback that must not return: it jumps
// back to DecodeJpeg's setjmp with the message kept here.
struct JpegErrors {
  jpeg_error_mgr manager;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}

// A truncated file ("Premature end of JPEG file", which libjpeg would fill
// with gray) is an error here, as in TensorFlow's decoder. Other warnings
// (level -1: e.g. extraneous bytes before a marker, common in real
// datasets) are decoded through, as TensorFlow and PIL do; trace messages
// (level >= 0) are ignored.
void JpegEmitMessage(j_common_ptr info, int level) {
  if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF) JpegErrorExit(info);
}

// Returns 0 on success, else fills errors->message. Plain C types only
// between setjmp and the jumps, so nothing needs unwinding.
int DecodeJpegOrJump(const unsigned char* data, unsigned long length, const ImageShape& shape,
                     int64_t size, uint8_t* pixels, JpegErrors* errors, int64_t* got_height,
                     int64_t* got_width, int64_t* got_channels) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&errors->manager);
  errors->manager.error_exit = JpegErrorExit;
  errors->manager.emit_message = JpegEmitMessage;
  errors->message[0] = '\0';
  if (setjmp(errors->jump) != 0) {
    jpeg_destroy_decompress(&info);
    return 1;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, data, length);
  jpeg_read_header(&info, TRUE);
  int64_t channels = shape.channels;
  if (!shape.known()) channels = info.num_components == 1 ? 1 : 3;
  info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  info.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&info);
  *got_height = info.output_height;
  *got_width = info.output_width;
  *got_channels = channels;
  if ((shape.known() && (*got_height != shape.height || *got_width != shape.width)) ||
      (!shape.known() && *got_height * *got_width * channels != size) ||
      info.output_components != channels) {
    jpeg_destroy_decompress(&info);
    return 2;
  }
  const int64_t row_bytes = *got_width * channels;
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = pixels + static_cast<int64_t>(info.output_scanline) * row_bytes;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return 0;
}

absl::Status DecodeJpeg(absl::string_view encoded, const ImageShape& shape, int64_t size,
                        uint8_t* pixels) {
  JpegErrors errors;
  int64_t height = 0, width = 0, channels = 0;
  const int rc = DecodeJpegOrJump(reinterpret_cast<const unsigned char*>(encoded.data()),
                                  static_cast<unsigned long>(encoded.size()), shape, size, pixels,
                                  &errors, &height, &width, &channels);
  if (rc == 1)
    return absl::InvalidArgumentError(absl::StrCat("corrupt JPEG image: ", errors.message));
  if (rc == 2) return SizeMismatch(ImageFormat::kJpeg, height, width, channels, shape, size);
  return absl::OkStatus();
}

}  // namespace

ImageFormat SniffImageFormat(absl::string_view bytes) {
  if (bytes.size() >= sizeof(kPngSignature) &&
      std::memcmp(bytes.data(), kPngSignature, sizeof(kPngSignature)) == 0) {
    return ImageFormat::kPng;
  }
  if (bytes.size() >= sizeof(kJpegSoi) &&
      std::memcmp(bytes.data(), kJpegSoi, sizeof(kJpegSoi)) == 0) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    default:
      return "unknown";
  }
}

absl::Status DecodeImage(absl::string_view encoded, const ImageShape& shape, int64_t size,
                         uint8_t* pixels) {
  if (shape.known() && shape.channels != 1 && shape.channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("images decode to 1 (grayscale) or 3 (RGB) channels; the model's input has ",
                     shape.channels));
  }
  switch (SniffImageFormat(encoded)) {
    case ImageFormat::kPng:
      return DecodePng(encoded, shape, size, pixels);
    case ImageFormat::kJpeg:
      return DecodeJpeg(encoded, shape, size, pixels);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("a value of ", encoded.size(), " bytes is neither a PNG nor a JPEG image"));
  }
}

}  // namespace data
}  // namespace downpour
