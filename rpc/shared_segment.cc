#include "rpc/shared_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status.h"

namespace downpour {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::string Errno(int err) { return std::strerror(err); }

// Compares without stopping at the first difference.
bool SameBytes(const char* a, const char* b, size_t n) {
  unsigned char diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Create(int64_t size) {
  if (size < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a shared memory segment needs at least ",
                                                   kHeaderBytes, " bytes, not ", size));
  }
  const int fd = memfd_create("downpour-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(errno, "cannot create a shared memory segment (memfd_create)");
  auto fail = [fd](const char* what) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot set up a shared memory segment (", what, ")"));
  };
  if (ftruncate(fd, size) != 0) return fail("ftruncate");
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap");
  std::string token(kTokenBytes, '\0');
  if (getrandom(token.data(), token.size(), 0) != static_cast<ssize_t>(token.size())) {
    munmap(data, size);
    return fail("getrandom");
  }
  std::memcpy(data, token.data(), token.size());
  if (fcntl(fd, F_ADD_SEALS, kRequiredSeals) != 0) {
    munmap(data, size);
    return fail("F_ADD_SEALS");
  }
  std::shared_ptr<SharedSegment> segment(new SharedSegment(fd, static_cast<char*>(data), size));
  segment->attach_.set_pid(getpid());
  segment->attach_.set_fd(fd);
  segment->attach_.set_token(std::move(token));
  segment->attach_.set_size(size);
  return segment;
}

absl::Status SharedSegment::CheckAttach(const SharedSegmentAttach& attach, int64_t max_size) {
  if (attach.pid() <= 0 || attach.fd() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("attach.pid ", attach.pid(), " and attach.fd ",
                                                   attach.fd(), " name no open file"));
  }
  if (attach.token().size() != kTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach.token has ", attach.token().size(), " bytes, not ", kTokenBytes));
  }
  if (attach.size() < kHeaderBytes || attach.size() > max_size) {
    return absl::InvalidArgumentError(absl::StrCat("attach.size ", attach.size(),
                                                   " is outside the sizes this shard maps (",
                                                   kHeaderBytes, " to ", max_size, " bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Open(
    const SharedSegmentAttach& attach, int64_t max_size) {
  RETURN_IF_ERROR(CheckAttach(attach, max_size));
  const std::string process = absl::StrCat("/proc/", attach.pid());
  struct stat owner;
  if (stat(process.c_str(), &owner) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no process ", attach.pid(), " on this shard's host (", Errno(errno), ")"));
  }
  if (owner.st_uid != geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("process ", attach.pid(), " runs as another user than this shard"));
  }
  // Only a memfd is opened: not a device or a pipe that the worker might
  // name, whose open could block or do something.
  const std::string path = absl::StrCat(process, "/fd/", attach.fd());
  char target[256] = {};
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  if (n < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, " (", Errno(errno), ")"));
  }
  if (!absl::StartsWith(absl::string_view(target, n), "/memfd:")) {
    // What it is instead is not said: the caller learns nothing of the
    // files other processes hold.
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a memfd"));
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, " (", Errno(errno), ")"));
  }
  // The file is closed once mapped (or refused); the mapping keeps it.
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  // The seals first: with them the size below can no longer change.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " cannot be sealed (", Errno(errno), ")"));
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not sealed against shrinking, growing and resealing (seals ", seals, ", needs ",
        kRequiredSeals, "): a segment that can shrink could crash the shard"));
  }
  // A memfd of huge pages could fault (SIGBUS) where the pool runs dry.
  struct statfs filesystem;
  if (fstatfs(fd, &filesystem) != 0 || filesystem.f_type != TMPFS_MAGIC) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a memfd of ordinary pages (huge pages are refused)"));
  }
  struct stat file;
  if (fstat(fd, &file) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot stat ", path, " (", Errno(errno), ")"));
  }
  if (!S_ISREG(file.st_mode) || file.st_size != attach.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach.size ", attach.size(), " is not the segment's size, ", file.st_size));
  }
  void* data = mmap(nullptr, attach.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map ", path, " (", Errno(errno), ")"));
  }
  std::shared_ptr<SharedSegment> segment(
      new SharedSegment(-1, static_cast<char*>(data), attach.size()));
  if (!SameBytes(segment->data(), attach.token().data(), kTokenBytes)) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, " does not start with attach.token: it is not the caller's segment"));
  }
  return segment;
}

SharedSegment::~SharedSegment() {
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<char*> SharedSegment::Range(int64_t offset, int64_t length,
                                           absl::string_view offset_field,
                                           absl::string_view length_field) const {
  if (offset < kHeaderBytes || offset > size_ || length < 0 || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        offset_field, " ", offset, " and ", length_field, " ", length,
        " do not lie within the shared memory segment's bytes [", kHeaderBytes, ", ", size_, ")"));
  }
  return data_ + offset;
}

absl::StatusOr<std::unique_ptr<SharedSegmentQuota::Reservation>> SharedSegmentQuota::Reserve(
    int64_t pid, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  Use& use = use_[pid];
  if (use.segments + 1 > max_segments_ || bytes > max_bytes_ - use.bytes) {
    const Use held = use;
    if (use.segments == 0) use_.erase(pid);
    return absl::ResourceExhaustedError(absl::StrCat(
        "process ", pid, " has ", held.segments, " shared memory segments of ", held.bytes,
        " bytes mapped here, and another of ", bytes, " would pass this shard's bound of ",
        max_segments_, " segments or ", max_bytes_, " bytes"));
  }
  ++use.segments;
  use.bytes += bytes;
  ++total_.segments;
  total_.bytes += bytes;
  return std::unique_ptr<Reservation>(new Reservation(this, pid, bytes));
}

void SharedSegmentQuota::Release(int64_t pid, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  Use& use = use_[pid];
  --use.segments;
  use.bytes -= bytes;
  if (use.segments == 0) use_.erase(pid);
  --total_.segments;
  total_.bytes -= bytes;
}

int SharedSegmentQuota::segments() const {
  absl::MutexLock lock(&mu_);
  return total_.segments;
}

int64_t SharedSegmentQuota::bytes() const {
  absl::MutexLock lock(&mu_);
  return total_.bytes;
}

bool SharedSegmentQuota::AwaitSegments(int segments, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, segments]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return total_.segments == segments; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace downpour
