// BatchReader over image records: TensorFlow's GZIP PNG/JPEG files decoded
// on the reader's thread, random crop and flip (deterministic per seed, and
// each augmented example a crop/flip of the original), and a bad image
// inside a compressed file reported naming the file.
#include <string>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/record_io.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"

namespace downpour {
namespace data {
namespace {

using ::testing::HasSubstr;

constexpr ImageShape kShape{8, 8, 3};

using testing::TestDataDir;

BatchReaderOptions RgbOptions() {
  BatchReaderOptions o;
  o.slices = WholeFiles({"rgb_png.tfrecord.gz", "rgb_jpeg.tfrecord.gz"});
  o.data_dir = TestDataDir();
  o.feature_key = "image/encoded";
  o.label_key = "image/class/label";
  o.feature_size = kShape.size();
  o.image = kShape;
  o.encoding = FeatureEncoding::kEncoded;
  o.compression = Compression::kGzip;
  o.batch_size = 4;
  o.repeat = false;
  return o;
}

std::vector<Batch> ReadAll(const BatchReaderOptions& options) {
  auto reader = BatchReader::Create(options);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<Batch> out;
  if (!reader.ok()) return out;
  Batch batch;
  while (true) {
    absl::StatusOr<bool> got = (*reader)->Next(&batch);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || !*got) break;
    out.push_back(batch);
  }
  return out;
}

TEST(DatasetImageTest, ReadsTensorFlowsGzipPngAndJpegRecords) {
  const std::vector<Batch> batches = ReadAll(RgbOptions());
  ASSERT_EQ(batches.size(), 4u);  // 16 examples, batches of 4.
  int bright = 0;
  for (const Batch& b : batches) {
    ASSERT_EQ(b.size, 4);
    for (int i = 0; i < b.size; ++i) {
      double mean = 0;
      for (int64_t k = 0; k < kShape.size(); ++k) mean += b.features[i * kShape.size() + k];
      mean /= kShape.size();
      // make_tf_reference.py: label 1 images are bright, label 0 dark.
      EXPECT_EQ(b.labels[i], mean > 0.45 ? 1 : 0) << mean;
      bright += b.labels[i];
    }
  }
  EXPECT_EQ(bright, 8);
}

// Whether `augmented` is some crop/flip of `original`.
bool IsAugmentationOf(const AugmentOptions& options, const float* original, const float* augmented,
                      bool* identity) {
  std::vector<float> out(kShape.size());
  for (int oy = 0; oy <= 2 * options.crop_padding; ++oy) {
    for (int ox = 0; ox <= 2 * options.crop_padding; ++ox) {
      for (bool flip : {false, true}) {
        ApplyAugmentation(options, AugmentDraw{oy, ox, flip}, kShape, original, out.data());
        if (std::equal(out.begin(), out.end(), augmented)) {
          *identity = !flip && oy == options.crop_padding && ox == options.crop_padding;
          return true;
        }
      }
    }
  }
  return false;
}

TEST(DatasetImageTest, CropAndFlipAreDeterministicPerSeedAndKeepTheOrder) {
  const std::vector<Batch> plain = ReadAll(RgbOptions());
  BatchReaderOptions options = RgbOptions();
  options.augment.crop_padding = 2;
  options.augment.flip_left_right = true;
  options.seed = 11;
  const std::vector<Batch> a = ReadAll(options);
  const std::vector<Batch> again = ReadAll(options);
  options.seed = 12;
  const std::vector<Batch> other_seed = ReadAll(options);
  ASSERT_EQ(a.size(), plain.size());
  ASSERT_EQ(again.size(), plain.size());
  ASSERT_EQ(other_seed.size(), plain.size());
  int changed = 0;
  bool differs_by_seed = false;
  for (size_t b = 0; b < plain.size(); ++b) {
    EXPECT_EQ(a[b].labels, plain[b].labels);  // Same examples, same order.
    EXPECT_EQ(a[b].features, again[b].features);
    differs_by_seed |= a[b].features != other_seed[b].features;
    for (int i = 0; i < a[b].size; ++i) {
      bool identity = false;
      EXPECT_TRUE(IsAugmentationOf(options.augment, &plain[b].features[i * kShape.size()],
                                   &a[b].features[i * kShape.size()], &identity))
          << "batch " << b << " example " << i;
      changed += !identity;
    }
  }
  EXPECT_TRUE(differs_by_seed);
  // 16 draws out of 50 choices: nearly all change the image.
  EXPECT_GE(changed, 8);
}

TEST(DatasetImageTest, BadImageInACompressedFileNamesTheFile) {
  const std::string dir = testing::NewTempDir();
  tensorflow::Example example;
  auto* map = example.mutable_features()->mutable_feature();
  // A PNG signature followed by nonsense.
  (*map)["image/encoded"].mutable_bytes_list()->add_value(std::string("\x89PNG\r\n\x1a\n", 8) +
                                                          std::string(40, 'z'));
  (*map)["image/class/label"].mutable_int64_list()->add_value(1);
  auto writer = RecordWriter::Open(dir + "/bad.tfrecord.gz", Compression::kGzip);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(example.SerializeAsString()).ok());
  ASSERT_TRUE((*writer)->Close().ok());

