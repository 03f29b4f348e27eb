#include "common/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status.h"

namespace downpour {
namespace {

constexpr size_t kWriteBufferSize = size_t{1} << 20;
// What is checksummed, then copied or written, at a time: well inside a
// core's L2, so the second pass reads it from there.
constexpr size_t kChunk = size_t{256} << 10;
// Bypassing the page cache: O_DIRECT wants the memory, the file offset and
// the length of each write aligned; 4 KiB suits every block size in use.
// Writes of 4 MiB keep the disk near its sequential rate.
constexpr size_t kDirectAlignment = 4096;
constexpr size_t kAlignedBufferSize = size_t{4} << 20;

std::string Dirname(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

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

absl::Status SyncParentDirectory(const std::string& path) {
  const std::string dir = Dirname(path);
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open directory ", dir));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("cannot fsync directory ", dir));
  return absl::OkStatus();
}

void AtomicFile::FreeDeleter::operator()(char* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path,
                                                               absl::string_view kind,
                                                               Caching caching) {
  const std::string tmp_path = absl::StrCat(path, ".tmp");
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  std::unique_ptr<char, FreeDeleter> aligned;
  int fd = -1;
  if (caching == Caching::kBypass) {
    aligned.reset(static_cast<char*>(std::aligned_alloc(kDirectAlignment, kAlignedBufferSize)));
    // A filesystem without O_DIRECT (EINVAL) is written through the cache.
    if (aligned != nullptr) fd = open(tmp_path.c_str(), flags | O_DIRECT, 0644);
    if (fd < 0) aligned.reset();
  }
  if (fd < 0) fd = open(tmp_path.c_str(), flags, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create ", kind, " ", tmp_path));
  return std::unique_ptr<AtomicFile>(
      new AtomicFile(path, std::string(kind), fd, std::move(aligned)));
}

AtomicFile::AtomicFile(std::string path, std::string kind, int fd,
                       std::unique_ptr<char, FreeDeleter> aligned)
    : path_(std::move(path)),
      tmp_path_(path_ + ".tmp"),
      kind_(std::move(kind)),
      fd_(fd),
      aligned_(std::move(aligned)),
      direct_(aligned_ != nullptr) {
  if (aligned_ == nullptr) buffer_.reserve(kWriteBufferSize);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_path_.c_str());
}

absl::Status AtomicFile::Flush() {
  RETURN_IF_ERROR(WriteAll(buffer_.data(), buffer_.size()));
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status AtomicFile::WriteAll(const char* data, size_t n) {
  while (n > 0) {
    const ssize_t written = write(fd_, data, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {
        // The filesystem took O_DIRECT at open but not for writing.
        RETURN_IF_ERROR(StopBypassing());
        continue;
      }
      return ErrnoStatus(errno, absl::StrCat("cannot write ", kind_, " ", tmp_path_));
    }
    data += written;
    n -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Append(absl::string_view data) {
  if (committed_ || fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind_, " ", path_, " is already closed; cannot write to it"));
  }
  bytes_ += data.size();
  if (aligned_ != nullptr) return AppendAligned(data);
  if (buffer_.size() + data.size() > kWriteBufferSize) {
    RETURN_IF_ERROR(Flush());
    if (data.size() >= kWriteBufferSize) {
      // Large pieces go to the file from where they are, never copied here.
      for (size_t at = 0; at < data.size(); at += kChunk) {
        const size_t n = std::min(kChunk, data.size() - at);
        crc_ = Crc32cExtend(crc_, data.data() + at, n);
        RETURN_IF_ERROR(WriteAll(data.data() + at, n));
      }
      return absl::OkStatus();
    }
  }
  crc_ = Crc32cExtend(crc_, data.data(), data.size());
  buffer_.append(data.data(), data.size());
  return absl::OkStatus();
}

absl::Status AtomicFile::AppendAligned(absl::string_view data) {
  for (size_t at = 0; at < data.size();) {
    const size_t n = std::min({kChunk, kAlignedBufferSize - aligned_used_, data.size() - at});
    crc_ = Crc32cExtend(crc_, data.data() + at, n);
    std::memcpy(aligned_.get() + aligned_used_, data.data() + at, n);
    aligned_used_ += n;
    at += n;
    if (aligned_used_ == kAlignedBufferSize) {
      RETURN_IF_ERROR(WriteAll(aligned_.get(), aligned_used_));
      aligned_used_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::StopBypassing() {
  if (!direct_) return absl::OkStatus();
  const int flags = fcntl(fd_, F_GETFL);
  if (flags < 0 || fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot write ", kind_, " ", tmp_path_));
  }
  direct_ = false;
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (committed_) return absl::OkStatus();
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind_, " ", path_, " failed earlier and cannot be committed"));
  }
  if (aligned_ != nullptr) {
    // Whole aligned blocks around the cache, the tail through it.
    const size_t whole = aligned_used_ - aligned_used_ % kDirectAlignment;
    RETURN_IF_ERROR(WriteAll(aligned_.get(), whole));
    if (whole < aligned_used_) {
      RETURN_IF_ERROR(StopBypassing());
      RETURN_IF_ERROR(WriteAll(aligned_.get() + whole, aligned_used_ - whole));
    }
    aligned_used_ = 0;
  }
  RETURN_IF_ERROR(Flush());
  if (fsync(fd_) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot fsync ", kind_, " ", tmp_path_));
  }
  const int rc = close(fd_);
  const int err = errno;
  fd_ = -1;
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("cannot close ", kind_, " ", tmp_path_));
  if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", tmp_path_, " to ", kind_, " ", path_));
  }
  committed_ = true;
  return SyncParentDirectory(path_);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 absl::string_view what) {
  absl::StatusOr<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(path, what);
  if (!file.ok()) return file.status();
  absl::Status written = (*file)->Append(contents);
  if (!written.ok()) return written;
  return (*file)->Commit();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
  }
  std::string contents(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = read(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot read ", path));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return contents;
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty directory path");
  size_t at = 0;
  while (at != std::string::npos) {
    at = path.find('/', at + 1);
    const std::string prefix = path.substr(0, at);
    if (prefix.empty()) continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("cannot create directory ", prefix));
    }
  }
  struct stat info;
  if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, absl::StrCat("cannot list directory ", path));
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveAll(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("cannot stat ", path));
  }
  if (S_ISDIR(info.st_mode)) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
    for (const std::string& name : names) RETURN_IF_ERROR(RemoveAll(path + "/" + name));
    if (rmdir(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("cannot remove ", path));
    return absl::OkStatus();
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("cannot remove ", path));
  }
  return absl::OkStatus();
}

}  // namespace downpour
