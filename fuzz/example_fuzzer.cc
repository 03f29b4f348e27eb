// Fuzzes the tf.Example parser (data/example.h) as the worker's input
// pipeline calls it on each record: the input is one serialized
// tensorflow.Example, decoded with the formats a job spec can ask for — PNG
// or JPEG images (TensorFlow's "image/encoded" keys) of a known shape, told
// apart from raw pixels by size or always encoded; raw pixels or an image of
// a flat input; and the raw-only overload.
//
// Invariant beyond "no crash": an error is DataLoss (not an Example) or
// InvalidArgument (the wrong features) with a message.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "data/example.h"
#include "fuzz/fuzz_check.h"

namespace downpour {
namespace {

data::ExampleFormat Format(const char* feature_key, const char* label_key, int64_t height,
                           int64_t width, int64_t channels, data::FeatureEncoding encoding) {
  data::ExampleFormat format;
  format.feature_key = feature_key;
  format.label_key = label_key;
  format.image = {height, width, channels};
  format.feature_size = format.image.known() ? format.image.size() : height;
  format.encoding = encoding;
  return format;
}

void CheckResult(const absl::Status& status) {
  if (status.ok()) return;
  FUZZ_CHECK(
      (absl::IsDataLoss(status) || absl::IsInvalidArgument(status)) && !status.message().empty(),
      status.ToString());
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using downpour::data::FeatureEncoding;
  static const downpour::data::ExampleFormat kFormats[] = {
      downpour::Format("image/encoded", "image/class/label", 8, 8, 3, FeatureEncoding::kBySize),
      downpour::Format("image/encoded", "image/class/label", 8, 8, 1, FeatureEncoding::kEncoded),
      downpour::Format("image", "label", 16, 0, 0, FeatureEncoding::kBySize),
  };
  const absl::string_view serialized(reinterpret_cast<const char*>(data), size);
  for (const downpour::data::ExampleFormat& format : kFormats) {
    std::vector<float> features(format.feature_size, -1.f);
    int32_t label = 0;
    downpour::CheckResult(
        downpour::data::DecodeExample(serialized, format, features.data(), &label));
  }
  std::vector<float> features(16, -1.f);
  int32_t label = 0;
  downpour::CheckResult(
      downpour::data::DecodeExample(serialized, "image", "label", 16, features.data(), &label));
  return 0;
}