  BatchReaderOptions options = RgbOptions();
  options.slices = WholeFiles({"bad.tfrecord.gz"});
  options.data_dir = dir;
  auto reader = BatchReader::Create(options);
  ASSERT_TRUE(reader.ok());
  Batch batch;
  absl::StatusOr<bool> got = (*reader)->Next(&batch);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(dir + "/bad.tfrecord.gz"));
  EXPECT_THAT(got.status().message(), HasSubstr("offset 0 of its uncompressed stream"));
  EXPECT_THAT(got.status().message(), HasSubstr("corrupt PNG image"));
}

TEST(DatasetImageTest, DecodeThreadsGiveTheSameBatches) {
  BatchReaderOptions options = RgbOptions();
  options.augment.crop_padding = 2;
  options.augment.flip_left_right = true;
  options.shuffle_buffer = 5;
  options.batch_size = 6;
  options.repeat = true;
  options.seed = 4;
  std::vector<std::vector<float>> features[2];
  std::vector<std::vector<int32_t>> labels[2];
  for (int run = 0; run < 2; ++run) {
    options.decode_threads = run == 0 ? 1 : 3;
    auto reader = BatchReader::Create(options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    Batch batch;
    for (int b = 0; b < 12; ++b) {  // 72 examples: 4.5 epochs.
      absl::StatusOr<bool> got = (*reader)->Next(&batch);
      ASSERT_TRUE(got.ok() && *got) << got.status();
      features[run].push_back(batch.features);
      labels[run].push_back(batch.labels);
    }
  }
  EXPECT_EQ(labels[0], labels[1]);
  EXPECT_EQ(features[0], features[1]);
}

TEST(DatasetImageTest, WithDecodeThreadsTheFirstBadExampleIsReported) {
  const std::string dir = testing::NewTempDir();
  std::vector<std::string> records;
  for (int i = 0; i < 8; ++i) {
    tensorflow::Example example;
    auto* map = example.mutable_features()->mutable_feature();
    // Examples 5 and 6 hold a feature of the wrong size; the rest are fine.
    const int64_t n = (i == 5 || i == 6) ? 7 : kShape.size();
    (*map)["image/encoded"].mutable_bytes_list()->add_value(std::string(n, '\x10'));
    (*map)["image/class/label"].mutable_int64_list()->add_value(i);
    records.push_back(example.SerializeAsString());
  }
  testing::WriteRecordsOrDie(dir + "/some-bad.tfrecord", records);
  BatchReaderOptions options = RgbOptions();
  options.slices = WholeFiles({"some-bad.tfrecord"});
  options.data_dir = dir;
  options.encoding = FeatureEncoding::kRaw;
  options.compression = Compression::kAuto;
  options.decode_threads = 4;
  auto reader = BatchReader::Create(options);
  ASSERT_TRUE(reader.ok());
  Batch batch;
  absl::StatusOr<bool> got = (*reader)->Next(&batch);  // Examples 0-3.
  ASSERT_TRUE(got.ok() && *got) << got.status();
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{0, 1, 2, 3}));
  got = (*reader)->Next(&batch);
  ASSERT_FALSE(got.ok());
  // Example 5's offset: five records before it, each framed.
  const size_t offset = 5 * (records[0].size() + kRecordHeaderBytes + kRecordFooterBytes);
  EXPECT_THAT(got.status().message(),
              HasSubstr("some-bad.tfrecord at offset " + std::to_string(offset) + ":"));
}

TEST(DatasetImageTest, AugmentationNeedsAnImageShape) {
  BatchReaderOptions options = RgbOptions();
  options.image = ImageShape();
  options.augment.flip_left_right = true;
  EXPECT_FALSE(BatchReader::Create(options).ok());
}

}  // namespace
}  // namespace data
}  // namespace downpour
