// Record files in the TFRecord framing, so files written by TensorFlow are read
// as they are and files written here are read by TensorFlow:
//
//   uint64  length          (little endian)
//   uint32  masked_crc32c(length bytes)
//   byte    payload[length]
//   uint32  masked_crc32c(payload)
//
// A file may also be GZIP-compressed as a whole, as TensorFlow writes it with
// TFRecordOptions(compression_type="GZIP"): the framing above is the
// uncompressed stream.
//
// RecordWriter writes `path.tmp` and renames it to `path` on a successful
// Close(), after an fsync, so a reader never sees a torn file; a writer
// destroyed without Close() removes its temporary file.
// RecordReader reads sequentially through a large buffer and reports any damage
// (checksum mismatch, truncation, absurd length) as absl::DataLossError
// "corrupt record in <file> at offset <N>: <what>"; for a compressed file the
// offset is in the uncompressed stream, and damage to the compression itself (a
// bad gzip header or checksum, a stream cut short) is DataLossError
// "corrupt gzip stream in <file>: <what>". Decompression streams through a
// fixed-size buffer: a file is never inflated whole into memory.
//
// Thread-safety: neither class is thread-safe; use one object from one thread
// at a time. Ownership: each object owns its file descriptor and buffer.
#ifndef DOWNPOUR_DATA_RECORD_IO_H_
#define DOWNPOUR_DATA_RECORD_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file.h"

namespace downpour {
namespace data {

// Bytes of framing around each payload: 8 length + 4 length CRC + 4 payload CRC.
inline constexpr size_t kRecordHeaderBytes = 12;
inline constexpr size_t kRecordFooterBytes = 4;
// A length field above this is taken as corruption, not as a request to
// allocate that much memory.
inline constexpr uint64_t kMaxRecordLength = uint64_t{1} << 30;

// How a record file is compressed as a whole.
enum class Compression {
  // Reading: GZIP when the file starts with gzip's magic bytes and is not a
  // valid uncompressed record (whose first header carries its own checksum,
  // so a record length that happens to begin with the magic is not mistaken).
  // Writing: the same as kNone.
  kAuto,
  kNone,
  kGzip,
};

// The zlib stream of a compressed file; defined in record_io.cc so that
// zlib.h stays out of this header.
struct GzipStream;

class RecordWriter {
 public:
  // Creates `path + ".tmp"` (truncating any stale one). `path` itself appears
  // only when Close() succeeds. With kGzip the file is one gzip member.
  static absl::StatusOr<std::unique_ptr<RecordWriter>> Open(
      const std::string& path, Compression compression = Compression::kNone);

  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  // Without a successful Close(), removes the temporary file: nothing is published.
  ~RecordWriter();

  // Appends one record. REQUIRES: Close() has not been called.
  absl::Status Write(absl::string_view record);

  // Flushes, fsyncs, closes, renames `path.tmp` to `path` and fsyncs the
  // directory. Calling it again after success is a no-op.
  absl::Status Close();

 private:
  RecordWriter(std::unique_ptr<AtomicFile> file, std::unique_ptr<GzipStream> gzip);
  // Appends framed bytes, through the compressor when there is one; `finish`
  // ends the gzip member.
  absl::Status Append(absl::string_view bytes, bool finish = false);

  std::unique_ptr<AtomicFile> file_;  // Writes path.tmp; renamed by Close.
  std::unique_ptr<GzipStream> gzip_;  // Null for an uncompressed file.
  bool closed_ = false;
};

class RecordReader {
 public:
  static constexpr size_t kDefaultBufferSize = size_t{4} << 20;

  // Opens `path` for sequential reading with a `buffer_size`-byte read buffer.
  // kGzip on a file without gzip's magic bytes is DataLossError naming it.
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(
      const std::string& path, size_t buffer_size = kDefaultBufferSize,
      Compression compression = Compression::kAuto);

  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;
  ~RecordReader();

  // Reads the next record into `*record`. Returns true on success, false at a
  // clean end of file (exactly at a record boundary), DataLossError for a
  // damaged record. Errors are sticky: later calls return the same error.
  absl::StatusOr<bool> Read(std::string* record);
  // As Read, leaving the payload's checksum to the caller (a thread of its
  // own may check it): `*payload_crc` is what the record's footer holds,
  // for PayloadIntact; a record that fails it is PayloadCorrupt.
  absl::StatusOr<bool> Read(std::string* record, uint32_t* payload_crc);
  static bool PayloadIntact(absl::string_view payload, uint32_t payload_crc);
  // The error of a damaged record that started at `offset` of `path` (of
  // its uncompressed stream when `compressed`): Read's and PayloadCorrupt's.
  static absl::Status Corrupt(absl::string_view path, int64_t offset, bool compressed,
                              absl::string_view what);
  static absl::Status PayloadCorrupt(absl::string_view path, int64_t offset, bool compressed) {
    return Corrupt(path, offset, compressed, "payload checksum mismatch");
  }

  bool compressed() const { return gzip_ != nullptr; }
  // After Read() returns a record, the offset that record started at (in the
  // uncompressed stream of a compressed file).
  int64_t record_offset() const { return record_offset_; }

 private:
  RecordReader(std::string path, int fd, size_t buffer_size, std::unique_ptr<GzipStream> gzip);
  // Copies up to `n` bytes into `dst`, refilling the buffer as needed; returns
  // fewer than `n` only at end of file.
  absl::StatusOr<size_t> ReadBytes(char* dst, size_t n);
  // Reads up to `want` (uncompressed) bytes into `target`; 0 only at end of file.
  absl::StatusOr<size_t> Fill(char* target, size_t want);
  absl::StatusOr<size_t> Inflate(char* target, size_t want);
  absl::Status Corrupt(absl::string_view what) const;

  const std::string path_;
  int fd_;
  std::unique_ptr<GzipStream> gzip_;  // Null for an uncompressed file.
  std::unique_ptr<char[]> buffer_;
  const size_t buffer_size_;
  size_t buffer_pos_ = 0;
  size_t buffer_end_ = 0;
  int64_t offset_ = 0;
  int64_t record_offset_ = 0;
  absl::Status status_;
};

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_RECORD_IO_H_
