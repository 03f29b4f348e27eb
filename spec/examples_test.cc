// Every job spec in examples/ parses and passes ValidateJobSpec, as
// `downpourctl submit` would check it; those of examples/onnx/ (training
// parts, no model) with the model of a PyTorch-exported ONNX file, as
// `submit --model` would.
#include <dirent.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "spec/job_validation.h"
#include "spec/onnx_import.h"

namespace downpour {
namespace {

std::string Workspace() {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The .pbtxt files of `dir`, parsed.
std::vector<std::pair<std::string, JobSpec>> Specs(const std::string& dir) {
  std::vector<std::pair<std::string, JobSpec>> specs;
  DIR* listing = opendir(dir.c_str());
  EXPECT_NE(listing, nullptr) << dir;
  if (listing == nullptr) return specs;
  while (dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.size() <= 6 || name.substr(name.size() - 6) != ".pbtxt") continue;
    JobSpec spec;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(ReadFile(dir + "/" + name), &spec))
        << name;
    specs.emplace_back(name, std::move(spec));
  }
  closedir(listing);
  return specs;
}

TEST(ExamplesTest, EveryExampleSpecValidates) {
  std::vector<std::pair<std::string, JobSpec>> specs = Specs(Workspace() + "/examples");
  EXPECT_GE(specs.size(), 8u);
  for (auto& [name, spec] : specs) {
    ApplyJobDefaults(&spec);
    const auto params = ValidateJobSpec(spec);
    EXPECT_TRUE(params.ok()) << name << ": " << params.status();
  }
}

TEST(ExamplesTest, EveryTrainingPartValidatesWithAnImportedModel) {
  const std::string onnx = ReadFile(Workspace() + "/tests/data/onnx/torchscript/small_resnet.onnx");
  absl::StatusOr<ImportedModel> imported = ImportOnnx(onnx, "small_resnet.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  std::vector<std::pair<std::string, JobSpec>> specs = Specs(Workspace() + "/examples/onnx");
  EXPECT_GE(specs.size(), 1u);
  for (auto& [name, spec] : specs) {
    EXPECT_FALSE(spec.has_model()) << name << " is a training part: no model";
    *spec.mutable_model() = imported->model;
    ApplyJobDefaults(&spec);
    const auto params = ValidateJobSpec(spec);
    EXPECT_TRUE(params.ok()) << name << ": " << params.status();
  }
}

}  // namespace
}  // namespace downpour
