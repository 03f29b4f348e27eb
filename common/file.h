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
// record both without reading the file back.
class AtomicFile {
 public:
  // `kind` names the file in errors ("checkpoint file", "record file").
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path,
                                                            absl::string_view kind);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // REQUIRES: Commit has not been called.
  absl::Status Append(absl::string_view data);
  absl::Status Commit();

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc32c() const { return crc_; }

 private:
  AtomicFile(std::string path, std::string kind, int fd);
  absl::Status Flush();

  const std::string path_;
  const std::string tmp_path_;
  const std::string kind_;
  int fd_;
  bool committed_ = false;
  std::string buffer_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// The whole file at `path`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

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
