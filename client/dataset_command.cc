// downpourctl dataset import: IDX files (MNIST, Fashion-MNIST) into record
// shards; dataset generate: a synthetic click log (data/ctr_generator.h).
// Both offline.
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
#include "data/ctr_generator.h"
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

// dataset generate --kind=ctr: writes the shards and NAME.json, prints one
// line of what was written and its Bayes figures.
int RunGenerate(const CtlOptions& options) {
  if (options.kind != "ctr") {
    return UsageError(
        options.kind.empty()
            ? "dataset generate needs --kind=ctr (the only kind)"
            : absl::StrCat("--kind=", options.kind, " is not supported; the only kind is ctr"));
  }
  for (const auto& [flag, set] : {std::pair<const char*, bool>{"--images", !options.images.empty()},
                                  {"--labels", !options.labels.empty()},
                                  {"--fashion_mnist", !options.fashion_mnist.empty()},
                                  {"--limit", options.limit != 0},
                                  {"--format", options.format != "idx"}}) {
    if (set) {
      return UsageError(
          absl::StrCat(flag, " is for dataset import; generate sizes with --examples"));
    }
  }
  if (options.out_dir.empty()) return UsageError("dataset generate needs --out_dir=DIR");
  if (options.name.empty()) return UsageError("dataset generate needs --name=NAME");
  data::CtrDatasetOptions dataset;
  dataset.out_dir = options.out_dir;
  dataset.name = options.name;
  dataset.train_examples = options.examples;
  dataset.test_examples = options.test_examples;
  dataset.num_shards = options.shards;
  data::CtrOptions& generator = dataset.generator;
  generator.seed = options.seed;
  generator.zipf = options.zipf;
  generator.sparse_features = options.sparse_features;
  generator.dense_features = options.dense_features;
  generator.max_ids = options.max_ids;
  generator.click_rate = options.click_rate;
  absl::Status parsed = data::ParseVocabularies(options.vocabulary, &generator);
  if (!parsed.ok()) return UsageError(absl::StrCat("--", parsed.message()));

  const absl::Time start = absl::Now();
  absl::StatusOr<data::CtrDatasetSummary> summary = data::WriteCtrDataset(dataset);
  if (!summary.ok()) {
    // Bad flags are the generator's InvalidArgument ("zipf=0 must be ..."),
    // named here as the flags they came from.
    if (absl::IsInvalidArgument(summary.status())) {
      return UsageError(absl::StrCat("--", summary.status().message()));
    }
    return Fail(kExitFailed, summary.status().message());
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const int64_t total = summary->train.examples + summary->test.examples;
  const auto rate = [](const data::CtrSplitSummary& split) {
    return static_cast<double>(split.clicks) / static_cast<double>(split.examples);
  };
  const data::CtrSplitSummary& test = summary->test;
  const std::string figures =
      test.examples == 0
          ? absl::StrFormat("click rate %.4f (no test examples)", rate(summary->train))
          : absl::StrFormat("click rate %.4f (test %.4f), test Bayes AUC %.4f, Bayes log loss %.4f",
                            rate(summary->train), rate(test), test.bayes_auc, test.bayes_log_loss);
  std::cout << absl::StrFormat(
                   "%s: wrote %d train and %d test examples to %s/%s and %s, summary %s; %s; "
                   "%.1f s, %.0f examples/s",
                   options.name, summary->train.examples, test.examples, options.out_dir,
                   summary->train_pattern, summary->test_pattern, summary->summary_path, figures,
                   seconds, seconds > 0 ? total / seconds : 0.0)
            << std::endl;
  return kExitOk;
}

}  // namespace

int RunDataset(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() == 1 && args[0] == "generate") return RunGenerate(options);
  if (args.size() != 1 || args[0] != "import") {
    return UsageError(
        "dataset takes one subcommand, import or generate: downpourctl dataset import "
        "--out_dir=DIR ... or downpourctl dataset generate --kind=ctr --out_dir=DIR "
        "--name=NAME ...");
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
