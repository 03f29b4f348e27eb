#include "spec/limits.h"

#include <fnmatch.h>

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace downpour {
namespace {

// "131072 bytes (128 KiB)" for round binary sizes, "4000 bytes" otherwise.
std::string Bytes(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return absl::StrCat(n, " bytes (", n >> 20, " MiB)");
  if (n >= (1u << 10) && n % (1u << 10) == 0) return absl::StrCat(n, " bytes (", n >> 10, " KiB)");
  return absl::StrCat(n, " bytes");
}

}  // namespace

absl::Status CheckSize(absl::string_view field, size_t size, size_t limit) {
  if (size <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", size, " bytes; the limit is ", Bytes(limit)));
}

absl::Status CheckBytes(absl::string_view field, absl::string_view value, size_t limit) {
  return CheckSize(field, value.size(), limit);
}

absl::Status CheckCount(absl::string_view field, int64_t count, int64_t limit) {
  if (count <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", count, " entries; the limit is ", limit));
}

absl::Status CheckNodeId(absl::string_view field, absl::string_view id) {
  if (absl::Status size = CheckBytes(field, id, kMaxNodeIdBytes); !size.ok()) return size;
  for (char c : id) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", absl::CHexEscape(id), "\" holds a control character"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDataPath(absl::string_view field, absl::string_view path) {
  if (absl::Status size = CheckBytes(field, path, kMaxPathBytes); !size.ok()) return size;
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, " holds a NUL byte"));
  }
  if (!path.empty() && path.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " \"", path,
        "\" is an absolute path; record files are named relative to each worker's --data_dir"));
  }
  for (absl::string_view component : absl::StrSplit(path, '/')) {
    // As glob(3) would match it against a directory entry: a leading '.'
    // must be matched by a '.' of the pattern (FNM_PERIOD), so "*" never
    // matches "..", but ".*" and ".?" do.
    const std::string pattern(component);
    if (fnmatch(pattern.c_str(), "..", FNM_PERIOD) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", path, "\" has the component \"", component,
                       "\", which can name the parent directory; record files must stay inside "
                       "each worker's --data_dir"));
    }
  }
  return absl::OkStatus();
}

std::string TruncateText(absl::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string(text);
  // The marker's length depends on the count it names; 40 bytes holds any.
  size_t keep = limit > 40 ? limit - 40 : 0;
  // Back to the first byte of a character: UTF-8 continuation bytes are
  // 10xxxxxx, and protobuf refuses a string cut inside a character.
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), " [... ", text.size() - keep, " bytes cut]");
}

}  // namespace downpour
