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
#include "zlib.h"

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

// gzip's magic bytes (RFC 1952).
constexpr unsigned char kGzipMagic[2] = {0x1f, 0x8b};
// zlib's windowBits for a gzip wrapper instead of a zlib one.
constexpr int kGzipWindowBits = 16 + MAX_WBITS;
constexpr size_t kCompressedBufferSize = size_t{256} << 10;

}  // namespace

struct GzipStream {
  explicit GzipStream(bool deflating)
      : deflating(deflating), buffer(new char[kCompressedBufferSize]) {
    std::memset(&z, 0, sizeof(z));
  }
  ~GzipStream() {
    if (!initialized) return;
    if (deflating) {
      deflateEnd(&z);
    } else {
      inflateEnd(&z);
    }
  }
  GzipStream(const GzipStream&) = delete;
  GzipStream& operator=(const GzipStream&) = delete;

  const bool deflating;
  z_stream z;
  bool initialized = false;
  std::unique_ptr<char[]> buffer;  // Compressed bytes: read ahead, or waiting to be written.
  bool end_of_file = false;        // Reading: the file has no more compressed bytes.
  bool member_ended = false;       // Reading: inflate reached the end of a gzip member.
  int64_t compressed_offset = 0;   // Reading: compressed bytes read from the file.
};

// ---------------------------------------------------------------- RecordWriter

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(const std::string& path,
                                                                 Compression compression) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path, "record file"));
  std::unique_ptr<GzipStream> gzip;
  if (compression == Compression::kGzip) {
    gzip = std::make_unique<GzipStream>(/*deflating=*/true);
    if (deflateInit2(&gzip->z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, kGzipWindowBits, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start gzip compression of record file ", path));
    }
    gzip->initialized = true;
  }
  return std::unique_ptr<RecordWriter>(new RecordWriter(std::move(file), std::move(gzip)));
}

RecordWriter::RecordWriter(std::unique_ptr<AtomicFile> file, std::unique_ptr<GzipStream> gzip)
    : file_(std::move(file)), gzip_(std::move(gzip)) {}

RecordWriter::~RecordWriter() = default;

absl::Status RecordWriter::Append(absl::string_view bytes, bool finish) {
  if (gzip_ == nullptr) return file_->Append(bytes);
  z_stream& z = gzip_->z;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(gzip_->buffer.get());
    z.avail_out = static_cast<uInt>(kCompressedBufferSize);
    const int rc = deflate(&z, finish ? Z_FINISH : Z_NO_FLUSH);
    if (rc == Z_STREAM_ERROR) {
      return absl::InternalError(absl::StrCat("gzip compression of ", file_->path(), " failed"));
    }
    const size_t have = kCompressedBufferSize - z.avail_out;
    if (have > 0) RETURN_IF_ERROR(file_->Append(absl::string_view(gzip_->buffer.get(), have)));
    if (finish ? rc == Z_STREAM_END : (z.avail_in == 0 && z.avail_out > 0)) return absl::OkStatus();
  }
}

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
  RETURN_IF_ERROR(Append(absl::string_view(header, sizeof(header))));
  RETURN_IF_ERROR(Append(record));
  RETURN_IF_ERROR(Append(absl::string_view(footer, sizeof(footer))));
  return absl::OkStatus();
}

absl::Status RecordWriter::Close() {
  if (closed_) return absl::OkStatus();
  if (gzip_ != nullptr) RETURN_IF_ERROR(Append(absl::string_view(), /*finish=*/true));
  RETURN_IF_ERROR(file_->Commit());
  closed_ = true;
  return absl::OkStatus();
}

// ---------------------------------------------------------------- RecordReader

namespace {

// Whether the file behind `fd` is gzip-compressed, by its first bytes: the
// magic, unless those bytes are also a valid uncompressed record header.
absl::StatusOr<bool> LooksGzipped(int fd, const std::string& path) {
  char head[kRecordHeaderBytes];
  ssize_t got;
  do {
    got = pread(fd, head, sizeof(head), 0);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return ErrnoStatus(errno, absl::StrCat("cannot read record file ", path));
  if (got < 2 || static_cast<unsigned char>(head[0]) != kGzipMagic[0] ||
      static_cast<unsigned char>(head[1]) != kGzipMagic[1]) {
    return false;
  }
  if (got < static_cast<ssize_t>(sizeof(head))) return true;
  return UnmaskCrc(DecodeFixed32(head + 8)) != Crc32c(head, 8);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path,
                                                                 size_t buffer_size,
                                                                 Compression compression) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open record file ", path));
  bool gzipped = false;
  if (compression != Compression::kNone) {
    absl::StatusOr<bool> looks = LooksGzipped(fd, path);
    if (!looks.ok()) {
      close(fd);
      return looks.status();
    }
    gzipped = *looks;
    if (compression == Compression::kGzip && !gzipped) {
      close(fd);
      return absl::DataLossError(absl::StrCat(
          "record file ", path,
          " is not GZIP-compressed (it does not start with gzip's magic bytes 1f 8b), but the "
          "job spec says compression: GZIP"));
    }
  }
  std::unique_ptr<GzipStream> gzip;
  if (gzipped) {
    gzip = std::make_unique<GzipStream>(/*deflating=*/false);
    if (inflateInit2(&gzip->z, kGzipWindowBits) != Z_OK) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start gzip decompression of record file ", path));
    }
    gzip->initialized = true;
  }
  // Advice only; reading works the same if the kernel ignores it.
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<RecordReader>(new RecordReader(
      path, fd, buffer_size == 0 ? kDefaultBufferSize : buffer_size, std::move(gzip)));
}

