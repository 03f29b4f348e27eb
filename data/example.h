// Encoding and decoding of tf.train.Example records for supervised training:
// one dense feature (raw uint8 bytes, a PNG or JPEG image, or floats) and one
// integer class label.
//
// Thread-safety: the functions are pure and safe to call from any thread.
// Ownership: callers own all buffers; nothing is retained.
#ifndef DOWNPOUR_DATA_EXAMPLE_H_
#define DOWNPOUR_DATA_EXAMPLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "data/image.h"

namespace downpour {
namespace data {

// How a bytes_list feature holds its values.
enum class FeatureEncoding {
  // Raw uint8 values when the value has exactly feature_size bytes; otherwise
  // a PNG or JPEG image, told apart by its magic bytes.
  kBySize,
  kRaw,      // Always raw uint8 values.
  kEncoded,  // Always a PNG or JPEG image (for tiny images whose file could
             // have exactly feature_size bytes).
};

// What a reader expects of each example.
struct ExampleFormat {
  std::string feature_key = "image";
  std::string label_key = "label";
  int64_t feature_size = 0;  // Elements per example; > 0.
  // The model's input as an image: what PNG/JPEG values decode to. Unknown
  // (zeros) for a flat input, where an image keeps its own channels.
  ImageShape image;
  FeatureEncoding encoding = FeatureEncoding::kBySize;
};

// Parses a serialized tensorflow.Example and writes its features and label.
//
// The feature under `format.feature_key` is either a bytes_list holding
// exactly one value — `feature_size` raw bytes or an encoded image, as
// `format.encoding` says, scaled by 1/255 into [0, 1] — or a float_list of
// exactly `feature_size` values (copied as they are). The label is as below.
// A bad image is InvalidArgumentError naming the feature and what is wrong.
// REQUIRES: `features` has room for `feature_size` floats; `label` is non-null.
absl::Status DecodeExample(absl::string_view serialized, const ExampleFormat& format,
                           float* features, int32_t* label);

// Parses a serialized tensorflow.Example and writes its features and label.
//
// The feature under `feature_key` is either a bytes_list holding exactly one
// value of `feature_size` bytes (uint8 pixels, scaled by 1/255 into [0, 1]) or
// a float_list of exactly `feature_size` values (copied as they are). The label
// under `label_key` is an int64_list of exactly one value that fits in int32.
// A missing key, another kind, or a wrong size is InvalidArgumentError naming
// the key and both sizes; an unparsable record is DataLossError.
// REQUIRES: `features` has room for `feature_size` floats; `label` is non-null.
absl::Status DecodeExample(absl::string_view serialized, const std::string& feature_key,
                           const std::string& label_key, int64_t feature_size, float* features,
                           int32_t* label);

// Returns a serialized tensorflow.Example with features "image" (bytes_list of
// the `n` pixel bytes), "label" (int64_list {label}) and "shape" (int64_list
// `shape`, e.g. {rows, cols, channels}). Serialization is deterministic, so the
// same input always gives the same bytes.
std::string EncodeImageExample(const uint8_t* pixels, int64_t n, int64_t label,
                               const std::vector<int64_t>& shape);

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_EXAMPLE_H_
