#include "data/dataset.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
using testing::TaggedExample;
using testing::WriteFileOrDie;
using testing::WriteRecordsOrDie;

constexpr int64_t kFeatureSize = 4;

// Writes `counts.size()` files "part-<i>.tfrecord" with consecutive example ids
// across them (file 0 holds ids 0.., file 1 continues, ...). Returns the total.
int64_t WriteParts(const std::string& dir, const std::vector<int>& counts) {
  int64_t id = 0;
  for (size_t f = 0; f < counts.size(); ++f) {
    std::vector<std::string> records;
    for (int i = 0; i < counts[f]; ++i) records.push_back(TaggedExample(id++, kFeatureSize));
    WriteRecordsOrDie(absl::StrCat(dir, "/part-", f, ".tfrecord"), records);
  }
  return id;
}

// The files "part-*.tfrecord" of `dir`, relative to it.
std::vector<std::string> Parts(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> files = ListRecordFiles("part-*.tfrecord", dir);
  EXPECT_TRUE(files.ok()) << files.status();
  return files.ok() ? *files : std::vector<std::string>{};
}

BatchReaderOptions Options(const std::string& dir) {
  BatchReaderOptions o;
  o.slices = WholeFiles(Parts(dir));
  o.data_dir = dir;
  o.feature_size = kFeatureSize;
  o.batch_size = 4;
  o.repeat = false;
  return o;
}

// Reads until end of data (or `max_examples`) and returns the labels (= ids) in
// order, checking that every feature matches its label.
std::vector<int32_t> ReadIds(BatchReader* reader, int64_t max_examples = -1,
                             std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int32_t> ids;
  Batch batch;
  while (max_examples < 0 || static_cast<int64_t>(ids.size()) < max_examples) {
    absl::StatusOr<bool> got = reader->Next(&batch);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || !*got) break;
    EXPECT_EQ(batch.labels.size(), static_cast<size_t>(batch.size));
    EXPECT_EQ(batch.features.size(), static_cast<size_t>(batch.size * kFeatureSize));
    if (batch_sizes != nullptr) batch_sizes->push_back(batch.size);
    for (int64_t i = 0; i < batch.size; ++i) {
      const int32_t id = batch.labels[i];
      EXPECT_FLOAT_EQ(batch.features[i * kFeatureSize], (id % 256) / 255.0f);
      ids.push_back(id);
    }
  }
  return ids;
}

