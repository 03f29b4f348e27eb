#include "model/model_testing.h"

#include <random>
#include <utility>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace downpour {

ModelSpec ParseModelSpec(const std::string& text) {
  ModelSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

std::unique_ptr<Model> MakeModel(const std::string& text, uint64_t seed) {
  auto model = Model::Create(ParseModelSpec(text), seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

ModelSpec WithPipeline(const std::string& base, const std::vector<std::vector<std::string>>& stages,
                       int micro, PipelineSpec::Schedule schedule) {
  ModelSpec spec = ParseModelSpec(base);
  for (const auto& layers : stages) {
    PipelineSpec::Stage* stage = spec.mutable_pipeline()->add_stage();
    for (const std::string& name : layers) stage->add_layers(name);
  }
  spec.mutable_pipeline()->set_micro_batches(micro);
  spec.mutable_pipeline()->set_schedule(schedule);
  return spec;
}

ModelSpec OneStage(const std::string& base, int micro) {
  const ModelSpec spec = ParseModelSpec(base);
  std::vector<std::string> names;
  for (const LayerSpec& layer : spec.layer()) names.push_back(layer.name());
  return WithPipeline(base, {names}, micro);
}

TestBatch RandomBatch(const ModelShape& shape, int64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  TestBatch b;
  b.size = size;
  for (int64_t i = 0; i < size * shape.input_size; ++i) b.features.push_back(normal(rng));
  for (int64_t i = 0; i < size; ++i) {
    b.labels.push_back(static_cast<int32_t>(rng() % shape.num_classes));
  }
  return b;
}

}  // namespace downpour
