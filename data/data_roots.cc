#include "data/data_roots.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace downpour {
namespace data {
namespace {

// realpath(3) of `path`, or errno's message.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    const int error = errno;
    const std::string why = std::strerror(error);
    if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(why);
    return absl::PermissionDeniedError(why);
  }
  return std::string(resolved);
}

bool Inside(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || absl::StartsWith(path, absl::StrCat(root, "/"));
}

}  // namespace

absl::StatusOr<DataRoots> DataRoots::Create(const std::string& data_dir,
                                            const std::vector<std::string>& extra) {
  DataRoots roots;
  roots.data_dir_ = data_dir;
  roots.extra_ = extra;
  const std::string dir = data_dir.empty() ? "." : data_dir;
  absl::StatusOr<std::string> real = RealPath(dir);
  if (!real.ok()) {
    return absl::NotFoundError(absl::StrCat("--data_dir ", dir, ": ", real.status().message()));
  }
  roots.real_roots_.push_back(*std::move(real));
  for (const std::string& root : extra) {
    if (root.empty() || root.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_roots entry '", root, "' is not an absolute path"));
    }
    real = RealPath(root);
    struct stat st;
    if (!real.ok() || stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(
          absl::StrCat("--data_roots entry ", root, " is not a directory",
                       real.ok() ? "" : absl::StrCat(" (", real.status().message(), ")")));
    }
    roots.real_roots_.push_back(*std::move(real));
  }
  return roots;
}

absl::Status DataRoots::Check(const std::string& name) const {
  const std::string path =
      name.empty() || name.front() == '/' || data_dir_.empty()
          ? name
          : absl::StrCat(data_dir_, absl::EndsWith(data_dir_, "/") ? "" : "/", name);
  absl::StatusOr<std::string> real = RealPath(path);
  if (!real.ok()) {
    return absl::Status(real.status().code(), absl::StrCat("record file ", name, " (", Describe(),
                                                           "): ", real.status().message()));
  }
  for (const std::string& root : real_roots_) {
    if (Inside(*real, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "record file ", name, " leads to ", *real, ", outside the worker's data directories (",
      Describe(), "); list a directory in --data_roots to allow it"));
}

std::string DataRoots::Describe() const {
  std::string out = absl::StrCat("--data_dir=", data_dir_.empty() ? "." : data_dir_);
  if (!extra_.empty()) absl::StrAppend(&out, ", --data_roots=", absl::StrJoin(extra_, ","));
  return out;
}

}  // namespace data
}  // namespace downpour
