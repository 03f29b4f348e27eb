// downpourctl model import: an ONNX file as a job spec's model and the
// weights it starts from, written beside each other for a user to read,
// edit and submit (spec/onnx_import.h says what maps and what is refused).
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "common/file.h"
#include "common/status.h"
#include "google/protobuf/text_format.h"
#include "spec/onnx_import.h"

namespace downpour {
namespace {

// "model.pbtxt" -> "model.safetensors".
std::string WeightsPathBeside(const std::string& spec) {
  std::string base = spec;
  if (absl::EndsWith(base, ".pbtxt")) base.resize(base.size() - strlen(".pbtxt"));
  return base + ".safetensors";
}

absl::Status WriteFile(const std::string& path, const std::string& contents,
                       const std::string& what) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path, what));
  RETURN_IF_ERROR(file->Append(contents));
  return file->Commit();
}

}  // namespace

absl::StatusOr<std::string> ReadModelFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() > kMaxOnnxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", bytes->size(), " bytes is more than an ONNX file holds"));
  }
  return bytes;
}

int RunModel(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 2 || args[0] != "import") {
    return UsageError(
        "model takes one subcommand: downpourctl model import MODEL.onnx [--out=SPEC.pbtxt]");
  }
  const std::string& path = args[1];
  absl::StatusOr<std::string> bytes = ReadModelFile(path);
  if (!bytes.ok()) return Fail(kExitUsage, bytes.status().message());
  absl::StatusOr<ImportedModel> imported = ImportOnnx(*bytes, path);
  if (!imported.ok()) return Fail(kExitUsage, imported.status().message());
  for (const std::string& note : imported->notes) std::cerr << "note: " << note << std::endl;
  JobSpec spec;
  *spec.mutable_model() = imported->model;
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  if (options.out.empty()) {
    std::cout << text;
    std::cerr << "the weights are written only with --out=SPEC.pbtxt (beside it, as "
                 "SPEC.safetensors)"
              << std::endl;
    return kExitOk;
  }
  const std::string weights = WeightsPathBeside(options.out);
  const std::string header = absl::StrCat(
      "# The model of ", path, " (downpourctl model import). Add the training part\n",
      "# (dataset, optimizer, steps, ...: docs/job-specs.md) and submit it with\n",
      "#   downpourctl submit SPEC --init_from=", weights, "\n",
      "# or leave this out and run downpourctl submit --model=", path, " JOB.pbtxt\n");
  for (const auto& [file, contents, what] :
       {std::tuple<std::string, std::string, std::string>{options.out, header + text, "spec"},
        {weights, imported->weights, "weights"}}) {
    absl::Status written = WriteFile(file, contents, what);
    if (!written.ok()) return FailStatus(written);
  }
  std::cout << "wrote " << options.out << " (" << imported->model.layer_size()
            << " layers) and " << weights << " (" << imported->weights.size() / 1048576.0
            << " MiB, PyTorch layout) from " << path << std::endl;
  return kExitOk;
}

}  // namespace downpour
