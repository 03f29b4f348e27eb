#include "control/export.h"

#include <cstdlib>
#include <random>

#include "common/file.h"
#include "control/checkpoints.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "spec/job_validation.h"
#include "spec/model_shape.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;

// A small CNN with batch norm and a dense layer after a flatten of an image:
// every conversion export and import make.
JobSpec CnnSpec() {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"(
    name: "cnn"
    model {
      input_shape: [6, 5, 2]
      num_classes: 4
      layer { name: "conv1" conv2d { filters: 3 kernel_size: [3, 2] padding: SAME } }
      layer { name: "bn1" batch_norm {} }
      layer { name: "relu1" relu {} }
      layer { name: "flat" flatten {} }
      layer { name: "fc" dense { units: 4 } }
      layer { name: "loss" softmax_cross_entropy {} }
    }
    dataset { train_files: "x" test_files: "x" batch_size: 1 }
    optimizer { kind: ADAM learning_rate: 0.1 }
    num_workers: 1
    num_shards: 2
    steps: 1
    partition_bytes: 1024
  )",
                                                            &spec));
  ApplyJobDefaults(&spec);
  return spec;
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/export_test";
    ASSERT_TRUE(RemoveAll(root_).ok());
    ASSERT_TRUE(MakeDirs(root_).ok());
  }

  // Job `job_id`'s checkpoint at step 0 from `weights`, then its export.
  std::string RoundTrip(const std::string& job_id, const std::string& weights,
                        ExportLayout layout) {
    auto file = SafetensorsFile::Parse(weights, "weights");
    EXPECT_TRUE(file.ok()) << file.status();
    auto info = WriteInitialCheckpoint(root_, job_id, CnnSpec(), *file, 1);
    EXPECT_TRUE(info.ok()) << info.status();
    std::vector<std::string> refused;
    auto checkpoint = CompleteCheckpoint(root_, {*info}, 0, &refused);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
    auto exported = ExportCheckpoint(root_, job_id, CnnSpec(), *checkpoint, layout);
    EXPECT_TRUE(exported.ok()) << exported.status();
    return *exported;
  }

  std::string root_;
};

TEST_F(ExportTest, PyTorchLayoutIsTheInverseOfImportAndNamesTensorsAsPyTorch) {
  const ModelShape shape = InferModel(CnnSpec().model()).value();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  for (const auto* list : {&shape.params, &shape.local_state}) {
    for (const ParamInfo& p : *list) {
      values.emplace_back(p.num_elements);
      for (float& v : values.back()) v = uniform(rng) + (list == &shape.local_state ? 2.f : 0.f);
    }
  }
  size_t at = 0;
  for (const auto* list : {&shape.params, &shape.local_state}) {
    for (const ParamInfo& p : *list) {
      tensors.push_back({p.name, TensorDtype::kF32, p.shape, values[at++].data()});
    }
  }
  const std::string native = SerializeSafetensors(tensors, {}).value();

  const std::string torch = RoundTrip("a", native, ExportLayout::kPyTorch);
  auto torch_file = SafetensorsFile::Parse(torch, "torch").value();
  EXPECT_EQ(torch_file.Get("conv1.weight")->shape, (std::vector<int64_t>{3, 2, 3, 2}));
  EXPECT_EQ(torch_file.Get("fc.weight")->shape, (std::vector<int64_t>{4, 6 * 5 * 3}));
  EXPECT_EQ(torch_file.Get("bn1.weight")->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(torch_file.Get("bn1.num_batches_tracked")->dtype, TensorDtype::kI64);
  // conv: ours [out, kh, kw, in] element (o=2, y=1, x=0, i=1) is PyTorch's
  // [out, in, kh, kw] (2, 1, 1, 0).
  const float* ours_conv = values[0].data();
  const float* torch_conv = *torch_file.Floats("conv1.weight", 36);
  EXPECT_EQ(torch_conv[((2 * 2 + 1) * 3 + 1) * 2 + 0], ours_conv[((2 * 3 + 1) * 2 + 0) * 2 + 1]);
  // fc: our input (h=4, w=3, c=2) of output 1 is PyTorch's input (c=2, h=4,
  // w=3): NHWC -> NCHW.
  const float* ours_fc = values[4].data();  // conv w, conv b, gamma, beta, fc w.
  const float* torch_fc = *torch_file.Floats("fc.weight", 4 * 90);
  EXPECT_EQ(torch_fc[1 * 90 + (2 * 6 + 4) * 5 + 3], ours_fc[((4 * 5 + 3) * 3 + 2) * 4 + 1]);

  // The PyTorch file read back as a new job's weights gives ours exactly.
  const std::string back = RoundTrip("b", torch, ExportLayout::kNative);
  auto back_file = SafetensorsFile::Parse(back, "back").value();
  at = 0;
  for (const auto* list : {&shape.params, &shape.local_state}) {
    for (const ParamInfo& p : *list) {
      const float* got = *back_file.Floats(p.name, p.num_elements);
      EXPECT_EQ(std::vector<float>(got, got + p.num_elements), values[at++]) << p.name;
    }
  }
}

TEST_F(ExportTest, WeightsOfAnotherShapeAreRefusedNamingTheTensor) {
  const std::vector<float> small(3 * 3 * 2 * 2);
  const std::string weights =
      SerializeSafetensors({{"conv1.weight", TensorDtype::kF32, {3, 2, 3, 2}, small.data()}}, {})
          .value();
  auto file = SafetensorsFile::Parse(weights, "w").value();
  EXPECT_THAT(WriteInitialCheckpoint(root_, "c", CnnSpec(), file, 1).status().message(),
              HasSubstr("the initial weights have no conv1.bias (or conv1/bias)"));
  const std::vector<float> wrong(2 * 2 * 2 * 2);
  const std::string mismatched =
      SerializeSafetensors({{"conv1.weight", TensorDtype::kF32, {2, 2, 2, 2}, wrong.data()}}, {})
          .value();
  auto bad = SafetensorsFile::Parse(mismatched, "w").value();
  EXPECT_THAT(WriteInitialCheckpoint(root_, "c", CnnSpec(), bad, 1).status().message(),
              HasSubstr("conv1.weight is F32 [2, 2, 2, 2]; the model's is F32 [3, 2, 3, 2]"));
}

}  // namespace
}  // namespace control
}  // namespace downpour
