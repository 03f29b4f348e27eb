// downpourctl dataset import: IDX files (MNIST, Fashion-MNIST) into record
// shards, offline.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "data/idx.h"

namespace downpour {

namespace {

constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Imports one image/label pair; prints what was written.
int ImportOne(const data::IdxImportOptions& import) {
  absl::StatusOr<int64_t> written = data::ImportIdx(import);
  if (!written.ok()) return FailStatus(written.status());
  const std::string first = data::ShardFileName(import.name, 0, import.num_shards);
  const std::string last =
      data::ShardFileName(import.name, import.num_shards - 1, import.num_shards);
  std::cout << absl::StrFormat("%s: wrote %d examples to %s/%s%s", import.name, *written,
                               import.out_dir, first,
                               import.num_shards > 1 ? absl::StrCat(" .. ", last) : "")
            << std::endl;
  return kExitOk;
}

}  // namespace

int RunDataset(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0] != "import") {
    return UsageError(
        "dataset takes one subcommand, import: downpourctl dataset import "
        "--out_dir=DIR ...");
  }
  const std::string out_dir = options.out_dir;
  const int shards = options.shards;
  const int64_t limit = options.limit;
  if (out_dir.empty()) {
    return UsageError("dataset import needs --out_dir=DIR");
  }
  if (shards < 1) {
    return UsageError(absl::StrCat("--shards=", shards, " must be at least 1"));
  }
  if (limit < 0) {
    return UsageError(absl::StrCat("--limit=", limit, " must not be negative"));
  }
  data::IdxImportOptions import;
  import.out_dir = out_dir;
  import.num_shards = shards;
  import.limit = limit;

  const std::string images = options.images;
  const std::string labels = options.labels;
  std::string fashion_dir = options.fashion_mnist;
  if (!fashion_dir.empty() || (images.empty() && labels.empty())) {
    if (!images.empty() || !labels.empty()) {
      return UsageError("--fashion_mnist imports its own files; drop --images and --labels");
    }
    if (fashion_dir.empty()) fashion_dir = kDefaultFashionMnistDir;
    struct Part {
      const char* name;
      const char* prefix;
    };
    for (const Part& part : {Part{"train", "train"}, Part{"test", "t10k"}}) {
      import.name = part.name;
      import.images_path = absl::StrCat(fashion_dir, "/", part.prefix, "-images-idx3-ubyte.gz");
      import.labels_path = absl::StrCat(fashion_dir, "/", part.prefix, "-labels-idx1-ubyte.gz");
      const int code = ImportOne(import);
      if (code != kExitOk) return code;
    }
    return kExitOk;
  }

  const std::string format = options.format;
  if (format != "idx") {
    return UsageError(
        absl::StrCat("--format=", format, " is not supported; the only format is idx"));
  }
  if (images.empty() || labels.empty()) {
    return UsageError("dataset import needs both --images=PATH and --labels=PATH");
  }
  import.name = options.name;
  if (import.name.empty()) {
    return UsageError("dataset import needs --name=NAME");
  }
  import.images_path = images;
  import.labels_path = labels;
  return ImportOne(import);
}

}  // namespace downpour