std::vector<int32_t> Iota(int64_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(BatchReaderTest, InOrderOnePassWithShortLastBatch) {
  const std::string dir = NewTempDir();
  const int64_t total = WriteParts(dir, {3, 7});
  auto reader = BatchReader::Create(Options(dir));
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> sizes;
  EXPECT_EQ(ReadIds(reader->get(), -1, &sizes), Iota(total));
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ((*reader)->examples_read(), total);
  Batch batch;
  auto again = (*reader)->Next(&batch);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

// Readers that share the files out — whole files round-robin when there
// are at least as many files as readers, every `readers`-th record of each
// file otherwise — read every record exactly once, with and without
// shuffling.
struct ShareCase {
  std::vector<int> counts;
  int readers;
  int64_t shuffle;
};

class SlicesTest : public ::testing::TestWithParam<ShareCase> {};

TEST_P(SlicesTest, EveryRecordExactlyOnce) {
  const ShareCase& c = GetParam();
  const std::string dir = NewTempDir();
  const int64_t total = WriteParts(dir, c.counts);
  const std::vector<std::string> files = Parts(dir);
  ASSERT_EQ(files.size(), c.counts.size());
  EXPECT_EQ(files[0], "part-0.tfrecord");  // Relative to the data dir.
  std::vector<int32_t> all;
  for (int r = 0; r < c.readers; ++r) {
    BatchReaderOptions o = Options(dir);
    o.slices.clear();
    for (size_t f = 0; f < files.size(); ++f) {
      if (static_cast<int>(files.size()) < c.readers) {
        o.slices.push_back(FileSlice{files[f], c.readers, r});
      } else if (static_cast<int>(f) % c.readers == r) {
        o.slices.push_back(FileSlice{files[f], 1, 0});
      }
    }
    o.shuffle_buffer = c.shuffle;
    o.seed = 42;
    o.stream = r;
    auto reader = BatchReader::Create(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const std::vector<int32_t> ids = ReadIds(reader->get());
    EXPECT_FALSE(ids.empty()) << "reader " << r;
    all.insert(all.end(), ids.begin(), ids.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, Iota(total));
}

INSTANTIATE_TEST_SUITE_P(
    WholeFilesAndStrides, SlicesTest,
    ::testing::Values(ShareCase{{5, 6, 7, 8, 9, 10, 11}, 3, 0},  // Whole files.
                      ShareCase{{5, 6, 7, 8, 9, 10, 11}, 3, 8},
                      ShareCase{{5, 6, 7}, 3, 0},  // #files == #readers.
                      ShareCase{{13, 20}, 3, 0},   // Strided.
                      ShareCase{{13, 20}, 3, 6}, ShareCase{{50}, 4, 100}));

// The first 12 ids ShuffleIsADeterministicPermutation reads with seed 1.
const std::vector<int32_t> kSeed1Order = {35, 32, 47, 30, 46, 41, 42, 36, 33, 31, 37, 55};

TEST(BatchReaderTest, ShuffleIsADeterministicPermutation) {
  const std::string dir = NewTempDir();
  const int64_t total = WriteParts(dir, {30, 30, 40});
  auto read_with_seed = [&](uint64_t seed) {
    BatchReaderOptions o = Options(dir);
    o.shuffle_buffer = 16;
    o.seed = seed;
    auto reader = BatchReader::Create(o);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return ReadIds(reader->get());
  };
  const std::vector<int32_t> a = read_with_seed(1);
  EXPECT_EQ(read_with_seed(1), a);
  // The draws, pinned: the order b7ce060's reader gave (before the next
  // record's place was drawn a record ahead).
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 12), kSeed1Order);
  EXPECT_NE(read_with_seed(2), a);
  EXPECT_NE(a, Iota(total));
  std::vector<int32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(total));
}

TEST(BatchReaderTest, RepeatLoopsOverEpochsAndReshuffles) {
  const std::string dir = NewTempDir();
  const int64_t total = WriteParts(dir, {4, 6});
  for (int64_t shuffle : {0, 5}) {
    BatchReaderOptions o = Options(dir);
    o.repeat = true;
    o.batch_size = 3;  // Batches straddle epoch boundaries.
    o.shuffle_buffer = shuffle;
    auto reader = BatchReader::Create(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<int64_t> sizes;
    std::vector<int32_t> ids = ReadIds(reader->get(), 5 * total, &sizes);
    ASSERT_GE(static_cast<int64_t>(ids.size()), 5 * total);
    const int64_t handed_out = static_cast<int64_t>(ids.size());
    for (int64_t size : sizes) EXPECT_EQ(size, 3);
    std::vector<std::vector<int32_t>> epochs;
    for (int e = 0; e < 5; ++e) {
      std::vector<int32_t> epoch(ids.begin() + e * total, ids.begin() + (e + 1) * total);
      epochs.push_back(epoch);
      std::sort(epoch.begin(), epoch.end());
      EXPECT_EQ(epoch, Iota(total)) << "epoch " << e << " shuffle " << shuffle;
    }
    if (shuffle > 0) {
      EXPECT_TRUE(epochs[0] != epochs[1] || epochs[1] != epochs[2]) << "epochs not reshuffled";
    } else {
      EXPECT_EQ(epochs[0], Iota(total));
      EXPECT_EQ(epochs[3], Iota(total));
    }
    EXPECT_EQ((*reader)->examples_read(), handed_out);
  }
}

TEST(BatchReaderTest, CorruptRecordSurfacesFromNextWithFileAndOffset) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {20});
  const std::string path = dir + "/part-0.tfrecord";
  std::string bytes = ReadFileOrDie(path);
  const size_t record_bytes = bytes.size() / 20;  // All records have the same size.
  const size_t bad_offset = 15 * record_bytes;
  bytes[bad_offset + kRecordHeaderBytes + 3] ^= 0x10;
  WriteFileOrDie(path, bytes);

  auto reader = BatchReader::Create(Options(dir));
  ASSERT_TRUE(reader.ok()) << reader.status();
  Batch batch;
  int good_batches = 0;
  absl::Status error;
  while (true) {
    absl::StatusOr<bool> got = (*reader)->Next(&batch);
    if (!got.ok()) {
      error = got.status();
      break;
    }
    ASSERT_TRUE(*got) << "end of data reported instead of the corrupt record";
    ++good_batches;
  }
  EXPECT_EQ(good_batches, 3);  // Records 0..11; the batch holding record 15 fails.
  EXPECT_EQ(error.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(error.message(), HasSubstr(path));
  EXPECT_THAT(error.message(), HasSubstr("offset " + std::to_string(bad_offset)));
  // Checked as the batch is decoded, said as the record reader says it.
  EXPECT_THAT(error.message(), HasSubstr("corrupt record in " + path));
  EXPECT_THAT(error.message(), HasSubstr("payload checksum mismatch"));
  EXPECT_EQ((*reader)->Next(&batch).status(), error);  // Sticky.
}

// A file cut short inside a record (a copy that stopped early) is data loss
// at that record's offset, after the whole batches before it — not the end
// of the data, which a one-pass reader would take for a short last batch.
TEST(BatchReaderTest, FileCutInsideARecordIsDataLossNotTheEndOfTheData) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {10});
  const std::string path = dir + "/part-0.tfrecord";
  const std::string bytes = ReadFileOrDie(path);
  const size_t record_bytes = bytes.size() / 10;  // All records have the same size.
  for (size_t cut : {size_t{3}, kRecordHeaderBytes + 2, record_bytes - 1}) {
    SCOPED_TRACE(absl::StrCat(cut, " bytes of the last record"));
    WriteFileOrDie(path, bytes.substr(0, 9 * record_bytes + cut));
    auto reader = BatchReader::Create(Options(dir));
    ASSERT_TRUE(reader.ok()) << reader.status();
    Batch batch;
    int good_batches = 0;
    absl::StatusOr<bool> got;
    while ((got = (*reader)->Next(&batch)).ok() && *got) ++good_batches;
    EXPECT_EQ(good_batches, 2);  // Records 0..7; the batch of records 8 and 9 fails.
    ASSERT_FALSE(got.ok()) << "end of data reported for a file cut inside a record";
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_THAT(got.status().message(),
                HasSubstr(absl::StrCat("corrupt record in ", path, " at offset ", 9 * record_bytes,
                                       ": truncated")));
  }
}

