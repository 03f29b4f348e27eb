#include "data/record_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/status.h"

namespace downpour {
namespace data {
namespace {

void EncodeFixed64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void EncodeFixed32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t DecodeFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint32_t DecodeFixed32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

// ---------------------------------------------------------------- RecordWriter

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path, "record file"));
  return std::unique_ptr<RecordWriter>(new RecordWriter(std::move(file)));
}

RecordWriter::RecordWriter(std::unique_ptr<AtomicFile> file) : file_(std::move(file)) {}

RecordWriter::~RecordWriter() = default;

absl::Status RecordWriter::Write(absl::string_view record) {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("record file ", file_->path(), " is already closed; cannot write to it"));
  }
  char header[kRecordHeaderBytes];
  EncodeFixed64(record.size(), header);
  EncodeFixed32(MaskCrc(Crc32c(header, 8)), header + 8);
  char footer[kRecordFooterBytes];
  EncodeFixed32(MaskCrc(Crc32c(record.data(), record.size())), footer);
  RETURN_IF_ERROR(file_->Append(absl::string_view(header, sizeof(header))));
  RETURN_IF_ERROR(file_->Append(record));
  RETURN_IF_ERROR(file_->Append(absl::string_view(footer, sizeof(footer))));
  ++records_written_;
  return absl::OkStatus();
}

absl::Status RecordWriter::Close() {
  RETURN_IF_ERROR(file_->Commit());
  closed_ = true;
  return absl::OkStatus();
}

// ---------------------------------------------------------------- RecordReader

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path,
                                                                 size_t buffer_size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open record file ", path));
  // Advice only; reading works the same if the kernel ignores it.
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<RecordReader>(
      new RecordReader(path, fd, buffer_size == 0 ? kDefaultBufferSize : buffer_size));
}

RecordReader::RecordReader(std::string path, int fd, size_t buffer_size)
    : path_(std::move(path)), fd_(fd), buffer_(new char[buffer_size]), buffer_size_(buffer_size) {}

RecordReader::~RecordReader() { close(fd_); }

absl::Status RecordReader::Corrupt(absl::string_view what) const {
  return absl::DataLossError(
      absl::StrCat("corrupt record in ", path_, " at offset ", record_offset_, ": ", what));
}

absl::StatusOr<size_t> RecordReader::ReadBytes(char* dst, size_t n) {
  size_t done = 0;
  while (done < n) {
    if (buffer_pos_ < buffer_end_) {
      const size_t take = std::min(n - done, buffer_end_ - buffer_pos_);
      std::memcpy(dst + done, buffer_.get() + buffer_pos_, take);
      buffer_pos_ += take;
      done += take;
      continue;
    }
    // The buffer is empty: read a large remainder directly into `dst`, else refill.
    const bool direct = n - done >= buffer_size_;
    char* target = direct ? dst + done : buffer_.get();
    const size_t want = direct ? n - done : buffer_size_;
    const ssize_t got = read(fd_, target, want);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("cannot read record file ", path_, " at offset ",
                                             offset_ + static_cast<int64_t>(done)));
    }
    if (got == 0) break;
    if (direct) {
      done += static_cast<size_t>(got);
    } else {
      buffer_pos_ = 0;
      buffer_end_ = static_cast<size_t>(got);
    }
  }
  offset_ += static_cast<int64_t>(done);
  return done;
}

absl::StatusOr<bool> RecordReader::Read(std::string* record) {
  if (!status_.ok()) return status_;
  record_offset_ = offset_;
  auto fail = [this](absl::Status s) {
    status_ = s;
    return s;
  };

  char header[kRecordHeaderBytes];
  absl::StatusOr<size_t> got = ReadBytes(header, sizeof(header));
  if (!got.ok()) return fail(got.status());
  if (*got == 0) return false;
  if (*got < sizeof(header)) {
    return fail(Corrupt(absl::StrCat("truncated header (", *got, " of ", sizeof(header),
                                     " bytes before end of file)")));
  }
  const uint64_t length = DecodeFixed64(header);
  if (UnmaskCrc(DecodeFixed32(header + 8)) != Crc32c(header, 8)) {
    return fail(Corrupt("length checksum mismatch"));
  }
  if (length > kMaxRecordLength) {
    return fail(Corrupt(
        absl::StrCat("length ", length, " exceeds the limit of ", kMaxRecordLength, " bytes")));
  }
  record->resize(length);
  got = ReadBytes(record->data(), length);
  if (!got.ok()) return fail(got.status());
  if (*got < length) {
    return fail(Corrupt(
        absl::StrCat("truncated payload (", *got, " of ", length, " bytes before end of file)")));
  }
  char footer[kRecordFooterBytes];
  got = ReadBytes(footer, sizeof(footer));
  if (!got.ok()) return fail(got.status());
  if (*got < sizeof(footer)) return fail(Corrupt("truncated payload checksum"));
  if (UnmaskCrc(DecodeFixed32(footer)) != Crc32c(record->data(), record->size())) {
    return fail(Corrupt("payload checksum mismatch"));
  }
  return true;
}

}  // namespace data
}  // namespace downpour
