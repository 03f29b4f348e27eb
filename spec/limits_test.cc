// The checks of spec/limits.h: one sentence naming the field, its size and
// the limit; data paths that are absolute or can reach ".." are refused;
// text is cut on a character boundary.
#include "spec/limits.h"

#include <string>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(LimitsTest, SizesAndCountsNameTheFieldTheSizeAndTheLimit) {
  EXPECT_TRUE(CheckBytes("name", std::string(128, 'x'), kMaxNameBytes).ok());
  const absl::Status long_name = CheckBytes("name", std::string(129, 'x'), kMaxNameBytes);
  EXPECT_EQ(long_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(long_name.message(), "name is 129 bytes; the limit is 128 bytes");
  EXPECT_EQ(CheckSize("job spec", 200000, kMaxJobSpecBytes).message(),
            "job spec is 200000 bytes; the limit is 131072 bytes (128 KiB)");
  EXPECT_EQ(CheckSize("data", 9 << 20, kMaxDataFilesBytes).message(),
            "data is 9437184 bytes; the limit is 8388608 bytes (8 MiB)");
  EXPECT_TRUE(CheckCount("model.layer", kMaxLayers, kMaxLayers).ok());
  EXPECT_EQ(CheckCount("model.layer", 3000, kMaxLayers).message(),
            "model.layer has 3000 entries; the limit is 2048");
}

TEST(LimitsTest, NodeIdsAreBoundedAndHoldNoControlCharacters) {
  EXPECT_TRUE(CheckNodeId("node id", "worker@10.0.0.7:7071").ok());
  EXPECT_EQ(CheckNodeId("node id", std::string(513, 'w')).message(),
            "node id is 513 bytes; the limit is 512 bytes");
  EXPECT_EQ(CheckNodeId("node id", "a\nb").message(),
            "node id \"a\\nb\" holds a control character");
}

TEST(LimitsTest, RelativeDataPathsInsideTheDataDirectoryPass) {
  for (const char* path : {"train-*", "fashion-mnist/train-*.tfrecord", "a/./b", "a..b/c", "..a/x",
                           "a/...", "sub/*", "[.]./x", "a/.hidden"}) {
    EXPECT_TRUE(CheckDataPath("dataset.train_files", path).ok()) << path;
  }
}

TEST(LimitsTest, AbsoluteAndParentReachingDataPathsAreRefused) {
  const absl::Status absolute = CheckDataPath("dataset.train_files", "/etc/*");
  EXPECT_EQ(absolute.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(absolute.message(),
            "dataset.train_files \"/etc/*\" is an absolute path; record files are named "
            "relative to each worker's --data_dir");
  EXPECT_EQ(CheckDataPath("dataset.test_files", "../x").message(),
            "dataset.test_files \"../x\" has the component \"..\", which can name the parent "
            "directory; record files must stay inside each worker's --data_dir");
  // Anything glob(3) would let match "..".
  for (const char* path : {"..", "a/..", "a/../b", ".*/x", "a/.?/x", ".[.]/x", "\\.\\./x", ".*"}) {
    EXPECT_FALSE(CheckDataPath("f", path).ok()) << path;
  }
  EXPECT_FALSE(CheckDataPath("f", std::string("a\0b", 3)).ok());
  EXPECT_EQ(CheckDataPath("f", std::string(kMaxPathBytes + 1, 'a')).message(),
            "f is 4097 bytes; the limit is 4096 bytes (4 KiB)");
}

TEST(LimitsTest, TruncatedTextFitsTheLimitAndSaysWhatWasCut) {
  EXPECT_EQ(TruncateText("short", 100), "short");
  const std::string cut = TruncateText(std::string(5000, 'x'), kMaxMessageBytes);
  EXPECT_LE(cut.size(), kMaxMessageBytes);
  EXPECT_EQ(cut, std::string(4056, 'x') + " [... 944 bytes cut]");
  // "é" is two bytes: the cut never splits one.
  std::string accents;
  while (accents.size() < 300) accents += "\xC3\xA9";
  for (size_t limit = 64; limit < 100; ++limit) {
    const std::string t = TruncateText(accents, limit);
    EXPECT_LE(t.size(), limit);
    const size_t kept = t.find(" [...");
    ASSERT_NE(kept, std::string::npos);
    EXPECT_EQ(kept % 2, 0u) << limit;
  }
}

}  // namespace
}  // namespace downpour