RecordReader::RecordReader(std::string path, int fd, size_t buffer_size,
                           std::unique_ptr<GzipStream> gzip)
    : path_(std::move(path)),
      fd_(fd),
      gzip_(std::move(gzip)),
      buffer_(new char[buffer_size]),
      buffer_size_(buffer_size) {}

RecordReader::~RecordReader() { close(fd_); }

absl::Status RecordReader::Corrupt(absl::string_view path, int64_t offset, bool compressed,
                                   absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt record in ", path, " at offset ", offset,
                                          compressed ? " of its uncompressed stream" : "", ": ",
                                          what));
}

absl::Status RecordReader::Corrupt(absl::string_view what) const {
  return Corrupt(path_, record_offset_, gzip_ != nullptr, what);
}

absl::StatusOr<size_t> RecordReader::Fill(char* target, size_t want) {
  if (gzip_ != nullptr) return Inflate(target, want);
  while (true) {
    const ssize_t got = read(fd_, target, want);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) {
      return ErrnoStatus(errno,
                         absl::StrCat("cannot read record file ", path_, " at offset ", offset_));
    }
  }
}

absl::StatusOr<size_t> RecordReader::Inflate(char* target, size_t want) {
  GzipStream& gz = *gzip_;
  z_stream& z = gz.z;
  auto corrupt = [this, &gz](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("corrupt gzip stream in ", path_, " (after ",
                                            gz.compressed_offset, " compressed bytes): ", what));
  };
  z.next_out = reinterpret_cast<Bytef*>(target);
  z.avail_out = static_cast<uInt>(std::min<size_t>(want, uInt{1} << 30));
  const uInt asked = z.avail_out;
  while (z.avail_out == asked) {
    if (z.avail_in == 0 && !gz.end_of_file) {
      const ssize_t got = read(fd_, gz.buffer.get(), kCompressedBufferSize);
      if (got < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, absl::StrCat("cannot read record file ", path_, " at offset ",
                                               gz.compressed_offset));
      }
      if (got == 0) {
        gz.end_of_file = true;
      } else {
        z.next_in = reinterpret_cast<Bytef*>(gz.buffer.get());
        z.avail_in = static_cast<uInt>(got);
        gz.compressed_offset += got;
      }
    }
    if (gz.member_ended) {
      if (z.avail_in == 0) {
        if (gz.end_of_file) break;  // A clean end after a complete member.
        continue;
      }
      // Another member follows (concatenated gzip files are one stream, as gzip -d reads them).
      if (inflateReset(&z) != Z_OK) return corrupt("cannot restart inflate");
      gz.member_ended = false;
    }
    if (z.avail_in == 0 && gz.end_of_file) {
      return corrupt("the file ends inside compressed data (truncated)");
    }
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      gz.member_ended = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return corrupt(z.msg != nullptr ? z.msg : absl::StrCat("inflate error ", rc));
    }
  }
  return static_cast<size_t>(asked - z.avail_out);
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
    absl::StatusOr<size_t> got = Fill(target, want);
    if (!got.ok()) return got.status();
    if (*got == 0) break;
    if (direct) {
      done += *got;
    } else {
      buffer_pos_ = 0;
      buffer_end_ = *got;
    }
  }
  offset_ += static_cast<int64_t>(done);
  return done;
}

absl::StatusOr<bool> RecordReader::Read(std::string* record) {
  uint32_t payload_crc = 0;
  absl::StatusOr<bool> got = Read(record, &payload_crc);
  if (got.ok() && *got && !PayloadIntact(*record, payload_crc)) {
    status_ = PayloadCorrupt(path_, record_offset_, gzip_ != nullptr);
    return status_;
  }
  return got;
}

bool RecordReader::PayloadIntact(absl::string_view payload, uint32_t payload_crc) {
  return UnmaskCrc(payload_crc) == Crc32c(payload.data(), payload.size());
}

absl::StatusOr<bool> RecordReader::Read(std::string* record, uint32_t* payload_crc) {
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
  if (buffer_end_ - buffer_pos_ >= length) {
    // All in the buffer (nearly every record): copied once, where resize
    // would first fill the string with zeros.
    record->assign(buffer_.get() + buffer_pos_, length);
    buffer_pos_ += length;
    offset_ += static_cast<int64_t>(length);
    got = length;
  } else {
    record->resize(length);
    got = ReadBytes(record->data(), length);
    if (!got.ok()) return fail(got.status());
  }
  if (*got < length) {
    return fail(Corrupt(
        absl::StrCat("truncated payload (", *got, " of ", length, " bytes before end of file)")));
  }
  char footer[kRecordFooterBytes];
  got = ReadBytes(footer, sizeof(footer));
  if (!got.ok()) return fail(got.status());
  if (*got < sizeof(footer)) return fail(Corrupt("truncated payload checksum"));
  *payload_crc = DecodeFixed32(footer);
  return true;
}

}  // namespace data
}  // namespace downpour