// A damaged payload waits for its batch to be decoded before it is found;
// a later record's read error (the file cut inside record 14) does not
// hide it: the run ends with record 13's checksum error, shuffled or not.
TEST(BatchReaderTest, ADamagedRecordIsReportedBeforeALaterReadError) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {20});
  const std::string path = dir + "/part-0.tfrecord";
  std::string bytes = ReadFileOrDie(path);
  const size_t record_bytes = bytes.size() / 20;
  bytes[13 * record_bytes + kRecordHeaderBytes + 3] ^= 0x10;
  WriteFileOrDie(path, bytes.substr(0, 14 * record_bytes + kRecordHeaderBytes + 2));
  for (int64_t shuffle : {0, 8}) {
    SCOPED_TRACE(absl::StrCat("shuffle buffer ", shuffle));
    BatchReaderOptions o = Options(dir);
    o.shuffle_buffer = shuffle;
    auto reader = BatchReader::Create(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    Batch batch;
    absl::StatusOr<bool> got;
    while ((got = (*reader)->Next(&batch)).ok() && *got) {
    }
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status(), RecordReader::PayloadCorrupt(path, 13 * record_bytes, false));
  }
}

TEST(BatchReaderTest, UndecodableExampleNamesFileAndOffset) {
  const std::string dir = NewTempDir();
  WriteRecordsOrDie(dir + "/part-0.tfrecord", {TaggedExample(0, kFeatureSize), "not a proto"});
  auto reader = BatchReader::Create(Options(dir));
  ASSERT_TRUE(reader.ok());
  Batch batch;
  absl::StatusOr<bool> got = (*reader)->Next(&batch);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(dir + "/part-0.tfrecord at offset "));

  // A feature of the wrong size.
  BatchReaderOptions o = Options(dir);
  WriteRecordsOrDie(dir + "/sized.tfrecord", {TaggedExample(0, 9)});
  o.slices = {FileSlice{"sized.tfrecord"}};
  auto sized = BatchReader::Create(o);
  ASSERT_TRUE(sized.ok());
  got = (*sized)->Next(&batch);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("sized.tfrecord at offset 0"));
  EXPECT_THAT(got.status().message(), HasSubstr("\"image\""));
}

