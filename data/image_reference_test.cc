// Reads the records TensorFlow wrote (data/testdata, made by
// make_tf_reference.sh): GZIP and uncompressed files of tf.Examples holding
// PNG and JPEG images, and checks every decoded pixel against what
// TensorFlow itself decoded (expected.txt).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "data/dataset.h"
#include "data/example.h"
#include "data/image.h"
#include "data/record_io.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace data {
namespace {

using ::testing::HasSubstr;

std::string TestData(const std::string& name) { return testing::TestDataDir() + "/" + name; }

struct Expected {
  std::string file;
  int index = 0;
  int label = 0;
  std::string format;
  ImageShape shape;
  std::vector<int> pixels;
};

std::vector<Expected> ReadExpected() {
  std::vector<Expected> out;
  for (absl::string_view line :
       absl::StrSplit(testing::ReadFileOrDie(TestData("expected.txt")), '\n')) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    EXPECT_GE(f.size(), 7u) << line;
    if (f.size() < 7) continue;
    Expected e;
    e.file = f[0];
    e.format = f[3];
    EXPECT_TRUE(absl::SimpleAtoi(f[1], &e.index) && absl::SimpleAtoi(f[2], &e.label) &&
                absl::SimpleAtoi(f[4], &e.shape.height) && absl::SimpleAtoi(f[5], &e.shape.width) &&
                absl::SimpleAtoi(f[6], &e.shape.channels))
        << line;
    for (size_t i = 7; i < f.size(); ++i) {
      int v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(f[i], &v)) << f[i];
      e.pixels.push_back(v);
    }
    EXPECT_EQ(static_cast<int64_t>(e.pixels.size()), e.shape.size()) << line;
    out.push_back(std::move(e));
  }
  return out;
}

std::map<std::string, std::vector<std::string>> ReadRecords(const std::vector<Expected>& expected,
                                                            bool* any_gzip) {
  std::map<std::string, std::vector<std::string>> records;
  for (const Expected& e : expected) {
    if (records.count(e.file) != 0) continue;
    auto reader = RecordReader::Open(TestData(e.file));
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) continue;
    *any_gzip |= (*reader)->compressed();
    EXPECT_EQ((*reader)->compressed(),
              e.file.size() > 3 && e.file.substr(e.file.size() - 3) == ".gz")
        << e.file;
    std::string record;
    while (true) {
      absl::StatusOr<bool> got = (*reader)->Read(&record);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok() || !*got) break;
      records[e.file].push_back(record);
    }
  }
  return records;
}

// A decoded feature (pixel / 255) back as the pixel.
int Pixel(float feature) { return static_cast<int>(std::lround(feature * 255.0f)); }

ExampleFormat TfFormat(const ImageShape& shape) {
  ExampleFormat format;
  format.feature_key = "image/encoded";
  format.label_key = "image/class/label";
  format.image = shape;
  format.feature_size = shape.size();
  format.encoding = FeatureEncoding::kEncoded;
  return format;
}

TEST(ImageReferenceTest, EveryPixelMatchesTensorFlow) {
  const std::vector<Expected> expected = ReadExpected();
  ASSERT_EQ(expected.size(), 24u);
  bool any_gzip = false;
  auto records = ReadRecords(expected, &any_gzip);
  EXPECT_TRUE(any_gzip);
  int png = 0, jpeg = 0;
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.file + " #" + std::to_string(e.index));
    ASSERT_LT(e.index, static_cast<int>(records[e.file].size()));
    const std::string& record = records[e.file][e.index];
    std::vector<float> features(e.shape.size());
    int32_t label = -1;
    // As the model's input has the image's own shape, and as a flat input
    // (the image keeps its channels) found by size.
    for (bool flat : {false, true}) {
      ExampleFormat format = TfFormat(e.shape);
      if (flat) format.image = ImageShape();
      ASSERT_TRUE(DecodeExample(record, format, features.data(), &label).ok());
      EXPECT_EQ(label, e.label);
      int mismatched = 0;
      for (int64_t i = 0; i < e.shape.size(); ++i) {
        mismatched += Pixel(features[i]) != e.pixels[i];
      }
      EXPECT_EQ(mismatched, 0) << e.format
                               << " pixels differ from TensorFlow's; first: " << Pixel(features[0])
                               << " vs " << e.pixels[0];
    }
    (e.format == "png" ? png : jpeg) += 1;
  }
  EXPECT_GT(png, 0);
  EXPECT_GT(jpeg, 0);
}

