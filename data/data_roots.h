// DataRoots: where a worker may read record files. A job names its files
// relative to the worker's --data_dir (spec validation refuses absolute
// names and ".." at submit, spec/limits.h); the worker follows each file's
// symlinks to its real path (realpath(3)) and reads it only when that lies
// inside data_dir or one of the extra roots the operator lists
// (--data_roots: directories that symlinks under data_dir may point into,
// e.g. a dataset kept on another volume). So neither a job spec nor what a
// coordinator hands out can make a worker open any other file on its host.
//
// The check is made when a file is listed or opened; the operator owns the
// directories, so a link changed in between is the operator's own doing.
//
// Thread-safety: immutable after Create; Check may be called from any thread.
#ifndef DOWNPOUR_DATA_DATA_ROOTS_H_
#define DOWNPOUR_DATA_DATA_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace downpour {
namespace data {

class DataRoots {
 public:
  // `data_dir` is the worker's --data_dir (empty: the current directory);
  // `extra` the --data_roots, each an absolute path of a directory.
  // InvalidArgument naming an entry that is relative, NotFound naming one
  // that does not exist or is not a directory.
  static absl::StatusOr<DataRoots> Create(const std::string& data_dir,
                                          const std::vector<std::string>& extra = {});

  // OK when `name` (as a job names a record file: relative to data_dir, or
  // absolute) resolves, symlinks followed, to a path inside one of the
  // roots. PermissionDenied naming the file, where it leads and the roots
  // otherwise; NotFound naming it when it does not exist.
  absl::Status Check(const std::string& name) const;

  // "--data_dir=DIR" or "--data_dir=DIR, --data_roots=A,B" for messages.
  std::string Describe() const;

 private:
  DataRoots() = default;

  std::string data_dir_;                 // As given ("" for ".").
  std::vector<std::string> extra_;       // As given.
  std::vector<std::string> real_roots_;  // data_dir's real path, then extra's.
};

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_DATA_ROOTS_H_
