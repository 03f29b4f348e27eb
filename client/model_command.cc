// downpourctl model import: an ONNX file as a job spec's model and the
// weights it starts from, written beside each other for a user to read,
// edit and submit (spec/onnx_import.h says what maps and what is refused).
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "common/file.h"
#include "common/status.h"
#include "google/protobuf/text_format.h"
#include "onnx/onnx.pb.h"
#include "spec/onnx_import.h"

namespace downpour {
namespace {

// "model.pbtxt" -> "model.safetensors".
std::string WeightsPathBeside(const std::string& spec) {
  std::string base = spec;
  if (absl::EndsWith(base, ".pbtxt")) base.resize(base.size() - strlen(".pbtxt"));
  return base + ".safetensors";
}

// The model with every initializer kept in a file beside it (ONNX's
// external data, which torch.onnx.export writes by default) read into the
// model, so the coordinator gets one self-contained file. A location must
// name a file in the model's own folder.
absl::StatusOr<std::string> InlineExternalData(std::string bytes, const std::string& path) {
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes)) return bytes;  // The importer says what is wrong.
  const std::string dir =
      path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  std::map<std::string, std::string> files;
  bool inlined = false;
  for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
    if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
    std::string location;
    int64_t offset = 0, length = -1;
    for (const onnx::StringStringEntryProto& e : t.external_data()) {
      if (e.key() == "location") location = e.value();
      if ((e.key() == "offset" && !absl::SimpleAtoi(e.value(), &offset)) ||
          (e.key() == "length" && !absl::SimpleAtoi(e.value(), &length))) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": initializer \"", t.name(),
                                                       "\": external data ", e.key(), " \"",
                                                       e.value(), "\" is not a number"));
      }
    }
    if (location.empty() || location[0] == '/' || absl::StrContains(location, "..")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": initializer \"", t.name(),
                                                     "\": external data location \"", location,
                                                     "\" is not a file in the model's folder"));
    }
    if (files.count(location) == 0) {
      const std::string file = absl::StrCat(dir, "/", location);
      absl::StatusOr<std::string> data = ReadFileToString(file);
      if (!data.ok()) {
        return absl::NotFoundError(absl::StrCat(path, ": initializer \"", t.name(),
                                                "\" keeps its data in ", file, ": ",
                                                data.status().message()));
      }
      files[location] = *std::move(data);
    }
    const std::string& data = files[location];
    const int64_t size = static_cast<int64_t>(data.size());
    if (offset < 0 || offset > size || length > size - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": initializer \"", t.name(), "\": offset ", offset, ", length ",
                       length, " of ", location, " are outside its ", size, " bytes"));
    }
    if (length < 0) length = size - offset;
    t.set_raw_data(data.substr(offset, length));
    t.clear_external_data();
    t.clear_data_location();
    inlined = true;
  }
  if (!inlined) return bytes;
  std::string out;
  if (!model.SerializeToString(&out) || out.size() > kMaxOnnxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": with its external data inlined the model is more than an ONNX file holds"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadModelFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() > kMaxOnnxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", bytes->size(), " bytes is more than an ONNX file holds"));
  }
  return InlineExternalData(*std::move(bytes), path);
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
  const std::string header =
      absl::StrCat("# The model of ", path, " (downpourctl model import). Add the training part\n",
                   "# (dataset, optimizer, steps, ...: docs/job-specs.md) and submit it with\n",
                   "#   downpourctl submit SPEC --init_from=", weights, "\n",
                   "# or leave this out and run downpourctl submit --model=", path, " JOB.pbtxt\n");
  for (const auto& [file, contents, what] :
       {std::tuple<std::string, std::string, std::string>{options.out, header + text, "spec"},
        {weights, imported->weights, "weights"}}) {
    absl::Status written = WriteFileAtomically(file, contents, what);
    if (!written.ok()) return FailStatus(written);
  }
  std::cout << "wrote " << options.out << " (" << imported->model.layer_size() << " layers) and "
            << weights << " (" << imported->weights.size() / 1048576.0
            << " MiB, PyTorch layout) from " << path << std::endl;
  return kExitOk;
}

}  // namespace downpour
