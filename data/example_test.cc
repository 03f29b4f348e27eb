#include "data/example.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"

namespace downpour {
namespace data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ExampleTest, EncodeImageDecodeRoundTrip) {
  std::vector<uint8_t> pixels = {0, 1, 127, 128, 254, 255};
  const std::string serialized = EncodeImageExample(pixels.data(), 6, 7, {2, 3, 1});

  std::vector<float> features(6);
  int32_t label = -1;
  ASSERT_TRUE(DecodeExample(serialized, "image", "label", 6, features.data(), &label).ok());
  EXPECT_EQ(label, 7);
  for (size_t i = 0; i < pixels.size(); ++i) EXPECT_FLOAT_EQ(features[i], pixels[i] / 255.0f);

  tensorflow::Example example;
  ASSERT_TRUE(example.ParseFromString(serialized));
  const auto& map = example.features().feature();
  EXPECT_THAT(map.at("shape").int64_list().value(), ElementsAre(2, 3, 1));
  EXPECT_EQ(map.at("image").bytes_list().value(0).size(), 6u);
}

TEST(ExampleTest, EncodingIsDeterministic) {
  std::vector<uint8_t> pixels(784, 9);
  EXPECT_EQ(EncodeImageExample(pixels.data(), 784, 3, {28, 28, 1}),
            EncodeImageExample(pixels.data(), 784, 3, {28, 28, 1}));
}

TEST(ExampleTest, DecodesFloatList) {
  tensorflow::Example example;
  auto& map = *example.mutable_features()->mutable_feature();
  for (float v : {0.5f, -2.0f, 3.25f}) map["x"].mutable_float_list()->add_value(v);
  map["y"].mutable_int64_list()->add_value(-4);
  std::vector<float> features(3);
  int32_t label = 0;
  ASSERT_TRUE(
      DecodeExample(example.SerializeAsString(), "x", "y", 3, features.data(), &label).ok());
  EXPECT_THAT(features, ElementsAre(0.5f, -2.0f, 3.25f));
  EXPECT_EQ(label, -4);
}

class ExampleErrorTest : public ::testing::Test {
 protected:
  absl::Status Decode(const tensorflow::Example& example, int64_t size = 4) {
    features_.assign(size, 0.0f);
    return DecodeExample(example.SerializeAsString(), "image", "label", size, features_.data(),
                         &label_);
  }
  tensorflow::Example Valid() {
    tensorflow::Example example;
    auto& map = *example.mutable_features()->mutable_feature();
    map["image"].mutable_bytes_list()->add_value("abcd");
    map["label"].mutable_int64_list()->add_value(1);
    return example;
  }
  std::vector<float> features_;
  int32_t label_ = 0;
};

TEST_F(ExampleErrorTest, ValidBaseline) { EXPECT_TRUE(Decode(Valid()).ok()); }

TEST_F(ExampleErrorTest, MissingFeatureNamesKey) {
  auto example = Valid();
  example.mutable_features()->mutable_feature()->erase("image");
  const absl::Status s = Decode(example);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"image\""));
  EXPECT_THAT(s.message(), HasSubstr("label"));  // Lists what is there.
}

TEST_F(ExampleErrorTest, WrongSizeNamesKeyAndSizes) {
  const absl::Status s = Decode(Valid(), 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"image\""));
  EXPECT_THAT(s.message(), HasSubstr("4 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("5 bytes"));
}

TEST_F(ExampleErrorTest, WrongFloatCount) {
  auto example = Valid();
  auto& image = (*example.mutable_features()->mutable_feature())["image"];
  image.mutable_float_list()->add_value(1.0f);
  const absl::Status s = Decode(example);
  EXPECT_THAT(s.message(), HasSubstr("has 1 floats; expected 4"));
}

TEST_F(ExampleErrorTest, FeatureOfWrongKind) {
  auto example = Valid();
  (*example.mutable_features()->mutable_feature())["image"].mutable_int64_list()->add_value(1);
  EXPECT_THAT(Decode(example).message(), HasSubstr("int64_list"));
}

TEST_F(ExampleErrorTest, MissingLabel) {
  auto example = Valid();
  example.mutable_features()->mutable_feature()->erase("label");
  const absl::Status s = Decode(example);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"label\""));
}

TEST_F(ExampleErrorTest, LabelWithTwoValues) {
  auto example = Valid();
  (*example.mutable_features()->mutable_feature())["label"].mutable_int64_list()->add_value(2);
  EXPECT_THAT(Decode(example).message(), HasSubstr("has 2 values; expected 1"));
}

TEST_F(ExampleErrorTest, LabelOutOfInt32Range) {
  auto example = Valid();
  auto* labels = (*example.mutable_features()->mutable_feature())["label"].mutable_int64_list();
  labels->set_value(0, int64_t{1} << 40);
  EXPECT_THAT(Decode(example).message(), HasSubstr("does not fit int32"));
}

TEST(ExampleTest, GarbageIsDataLoss) {
  float f[4];
  int32_t label;
  const absl::Status s =
      DecodeExample(std::string("\xff\xff\xff\xff", 4), "image", "label", 4, f, &label);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace data
}  // namespace downpour
