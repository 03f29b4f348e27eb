#include "data/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/example.h"
#include "data/record_io.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace data {
namespace {

using ::testing::HasSubstr;
using testing::NewTempDir;
using testing::ReadFileOrDie;
using testing::WriteFileOrDie;

constexpr int kRows = 3;
constexpr int kCols = 2;

std::string BigEndian32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

// Image i has every pixel equal to i; label i is i % 10.
std::string ImagesIdx(int n) {
  std::string out = BigEndian32(0x803) + BigEndian32(n) + BigEndian32(kRows) + BigEndian32(kCols);
  for (int i = 0; i < n; ++i) out += std::string(kRows * kCols, static_cast<char>(i));
  return out;
}

std::string LabelsIdx(int n) {
  std::string out = BigEndian32(0x801) + BigEndian32(n);
  for (int i = 0; i < n; ++i) out += static_cast<char>(i % 10);
  return out;
}

void WriteGzOrDie(const std::string& path, const std::string& contents) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, contents.data(), contents.size()), static_cast<int>(contents.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Reads every record of `path` and returns the decoded (pixel value, label) pairs.
std::vector<std::pair<int, int>> ReadShard(const std::string& path) {
  std::vector<std::pair<int, int>> out;
  auto reader = RecordReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return out;
  std::string record;
  while (true) {
    auto got = (*reader)->Read(&record);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || !*got) break;
    float features[kRows * kCols];
    int32_t label;
    EXPECT_TRUE(DecodeExample(record, "image", "label", kRows * kCols, features, &label).ok());
    out.emplace_back(static_cast<int>(features[0] * 255.0f + 0.5f), label);
  }
  return out;
}

class IdxImportTest : public ::testing::TestWithParam<bool> {};

TEST_P(IdxImportTest, ImportsRoundRobinShards) {
  const bool gz = GetParam();
  const std::string dir = NewTempDir();
  const std::string images = dir + (gz ? "/images.gz" : "/images");
  const std::string labels = dir + (gz ? "/labels.gz" : "/labels");
  if (gz) {
    WriteGzOrDie(images, ImagesIdx(10));
    WriteGzOrDie(labels, LabelsIdx(10));
  } else {
    WriteFileOrDie(images, ImagesIdx(10));
    WriteFileOrDie(labels, LabelsIdx(10));
  }
  IdxImportOptions options;
  options.images_path = images;
  options.labels_path = labels;
  options.out_dir = dir + "/out/nested";  // Created with its parent.
  options.name = "tiny";
  options.num_shards = 3;
  auto imported = ImportIdx(options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(*imported, 10);

  for (int s = 0; s < 3; ++s) {
    const std::string path = options.out_dir + "/" + ShardFileName("tiny", s, 3);
    std::vector<std::pair<int, int>> expected;
    for (int i = s; i < 10; i += 3) expected.emplace_back(i, i % 10);
    EXPECT_EQ(ReadShard(path), expected) << path;
  }
  EXPECT_EQ(ShardFileName("tiny", 0, 3), "tiny-00000-of-00003.tfrecord");
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxImportTest, ::testing::Bool());

TEST(IdxTest, LimitImportsAPrefix) {
  const std::string dir = NewTempDir();
  WriteFileOrDie(dir + "/images", ImagesIdx(10));
  WriteFileOrDie(dir + "/labels", LabelsIdx(10));
  IdxImportOptions options{dir + "/images", dir + "/labels", dir + "/out", "lim", 1, 4};
  auto imported = ImportIdx(options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(*imported, 4);
  EXPECT_EQ(ReadShard(dir + "/out/lim-00000-of-00001.tfrecord").size(), 4u);
}

TEST(IdxTest, BadMagicNamesFile) {
  const std::string dir = NewTempDir();
  std::string images = ImagesIdx(2);
  images[3] = 0x01;  // Claims one dimension.
  WriteFileOrDie(dir + "/images", images);
  WriteFileOrDie(dir + "/labels", LabelsIdx(2));
  IdxImportOptions options{dir + "/images", dir + "/labels", dir + "/out", "bad", 1, 0};
  auto imported = ImportIdx(options);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(imported.status().message(), HasSubstr(dir + "/images"));
  EXPECT_THAT(imported.status().message(), HasSubstr("magic number 0x00000801"));
  EXPECT_THAT(imported.status().message(), HasSubstr("expected 0x00000803"));
  // Labels passed where images are expected.
  options.images_path = dir + "/labels";
  EXPECT_THAT(ImportIdx(options).status().message(), HasSubstr("not an IDX file"));
  // Nothing was published.
  EXPECT_NE(access((dir + "/out/bad-00000-of-00001.tfrecord").c_str(), F_OK), 0);
}

TEST(IdxTest, CountMismatchNamesBothFiles) {
  const std::string dir = NewTempDir();
  WriteFileOrDie(dir + "/images", ImagesIdx(5));
  WriteFileOrDie(dir + "/labels", LabelsIdx(4));
  IdxImportOptions options{dir + "/images", dir + "/labels", dir + "/out", "n", 1, 0};
  auto imported = ImportIdx(options);
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(), HasSubstr("holds 5 images"));
  EXPECT_THAT(imported.status().message(), HasSubstr("holds 4 labels"));
}

TEST(IdxTest, TruncatedAndTrailingDataAreErrors) {
  const std::string dir = NewTempDir();
  const std::string images = ImagesIdx(5);
  WriteFileOrDie(dir + "/short", images.substr(0, images.size() - 3));
  WriteFileOrDie(dir + "/long", images + "zz");
  WriteFileOrDie(dir + "/labels", LabelsIdx(5));
  IdxImportOptions options{dir + "/short", dir + "/labels", dir + "/out", "t", 2, 0};
  auto imported = ImportIdx(options);
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(imported.status().message(), HasSubstr(dir + "/short"));
  EXPECT_NE(access((dir + "/out/t-00000-of-00002.tfrecord").c_str(), F_OK), 0);

  options.images_path = dir + "/long";
  imported = ImportIdx(options);
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(), HasSubstr("data after the last"));
}

