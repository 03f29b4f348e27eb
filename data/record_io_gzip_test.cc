// GZIP-compressed record files: written here, written by zlib's own gzip file
// writer (gzwrite, an implementation independent of RecordWriter's), detected
// by their magic bytes, and damaged.
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "data/record_io.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "zlib.h"

namespace downpour {
namespace data {
namespace {

using ::testing::HasSubstr;
using testing::NewTempDir;
using testing::ReadFileOrDie;
using testing::WriteFileOrDie;
using testing::WriteRecordsOrDie;

std::vector<std::string> SampleRecords() {
  std::vector<std::string> records = {"", "a", std::string(100000, 'x')};
  for (int i = 0; i < 2000; ++i) records.push_back("record-" + std::to_string(i * 7919));
  std::string noise(3 << 20, '\0');  // Poorly compressible, larger than every buffer.
  uint32_t state = 12345;
  for (char& c : noise) c = static_cast<char>((state = state * 1103515245 + 12345) >> 24);
  records.push_back(noise);
  return records;
}

absl::StatusOr<std::vector<std::string>> ReadAll(const std::string& path, size_t buffer_size,
                                                 Compression compression = Compression::kAuto) {
  auto reader = RecordReader::Open(path, buffer_size, compression);
  if (!reader.ok()) return reader.status();
  std::vector<std::string> out;
  std::string record;
  while (true) {
    absl::StatusOr<bool> got = (*reader)->Read(&record);
    if (!got.ok()) return got.status();
    if (!*got) return out;
    out.push_back(record);
  }
}

void WriteGzipRecordsOrDie(const std::string& path, const std::vector<std::string>& records) {
  auto writer = RecordWriter::Open(path, Compression::kGzip);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const std::string& r : records) ASSERT_TRUE((*writer)->Write(r).ok());
  ASSERT_TRUE((*writer)->Close().ok());
}

// Compresses `bytes` into `path` with zlib's gzip file API.
void GzipWithZlibOrDie(const std::string& path, const std::string& bytes) {
  gzFile out = gzopen(path.c_str(), "wb9");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(out), Z_OK);
}

TEST(RecordIoGzipTest, RoundTripIsDetectedAndReadWithAnyBuffer) {
  const std::string path = NewTempDir() + "/r.tfrecord.gz";
  const auto records = SampleRecords();
  WriteGzipRecordsOrDie(path, records);
  const std::string bytes = ReadFileOrDie(path);
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1]), 0x8b);
  for (size_t buffer : {size_t{7}, size_t{4096}, RecordReader::kDefaultBufferSize}) {
    for (Compression c : {Compression::kAuto, Compression::kGzip}) {
      auto got = ReadAll(path, buffer, c);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, records) << "buffer " << buffer;
    }
  }
  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->compressed());
}

TEST(RecordIoGzipTest, ReadsWhatZlibsGzipWriterWrote) {
  const std::string dir = NewTempDir();
  const auto records = SampleRecords();
  WriteRecordsOrDie(dir + "/plain.tfrecord", records);
  GzipWithZlibOrDie(dir + "/zlib.tfrecord.gz", ReadFileOrDie(dir + "/plain.tfrecord"));
  auto got = ReadAll(dir + "/zlib.tfrecord.gz", 4096);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, records);
}

TEST(RecordIoGzipTest, ConcatenatedMembersAreOneStream) {
  const std::string dir = NewTempDir();
  WriteGzipRecordsOrDie(dir + "/a.gz", {"one", "two"});
  WriteGzipRecordsOrDie(dir + "/b.gz", {"three"});
  WriteFileOrDie(dir + "/ab.gz", ReadFileOrDie(dir + "/a.gz") + ReadFileOrDie(dir + "/b.gz"));
  auto got = ReadAll(dir + "/ab.gz", 1024);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"one", "two", "three"}));
}

TEST(RecordIoGzipTest, UncompressedRecordWhoseLengthLooksLikeTheMagicIsNotGzip) {
  // Length 0x8b1f: the file's first two bytes are 1f 8b, gzip's magic, but
  // the header's own checksum says it is a record.
  const std::string path = NewTempDir() + "/magic-length.tfrecord";
  const std::vector<std::string> records = {std::string(0x8b1f, 'm'), "tail"};
  WriteRecordsOrDie(path, records);
  const std::string bytes = ReadFileOrDie(path);
  ASSERT_EQ(static_cast<unsigned char>(bytes[0]), 0x1f);
  ASSERT_EQ(static_cast<unsigned char>(bytes[1]), 0x8b);
  auto got = ReadAll(path, 1024);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, records);
}

TEST(RecordIoGzipTest, GzipRequestedForAnUncompressedFileNamesIt) {
  const std::string path = NewTempDir() + "/plain.tfrecord";
  WriteRecordsOrDie(path, {"abc"});
  auto reader = RecordReader::Open(path, 1024, Compression::kGzip);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr(path));
  EXPECT_THAT(reader.status().message(), HasSubstr("not GZIP-compressed"));
  // kNone reads a gzip file as records, which fails as corruption, not a crash.
  const std::string gz = path + ".gz";
  WriteGzipRecordsOrDie(gz, {"abc"});
  auto raw = ReadAll(gz, 1024, Compression::kNone);
  ASSERT_FALSE(raw.ok());
  EXPECT_THAT(raw.status().message(), HasSubstr(gz));
}

TEST(RecordIoGzipTest, TruncatedStreamIsOneErrorNamingTheFile) {
  const std::string dir = NewTempDir();
  WriteGzipRecordsOrDie(dir + "/full.gz", SampleRecords());
  const std::string bytes = ReadFileOrDie(dir + "/full.gz");
  // Cut inside the compressed data, and just before the 8-byte trailer (every
  // record inflates, but the stream never ends).
  for (size_t cut : {bytes.size() / 2, bytes.size() - 8, bytes.size() - 1}) {
    const std::string path = dir + "/cut" + std::to_string(cut) + ".gz";
    WriteFileOrDie(path, bytes.substr(0, cut));
    auto got = ReadAll(path, 4096);
    ASSERT_FALSE(got.ok()) << "cut at " << cut;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(got.status().message(), HasSubstr(path));
    EXPECT_THAT(got.status().message(), HasSubstr("gzip"));
  }
}

TEST(RecordIoGzipTest, CorruptStreamIsOneErrorNamingTheFile) {
  const std::string dir = NewTempDir();
  WriteGzipRecordsOrDie(dir + "/full.gz", SampleRecords());
  const std::string bytes = ReadFileOrDie(dir + "/full.gz");
  for (size_t at : {size_t{3}, bytes.size() / 3, bytes.size() - 6}) {
    std::string damaged = bytes;
    damaged[at] ^= 0x5a;
    const std::string path = dir + "/flip" + std::to_string(at) + ".gz";
    WriteFileOrDie(path, damaged);
    auto got = ReadAll(path, 4096);
    ASSERT_FALSE(got.ok()) << "flipped byte " << at;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(got.status().message(), HasSubstr(path));
  }
  // Trailing garbage after a complete member is not silently ignored.
  WriteFileOrDie(dir + "/trailing.gz", bytes + "garbage!");
  auto got = ReadAll(dir + "/trailing.gz", 4096);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("corrupt gzip stream in " + dir + "/trailing.gz"));
}

}  // namespace
}  // namespace data
}  // namespace downpour
