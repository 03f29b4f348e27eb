#include "data/example.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/example.pb.h"

namespace downpour {
namespace data {
namespace {

const char* KindName(const tensorflow::Feature& feature) {
  switch (feature.kind_case()) {
    case tensorflow::Feature::kBytesList:
      return "bytes_list";
    case tensorflow::Feature::kFloatList:
      return "float_list";
    case tensorflow::Feature::kInt64List:
      return "int64_list";
    default:
      return "an empty feature";
  }
}

// "a, b, c" (sorted), for errors about a missing key.
std::string FeatureKeys(const tensorflow::Example& example) {
  std::vector<std::string> keys;
  for (const auto& [key, unused] : example.features().feature()) keys.push_back(key);
  if (keys.empty()) return "no features";
  std::sort(keys.begin(), keys.end());
  return absl::StrJoin(keys, ", ");
}

}  // namespace

absl::Status DecodeExample(absl::string_view serialized, const std::string& feature_key,
                           const std::string& label_key, int64_t feature_size, float* features,
                           int32_t* label) {
  ExampleFormat format;
  format.feature_key = feature_key;
  format.label_key = label_key;
  format.feature_size = feature_size;
  format.encoding = FeatureEncoding::kRaw;
  return DecodeExample(serialized, format, features, label);
}

absl::Status DecodeExample(absl::string_view serialized, const ExampleFormat& format,
                           float* features, int32_t* label) {
  const std::string& feature_key = format.feature_key;
  const std::string& label_key = format.label_key;
  const int64_t feature_size = format.feature_size;
  // Reused per thread: parsing into a cleared message keeps its allocations.
  thread_local tensorflow::Example example;
  example.Clear();
  if (serialized.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !example.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    return absl::DataLossError(
        absl::StrCat("record of ", serialized.size(), " bytes is not a valid tensorflow.Example"));
  }
  const auto& map = example.features().feature();

  auto it = map.find(feature_key);
  if (it == map.end()) {
    return absl::InvalidArgumentError(absl::StrCat("example has no feature \"", feature_key,
                                                   "\" (expected ", feature_size,
                                                   " values); it has: ", FeatureKeys(example)));
  }
  const tensorflow::Feature& feature = it->second;
  if (feature.has_bytes_list()) {
    const auto& values = feature.bytes_list().value();
    const bool raw = format.encoding == FeatureEncoding::kRaw ||
                     (format.encoding == FeatureEncoding::kBySize && values.size() == 1 &&
                      static_cast<int64_t>(values[0].size()) == feature_size);
    if (values.size() != 1 || (raw && static_cast<int64_t>(values[0].size()) != feature_size) ||
        (format.encoding == FeatureEncoding::kBySize && !raw &&
         SniffImageFormat(values[0]) == ImageFormat::kUnknown)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature \"", feature_key, "\" has ", values.size(), " bytes value(s) of ",
          values.empty() ? 0 : values[0].size(), " bytes; expected one value of ", feature_size,
          " bytes", format.encoding == FeatureEncoding::kRaw ? "" : " or one PNG or JPEG image"));
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(values[0].data());
    // Reused per thread, like `example`: decoding allocates nothing per record.
    thread_local std::vector<uint8_t> decoded;
    if (!raw) {
      decoded.resize(feature_size);
      absl::Status s = DecodeImage(values[0], format.image, feature_size, decoded.data());
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("feature \"", feature_key, "\": ", s.message()));
      }
      bytes = decoded.data();
    }
    constexpr float kScale = 1.0f / 255.0f;
    for (int64_t i = 0; i < feature_size; ++i) features[i] = bytes[i] * kScale;
  } else if (feature.has_float_list()) {
    const auto& values = feature.float_list().value();
    if (values.size() != feature_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature \"", feature_key, "\" has ", values.size(), " floats; expected ", feature_size));
    }
    std::copy(values.begin(), values.end(), features);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("feature \"", feature_key, "\" is ", KindName(feature),
                     "; expected bytes_list or float_list of ", feature_size, " values"));
  }

  it = map.find(label_key);
  if (it == map.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("example has no label feature \"", label_key,
                     "\" (expected 1 int64); it has: ", FeatureKeys(example)));
  }
  if (!it->second.has_int64_list()) {
    return absl::InvalidArgumentError(absl::StrCat("label feature \"", label_key, "\" is ",
                                                   KindName(it->second),
                                                   "; expected int64_list of 1 value"));
  }
  const auto& labels = it->second.int64_list().value();
  if (labels.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("label feature \"", label_key, "\" has ",
                                                   labels.size(), " values; expected 1"));
  }
  const int64_t value = labels[0];
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("label feature \"", label_key, "\" value ", value, " does not fit int32"));
  }
  *label = static_cast<int32_t>(value);
  return absl::OkStatus();
}

std::string EncodeImageExample(const uint8_t* pixels, int64_t n, int64_t label,
                               const std::vector<int64_t>& shape) {
  tensorflow::Example example;
  auto* map = example.mutable_features()->mutable_feature();
  (*map)["image"].mutable_bytes_list()->add_value(reinterpret_cast<const char*>(pixels),
                                                  static_cast<size_t>(n));
  (*map)["label"].mutable_int64_list()->add_value(label);
  auto* shape_values = (*map)["shape"].mutable_int64_list();
  for (int64_t d : shape) shape_values->add_value(d);

  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    example.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace data
}  // namespace downpour
