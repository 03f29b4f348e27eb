#include "data/record_io.h"

#include <string>
#include <vector>

#include "common/crc32c.h"
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
using testing::WriteRecordsOrDie;

std::vector<std::string> SampleRecords() {
  std::vector<std::string> records = {"", "a", "hello world", std::string(100000, 'x')};
  for (int i = 0; i < 1000; ++i) records.push_back("record-" + std::to_string(i));
  records.push_back(std::string(5 << 20, 'y'));  // Larger than the write buffer.
  return records;
}

absl::StatusOr<std::vector<std::string>> ReadAll(const std::string& path, size_t buffer_size) {
  auto reader = RecordReader::Open(path, buffer_size);
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

TEST(RecordIoTest, RoundTripWithSmallAndLargeBuffers) {
  const std::string path = NewTempDir() + "/r.tfrecord";
  const auto records = SampleRecords();
  WriteRecordsOrDie(path, records);
  for (size_t buffer : {size_t{7}, size_t{4096}, RecordReader::kDefaultBufferSize}) {
    auto got = ReadAll(path, buffer);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, records) << "buffer " << buffer;
  }
}

std::string Fixed64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string Fixed32(uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

TEST(RecordIoTest, ExactTfRecordBytes) {
  // The framing of one record "abc", rebuilt independently from the format.
  const std::string path = NewTempDir() + "/one.tfrecord";
  WriteRecordsOrDie(path, {"abc"});
  const std::string length = Fixed64(3);
  const std::string expected = length + Fixed32(MaskCrc(Crc32c(length.data(), 8))) + "abc" +
                               Fixed32(MaskCrc(Crc32c("abc", 3)));
  EXPECT_EQ(ReadFileOrDie(path), expected);
}

TEST(RecordIoTest, EmptyFileIsCleanEof) {
  const std::string path = NewTempDir() + "/empty.tfrecord";
  WriteRecordsOrDie(path, {});
  auto got = ReadAll(path, 1024);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
}

TEST(RecordIoTest, FlippedPayloadByteNamesFileAndOffset) {
  const std::string path = NewTempDir() + "/flip.tfrecord";
  WriteRecordsOrDie(path, {"first", "second", "third"});
  std::string bytes = ReadFileOrDie(path);
  // Record 2 ("second") starts at 5 + 16; flip a byte of its payload.
  const size_t second_offset = 5 + kRecordHeaderBytes + kRecordFooterBytes;
  bytes[second_offset + kRecordHeaderBytes + 2] ^= 0x40;
  WriteFileOrDie(path, bytes);

  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok());
  std::string record;
  ASSERT_TRUE(*(*reader)->Read(&record));
  EXPECT_EQ(record, "first");
  absl::StatusOr<bool> got = (*reader)->Read(&record);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr(path));
  EXPECT_THAT(got.status().message(), HasSubstr("offset " + std::to_string(second_offset)));
  EXPECT_THAT(got.status().message(), HasSubstr("payload checksum mismatch"));
  // Sticky.
  EXPECT_FALSE((*reader)->Read(&record).ok());

  // Read with the payload's checksum left to the caller: the record comes
  // as it is, and PayloadIntact tells it is damaged.
  auto unchecked = RecordReader::Open(path);
  ASSERT_TRUE(unchecked.ok());
  uint32_t crc = 0;
  ASSERT_TRUE(*(*unchecked)->Read(&record, &crc));
  EXPECT_TRUE(RecordReader::PayloadIntact(record, crc));
  ASSERT_TRUE(*(*unchecked)->Read(&record, &crc));
  EXPECT_EQ(record.size(), 6u);
  EXPECT_FALSE(RecordReader::PayloadIntact(record, crc));
  ASSERT_TRUE(*(*unchecked)->Read(&record, &crc));
  EXPECT_EQ(record, "third");
  EXPECT_TRUE(RecordReader::PayloadIntact(record, crc));
  EXPECT_EQ(RecordReader::PayloadCorrupt(path, second_offset, false), got.status());
}

TEST(RecordIoTest, FlippedLengthByteIsDetected) {
  const std::string path = NewTempDir() + "/len.tfrecord";
  WriteRecordsOrDie(path, {"abc"});
  std::string bytes = ReadFileOrDie(path);
  bytes[0] ^= 0x01;
  WriteFileOrDie(path, bytes);
  auto got = ReadAll(path, 1024);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("length checksum mismatch"));
  EXPECT_THAT(got.status().message(), HasSubstr("at offset 0"));
}

TEST(RecordIoTest, TruncatedFileIsDataLoss) {
  const std::string dir = NewTempDir();
  const std::string full_path = dir + "/full.tfrecord";
  WriteRecordsOrDie(full_path, {"0123456789", "abcdefghij"});
  const std::string bytes = ReadFileOrDie(full_path);
  const size_t second = 10 + kRecordHeaderBytes + kRecordFooterBytes;
  // Cut inside the header, inside the payload and inside the footer of record 2.
  for (size_t cut : {second + 5, second + 15, second + 24}) {
    const std::string path = dir + "/cut" + std::to_string(cut) + ".tfrecord";
    WriteFileOrDie(path, bytes.substr(0, cut));
    auto got = ReadAll(path, 1024);
    ASSERT_FALSE(got.ok()) << "cut at " << cut;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(got.status().message(), HasSubstr("truncated"));
    EXPECT_THAT(got.status().message(), HasSubstr(path));
    EXPECT_THAT(got.status().message(), HasSubstr("offset " + std::to_string(second)));
  }
}

TEST(RecordIoTest, HugeLengthIsRejectedWithoutAllocating) {
  const std::string path = NewTempDir() + "/huge.tfrecord";
  WriteRecordsOrDie(path, {"abc"});
  std::string bytes = ReadFileOrDie(path);
  // A consistent header (valid length CRC) that claims 2^40 bytes.
  const std::string header = Fixed64(uint64_t{1} << 40);
  bytes.replace(0, 12, header + Fixed32(MaskCrc(Crc32c(header.data(), 8))));
  WriteFileOrDie(path, bytes);
  auto got = ReadAll(path, 1024);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("exceeds the limit"));
}

TEST(RecordIoTest, WriterPublishesOnlyOnClose) {
  const std::string dir = NewTempDir();
  const std::string path = dir + "/atomic.tfrecord";
  {
    auto writer = RecordWriter::Open(path);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Write("x").ok());
    EXPECT_FALSE(RecordReader::Open(path).ok());  // Not visible yet.
    ASSERT_TRUE((*writer)->Close().ok());
    EXPECT_TRUE((*writer)->Close().ok());
    EXPECT_FALSE((*writer)->Write("y").ok());
  }
  EXPECT_TRUE(RecordReader::Open(path).ok());
  EXPECT_FALSE(RecordReader::Open(path + ".tmp").ok());

  const std::string abandoned = dir + "/abandoned.tfrecord";
  {
    auto writer = RecordWriter::Open(abandoned);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Write("x").ok());
  }
  EXPECT_FALSE(RecordReader::Open(abandoned).ok());
  EXPECT_FALSE(RecordReader::Open(abandoned + ".tmp").ok());
}

TEST(RecordIoTest, MissingFileIsNotFound) {
  auto reader = RecordReader::Open(NewTempDir() + "/nope.tfrecord");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr("nope.tfrecord"));
}

}  // namespace
}  // namespace data
}  // namespace downpour
