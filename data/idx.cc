#include "data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "data/example.h"
#include "data/record_io.h"

namespace downpour {
namespace data {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
// Refuses headers whose item count or item size would not fit in memory
// anyway, before any allocation is attempted.
constexpr int64_t kMaxItemBytes = int64_t{1} << 30;

gzFile AsGz(void* file) { return static_cast<gzFile>(file); }

// Reads exactly `n` bytes; returns the number read (short only at end of
// file) or an error naming `path`.
absl::StatusOr<int64_t> GzReadFully(gzFile file, const std::string& path, void* out, int64_t n) {
  auto* dst = static_cast<uint8_t*>(out);
  int64_t done = 0;
  while (done < n) {
    const unsigned chunk =
        static_cast<unsigned>(std::min<int64_t>(n - done, std::numeric_limits<int>::max()));
    const int got = gzread(file, dst + done, chunk);
    if (got < 0) {
      int errnum = 0;
      const char* message = gzerror(file, &errnum);
      if (errnum == Z_ERRNO) message = std::strerror(errno);
      return absl::DataLossError(absl::StrCat("cannot read IDX file ", path, ": ", message));
    }
    if (got == 0) break;
    done += got;
  }
  return done;
}

absl::Status MakeDirectories(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    prefix = dir.substr(0, pos);
    if (prefix.empty() || prefix == "/") continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create output directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("output path ", dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<IdxReader>> IdxReader::Open(const std::string& path,
                                                           int expected_dims) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot open IDX file ", path, ": ",
                                             err != 0 ? std::strerror(err) : "out of memory");
    return err == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  gzbuffer(file, 1 << 20);
  std::unique_ptr<IdxReader> reader(new IdxReader(path, file));

  uint8_t magic[4];
  ASSIGN_OR_RETURN(int64_t got, GzReadFully(file, path, magic, sizeof(magic)));
  const uint32_t expected_magic = (uint32_t{kUnsignedByteType} << 8) | expected_dims;
  if (got < 4 || magic[0] != 0 || magic[1] != 0 || magic[3] != expected_dims ||
      magic[2] != kUnsignedByteType) {
    const uint32_t found = got < 4 ? 0
                                   : (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                                         (uint32_t{magic[2]} << 8) | magic[3];
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not an IDX file of unsigned bytes with %d dimension(s): magic number %s, "
        "expected 0x%08x",
        path, expected_dims,
        got < 4 ? "missing (file too short)" : absl::StrFormat("0x%08x", found), expected_magic));
  }

  for (int d = 0; d < expected_dims; ++d) {
    uint8_t be[4];
    ASSIGN_OR_RETURN(got, GzReadFully(file, path, be, sizeof(be)));
    if (got < 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("IDX file ", path, " ends inside its header (dimension ", d, ")"));
    }
    const int64_t dim =
        (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | int64_t{be[3]};
    if (dim <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("IDX file ", path, " has dimension ", d, " of size 0"));
    }
    reader->dims_.push_back(dim);
    if (d > 0) {
      reader->item_size_ *= dim;
      if (reader->item_size_ > kMaxItemBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("IDX file ", path, " declares items larger than 1 GiB"));
      }
    }
  }
  return reader;
}

IdxReader::IdxReader(std::string path, void* file) : path_(std::move(path)), file_(file) {}

IdxReader::~IdxReader() { gzclose(AsGz(file_)); }

absl::Status IdxReader::CheckRemaining(int64_t count) const {
  if (count < 0 || items_read_ + count > num_items()) {
    return absl::OutOfRangeError(absl::StrCat("cannot read ", count, " items from IDX file ", path_,
                                              ": only ", num_items() - items_read_, " of ",
                                              num_items(), " remain"));
  }
  return absl::OkStatus();
}

absl::Status IdxReader::Truncated(int64_t got) const {
  return absl::DataLossError(absl::StrCat("IDX file ", path_, " is truncated: its header declares ",
                                          num_items(), " items but it ends after ",
                                          items_read_ + got / item_size_));
}

