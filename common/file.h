// Files that must never be seen half-written (record files, checkpoints,
// manifests), and the few filesystem operations around them. Errors are
// absl::Status naming the file and the system's reason (ENOENT -> NotFound,
// EACCES -> PermissionDenied, ENOSPC -> ResourceExhausted, else Internal).
//
// Thread-safety: the free functions are thread-safe; an AtomicFile is used by
// one thread at a time. Ownership: an AtomicFile owns its descriptor and its
// temporary file until Commit.
#ifndef DOWNPOUR_COMMON_FILE_H_
#define DOWNPOUR_COMMON_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace downpour {

// The status of a failed system call on `what` ("cannot write x: No space
// left on device").
absl::Status ErrnoStatus(int err, absl::string_view what);

// Writes `path.tmp`, then on Commit flushes it, fsyncs it, renames it to
// `path` and fsyncs the directory: a reader finds the whole file or none. An
// AtomicFile destroyed without a successful Commit removes its temporary
// file. It counts the bytes written and their CRC32C, so a manifest can
// record both without reading the file back; bytes are checksummed a chunk
// at a time just before they are copied or written, so a large file is read
// from memory once.
class AtomicFile {
 public:
  enum class Caching {
    // Through the page cache.
    kPageCache,
    // Around it (O_DIRECT) through an aligned buffer of a few MiB, where the
    // filesystem allows (else through it): a large file written while other
    // work runs (a checkpoint beside training) fills neither the page cache
    // nor the CPU caches with its bytes.
    kBypass,
  };

  // `kind` names the file in errors ("checkpoint file", "record file").
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path,
                                                            absl::string_view kind,
                                                            Caching caching = Caching::kPageCache);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // REQUIRES: Commit has not been called.
  absl::Status Append(absl::string_view data);
  absl::Status Commit();

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc32c() const { return crc_; }
  // Whether the bytes bypass the page cache (Caching::kBypass, allowed).
  bool bypasses_cache() const { return direct_; }

 private:
  struct FreeDeleter {
    void operator()(char* p) const;
  };

  AtomicFile(std::string path, std::string kind, int fd,
             std::unique_ptr<char, FreeDeleter> aligned);
  absl::Status Flush();
  absl::Status WriteAll(const char* data, size_t n);
  // Caching::kBypass: appends through the aligned buffer.
  absl::Status AppendAligned(absl::string_view data);
  // Writes through the page cache from now on: the filesystem refused
  // O_DIRECT, or the file's unaligned tail is left.
  absl::Status StopBypassing();

  const std::string path_;
  const std::string tmp_path_;
  const std::string kind_;
  int fd_;
  bool committed_ = false;
  std::string buffer_;
  // Caching::kBypass: the aligned buffer every byte goes through, the bytes
  // in it, and whether the descriptor still bypasses the cache (O_DIRECT).
  std::unique_ptr<char, FreeDeleter> aligned_;
  size_t aligned_used_ = 0;
  bool direct_ = false;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// The whole file at `path`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `contents` as the whole of `path` through an AtomicFile (a
// temporary file, fsynced, renamed); `what` names it in errors.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 absl::string_view what);

// Creates `path` and its missing parents (mkdir -p).
absl::Status MakeDirs(const std::string& path);

// Removes `path` and everything under it; OK when it does not exist.
absl::Status RemoveAll(const std::string& path);

// The names in directory `path` (not "." or ".."), sorted; NotFound when it
// does not exist.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);

// Makes a completed rename in `path`'s directory durable.
absl::Status SyncParentDirectory(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_FILE_H_
