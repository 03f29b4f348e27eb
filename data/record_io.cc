#include "data/record_io.h"

#include <fcntl.h>
#include <libgen.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status.h"

namespace downpour {
namespace data {
namespace {

constexpr size_t kWriteBufferSize = size_t{1} << 20;

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

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

// Makes a completed rename durable; a failure here is reported but the file is
// already complete under its final name.
absl::Status SyncParentDirectory(const std::string& path) {
  std::string copy = path;
  const std::string dir = dirname(copy.data());
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open directory ", dir));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("cannot fsync directory ", dir));
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- RecordWriter

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(const std::string& path) {
  std::string tmp_path = absl::StrCat(path, ".tmp");
  const int fd = open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create record file ", tmp_path));
  return std::unique_ptr<RecordWriter>(new RecordWriter(path, std::move(tmp_path), fd));
}

RecordWriter::RecordWriter(std::string path, std::string tmp_path, int fd)
    : path_(std::move(path)), tmp_path_(std::move(tmp_path)), fd_(fd) {
  buffer_.reserve(kWriteBufferSize);
}

RecordWriter::~RecordWriter() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(tmp_path_.c_str());
  }
}

absl::Status RecordWriter::WriteFully(const char* data, size_t n) {
  while (n > 0) {
    const ssize_t written = write(fd_, data, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("cannot write record file ", tmp_path_));
    }
    data += written;
    n -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status RecordWriter::FlushBuffer() {
  RETURN_IF_ERROR(WriteFully(buffer_.data(), buffer_.size()));
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status RecordWriter::Write(absl::string_view record) {
  if (closed_ || fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("record file ", path_, " is already closed; cannot write to it"));
  }
  char header[kRecordHeaderBytes];
  EncodeFixed64(record.size(), header);
  EncodeFixed32(MaskCrc(Crc32c(header, 8)), header + 8);
  char footer[kRecordFooterBytes];
  EncodeFixed32(MaskCrc(Crc32c(record.data(), record.size())), footer);

  buffer_.append(header, sizeof(header));
  if (buffer_.size() + record.size() > kWriteBufferSize) {
    // Large payloads go straight to the file instead of through the buffer.
    RETURN_IF_ERROR(FlushBuffer());
    RETURN_IF_ERROR(WriteFully(record.data(), record.size()));
  } else {
    buffer_.append(record.data(), record.size());
  }
  buffer_.append(footer, sizeof(footer));
  if (buffer_.size() >= kWriteBufferSize) RETURN_IF_ERROR(FlushBuffer());
  ++records_written_;
  bytes_written_ += kRecordHeaderBytes + record.size() + kRecordFooterBytes;
  return absl::OkStatus();
}

absl::Status RecordWriter::Close() {
  if (closed_) return absl::OkStatus();
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("record file ", path_, " failed earlier and cannot be closed"));
  }
  RETURN_IF_ERROR(FlushBuffer());
  if (fsync(fd_) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot fsync record file ", tmp_path_));
  }
  const int rc = close(fd_);
  const int err = errno;
  fd_ = -1;
  if (rc != 0) {
    unlink(tmp_path_.c_str());
    return ErrnoStatus(err, absl::StrCat("cannot close record file ", tmp_path_));
  }
  if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int rename_err = errno;
    unlink(tmp_path_.c_str());
    return ErrnoStatus(rename_err,
                       absl::StrCat("cannot rename ", tmp_path_, " to record file ", path_));
  }
  closed_ = true;
  return SyncParentDirectory(path_);
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