// Found by fuzz/idx_fuzzer: a 30-byte file whose header declares one image
// of 32768 x 32768 made the import allocate (and zero) 1 GiB before finding
// the file truncated. The buffer now grows with the bytes that arrive.
TEST(IdxTest, ItemsLargerThanTheFileTakeNoMoreMemoryThanItsBytes) {
  const std::string dir = NewTempDir();
  const std::string huge = BigEndian32(0x803) + BigEndian32(1) + BigEndian32(32768) +
                           BigEndian32(32768) + std::string(14, '\x7f');
  WriteFileOrDie(dir + "/images", huge);
  WriteFileOrDie(dir + "/labels", LabelsIdx(1));
  auto reader = IdxReader::Open(dir + "/images", 3);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->item_size(), int64_t{1} << 30);
  std::vector<uint8_t> item;
  const absl::Status read = (*reader)->ReadItem(&item);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_THAT(read.message(), HasSubstr("is truncated: its header declares 1 items"));
  EXPECT_LE(item.capacity(), size_t{1} << 20);

  IdxImportOptions options{dir + "/images", dir + "/labels", dir + "/out", "huge", 1, 0};
  auto imported = ImportIdx(options);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kDataLoss) << imported.status();
  EXPECT_THAT(imported.status().message(), HasSubstr("truncated"));
}

TEST(IdxTest, ReadItemReadsEachItemIntoOneBuffer) {
  const std::string dir = NewTempDir();
  WriteFileOrDie(dir + "/images", ImagesIdx(3));
  auto reader = IdxReader::Open(dir + "/images", 3);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> item;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*reader)->ReadItem(&item).ok());
    EXPECT_EQ(item, std::vector<uint8_t>(kRows * kCols, i));
  }
  EXPECT_EQ((*reader)->ReadItem(&item).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE((*reader)->CheckAtEnd().ok());
}

TEST(IdxTest, MissingFileIsNotFound) {
  const std::string dir = NewTempDir();
  IdxImportOptions options{dir + "/none", dir + "/none2", dir + "/out", "m", 1, 0};
  auto imported = ImportIdx(options);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(imported.status().message(), HasSubstr(dir + "/none"));
}

TEST(IdxTest, RealFashionMnistSmoke) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  const std::string images = root + "/train-images-idx3-ubyte.gz";
  const std::string labels = root + "/train-labels-idx1-ubyte.gz";
  if (access(images.c_str(), R_OK) != 0 || access(labels.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "Fashion-MNIST not installed at " << root
                 << " (Debian package dataset-fashion-mnist)";
  }
  auto header = IdxReader::Open(images, 3);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ((*header)->dims(), (std::vector<int64_t>{60000, 28, 28}));

  const std::string dir = NewTempDir();
  IdxImportOptions options{images, labels, dir, "fashion-mnist-train", 2, 1000};
  auto imported = ImportIdx(options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(*imported, 1000);

  BatchReaderOptions read;
  auto files = ListRecordFiles("fashion-mnist-train-*.tfrecord", dir);
  ASSERT_TRUE(files.ok()) << files.status();
  read.slices = WholeFiles(*files);
  read.data_dir = dir;
  read.feature_size = 28 * 28;
  read.batch_size = 128;
  read.repeat = false;
  auto reader = BatchReader::Create(read);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Batch batch;
  int64_t total = 0;
  std::vector<int> per_class(10, 0);
  while (true) {
    auto got = (*reader)->Next(&batch);
    ASSERT_TRUE(got.ok()) << got.status();
    if (!*got) break;
    total += batch.size;
    for (int32_t label : batch.labels) {
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++per_class[label];
    }
    for (float f : batch.features) {
      ASSERT_GE(f, 0.0f);
      ASSERT_LE(f, 1.0f);
    }
  }
  EXPECT_EQ(total, 1000);
  for (int c = 0; c < 10; ++c) EXPECT_GT(per_class[c], 50) << "class " << c;
}

}  // namespace
}  // namespace data
}  // namespace downpour