absl::Status IdxReader::ReadItems(int64_t count, uint8_t* out) {
  RETURN_IF_ERROR(CheckRemaining(count));
  const int64_t want = count * item_size_;
  ASSIGN_OR_RETURN(const int64_t got, GzReadFully(AsGz(file_), path_, out, want));
  if (got < want) return Truncated(got);
  items_read_ += count;
  return absl::OkStatus();
}

absl::Status IdxReader::ReadItem(std::vector<uint8_t>* item) {
  if (static_cast<int64_t>(item->size()) >= item_size_) {
    item->resize(item_size_);
    return ReadItems(1, item->data());
  }
  RETURN_IF_ERROR(CheckRemaining(1));
  // 1 MiB at first (more than an image of a real data set), then doubling.
  constexpr int64_t kFirstBytes = int64_t{1} << 20;
  int64_t done = 0;
  while (done < item_size_) {
    const int64_t size = std::min(item_size_, std::max(kFirstBytes, 2 * done));
    item->resize(size);
    ASSIGN_OR_RETURN(const int64_t got,
                     GzReadFully(AsGz(file_), path_, item->data() + done, size - done));
    if (got < size - done) return Truncated(done + got);
    done = size;
  }
  ++items_read_;
  return absl::OkStatus();
}

absl::Status IdxReader::CheckAtEnd() {
  uint8_t extra;
  ASSIGN_OR_RETURN(const int64_t got, GzReadFully(AsGz(file_), path_, &extra, 1));
  if (got != 0 || items_read_ != num_items()) {
    return absl::DataLossError(absl::StrCat("IDX file ", path_, " has data after the last of its ",
                                            num_items(), " declared items"));
  }
  return absl::OkStatus();
}

std::string ShardFileName(const std::string& name, int index, int num_shards) {
  return absl::StrFormat("%s-%05d-of-%05d.tfrecord", name, index, num_shards);
}

absl::StatusOr<int64_t> ImportIdx(const IdxImportOptions& options) {
  if (options.images_path.empty() || options.labels_path.empty() || options.out_dir.empty() ||
      options.name.empty()) {
    return absl::InvalidArgumentError(
        "IDX import needs images_path, labels_path, out_dir and name; one of them is empty");
  }
  if (options.num_shards < 1 || options.num_shards > 99999) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX import num_shards must be between 1 and 99999; got ", options.num_shards));
  }
  if (options.limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX import limit must be >= 0 (0 = all); got ", options.limit));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<IdxReader> images, IdxReader::Open(options.images_path, 3));
  ASSIGN_OR_RETURN(std::unique_ptr<IdxReader> labels, IdxReader::Open(options.labels_path, 1));
  if (images->num_items() != labels->num_items()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX image file ", options.images_path, " holds ", images->num_items(),
        " images but label file ", options.labels_path, " holds ", labels->num_items(), " labels"));
  }
  const int64_t total =
      options.limit == 0 ? images->num_items() : std::min(options.limit, images->num_items());

  RETURN_IF_ERROR(MakeDirectories(options.out_dir));
  std::vector<std::unique_ptr<RecordWriter>> writers;
  for (int s = 0; s < options.num_shards; ++s) {
    ASSIGN_OR_RETURN(auto writer, RecordWriter::Open(absl::StrCat(
                                      options.out_dir, "/",
                                      ShardFileName(options.name, s, options.num_shards))));
    writers.push_back(std::move(writer));
  }

  const std::vector<int64_t> shape = {images->dims()[1], images->dims()[2], 1};
  std::vector<uint8_t> pixels;  // Grows with the first image's bytes.
  uint8_t label = 0;
  for (int64_t i = 0; i < total; ++i) {
    RETURN_IF_ERROR(images->ReadItem(&pixels));
    RETURN_IF_ERROR(labels->ReadItems(1, &label));
    RETURN_IF_ERROR(writers[i % options.num_shards]->Write(
        EncodeImageExample(pixels.data(), images->item_size(), label, shape)));
  }
  if (total == images->num_items()) {
    RETURN_IF_ERROR(images->CheckAtEnd());
    RETURN_IF_ERROR(labels->CheckAtEnd());
  }
  // Writers destroyed on an early return above remove their temporary files.
  for (auto& writer : writers) RETURN_IF_ERROR(writer->Close());
  return total;
}

}  // namespace data
}  // namespace downpour