TEST(BatchReaderTest, DestructorDoesNotHangWithFullQueue) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {100});
  for (int depth : {1, 4}) {
    BatchReaderOptions o = Options(dir);
    o.repeat = true;
    o.prefetch_depth = depth;
    o.shuffle_buffer = 10;
    auto reader = BatchReader::Create(o);
    ASSERT_TRUE(reader.ok());
    Batch batch;
    ASSERT_TRUE(*(*reader)->Next(&batch));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while ((*reader)->queued_batches() < depth && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ((*reader)->queued_batches(), depth);
    reader->reset();  // Must return: the producer is blocked on the full queue.
  }
  // Destroyed right after creation, racing the producer's start.
  for (int i = 0; i < 20; ++i) {
    BatchReaderOptions o = Options(dir);
    o.repeat = true;
    auto reader = BatchReader::Create(o);
    ASSERT_TRUE(reader.ok());
  }
}

TEST(BatchReaderTest, NoMatchingFilesIsNotFound) {
  const std::string dir = NewTempDir();
  auto files = ListRecordFiles("missing-*.tfrecord", dir);
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(files.status().message(),
            "no record files match missing-*.tfrecord (data dir " + dir + ")");
}

TEST(BatchReaderTest, AbsolutePatternIgnoresDataDirAndSkipsTmpFiles) {
  const std::string dir = NewTempDir();
  const int64_t total = WriteParts(dir, {5});
  WriteFileOrDie(dir + "/part-9.tfrecord.tmp", "torn");
  auto files = ListRecordFiles(dir + "/part-*", "/nonexistent");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, std::vector<std::string>{dir + "/part-0.tfrecord"});
  BatchReaderOptions o = Options(dir);
  o.data_dir = "/nonexistent";
  o.slices = WholeFiles(*files);
  auto reader = BatchReader::Create(o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(ReadIds(reader->get()), Iota(total));
}

TEST(BatchReaderTest, MissingFileIsNotFoundNamingIt) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {5});
  BatchReaderOptions o = Options(dir);
  o.slices.push_back(FileSlice{"part-7.tfrecord", 1, 0});
  auto reader = BatchReader::Create(o);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr(dir + "/part-7.tfrecord cannot be read"));
}

TEST(BatchReaderTest, InvalidOptionsAreRejected) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {5});
  BatchReaderOptions o = Options(dir);
  o.slices[0].offset = 3;
  o.slices[0].stride = 3;
  EXPECT_THAT(BatchReader::Create(o).status().message(), HasSubstr("stride 3, offset 3"));
  o = Options(dir);
  o.slices.clear();
  EXPECT_THAT(BatchReader::Create(o).status().message(), HasSubstr("no files"));
  o = Options(dir);
  o.batch_size = 0;
  EXPECT_THAT(BatchReader::Create(o).status().message(), HasSubstr("batch_size"));
  o = Options(dir);
  o.feature_size = -1;
  EXPECT_THAT(BatchReader::Create(o).status().message(), HasSubstr("feature_size"));
}

TEST(BatchReaderTest, RepeatWithEmptyShareIsAnErrorNotAHang) {
  const std::string dir = NewTempDir();
  WriteParts(dir, {1});
  BatchReaderOptions o = Options(dir);
  o.repeat = true;
  o.slices[0].stride = 3;
  o.slices[0].offset = 2;
  auto reader = BatchReader::Create(o);
  ASSERT_TRUE(reader.ok());
  Batch batch;
  auto got = (*reader)->Next(&batch);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(),
              HasSubstr("(1 file, first " + dir + "/part-0.tfrecord) holds no records"));
}

}  // namespace
}  // namespace data
}  // namespace downpour