TEST(ImageReferenceTest, GrayscaleBecomesRgbByReplication) {
  const std::vector<Expected> expected = ReadExpected();
  bool any_gzip = false;
  auto records = ReadRecords(expected, &any_gzip);
  int checked = 0;
  for (const Expected& e : expected) {
    if (e.shape.channels != 1) continue;
    SCOPED_TRACE(e.file + " #" + std::to_string(e.index));
    const ImageShape rgb{e.shape.height, e.shape.width, 3};
    std::vector<float> features(rgb.size());
    int32_t label = -1;
    ASSERT_TRUE(
        DecodeExample(records[e.file][e.index], TfFormat(rgb), features.data(), &label).ok());
    for (int64_t p = 0; p < e.shape.size(); ++p) {
      for (int c = 0; c < 3; ++c) ASSERT_EQ(Pixel(features[3 * p + c]), e.pixels[p]) << p;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

TEST(ImageReferenceTest, WrongSizeAndDamagedImagesAreClearErrors) {
  const std::vector<Expected> expected = ReadExpected();
  bool any_gzip = false;
  auto records = ReadRecords(expected, &any_gzip);
  for (const Expected& e : {expected[0], expected[8]}) {  // A PNG and a JPEG.
    SCOPED_TRACE(e.file);
    const std::string& record = records[e.file][e.index];
    std::vector<float> features(64 * 64 * 3);
    int32_t label = -1;
    absl::Status s = DecodeExample(record, TfFormat(ImageShape{7, 8, 3}), features.data(), &label);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("image is 8x8 (height x width)"));
    EXPECT_THAT(s.message(), HasSubstr("input_shape is [7, 8, 3]"));
    EXPECT_THAT(s.message(), HasSubstr("image/encoded"));

    // The image cut short, and with bytes overwritten in its middle, still
    // inside a valid Example.
    std::vector<uint8_t> pixels(e.shape.size());
    const std::string encoded = [&] {
      // The encoded bytes are the only PNG/JPEG value in the record: find its start.
      for (const char* magic : {"\x89PNG", "\xff\xd8\xff"}) {
        const size_t at = record.find(magic);
        if (at != std::string::npos) return record.substr(at);
      }
      return std::string();
    }();
    ASSERT_FALSE(encoded.empty());
    absl::Status cut =
        DecodeImage(encoded.substr(0, encoded.size() / 2), e.shape, e.shape.size(), pixels.data());
    ASSERT_FALSE(cut.ok());
    EXPECT_THAT(cut.message(), HasSubstr("corrupt"));
    if (e.format == "png") {  // PNG's chunk checksums catch any damage.
      std::string damaged = encoded;
      for (size_t i = damaged.size() / 3; i < damaged.size() / 3 + 16; ++i) damaged[i] ^= 0x55;
      absl::Status bad = DecodeImage(damaged, e.shape, e.shape.size(), pixels.data());
      ASSERT_FALSE(bad.ok());
      EXPECT_THAT(bad.message(), HasSubstr("corrupt PNG image"));
    }
  }
  std::vector<uint8_t> pixels(192);
  absl::Status neither = DecodeImage("GIF89a....", ImageShape{8, 8, 3}, 192, pixels.data());
  ASSERT_FALSE(neither.ok());
  EXPECT_THAT(neither.message(), HasSubstr("neither a PNG nor a JPEG"));
}

}  // namespace
}  // namespace data
}  // namespace downpour
