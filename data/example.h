// Encoding and decoding of tf.train.Example records for supervised training:
// one dense feature (raw uint8 bytes or floats) and one integer class label.
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

namespace downpour {
namespace data {

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
