// Pipeline stages on the CPU ("devices" -1, -1, ...): the split model's
// gradients, loss and evaluation equal the unsplit model's run in the same
// micro-batches; the schedules; the stages' shapes; the trainer's
// callbacks; memory limits; the pipeline spec's errors.
#include "model/pipeline.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "model/pipeline_schedule.h"
#include "model/pipeline_stages.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// An MLP with dropout and batch norm, in three stages.
constexpr char kMlp[] = R"pb(
  input_shape: 12
  num_classes: 5
  layer {
    name: "fc1"
    dense { units: 16 }
  }
  layer {
    name: "bn1"
    batch_norm {}
  }
  layer {
    name: "relu1"
    relu {}
  }
  layer {
    name: "fc2"
    dense { units: 16 }
  }
  layer {
    name: "drop"
    dropout { rate: 0.25 }
  }
  layer {
    name: "relu2"
    relu {}
  }
  layer {
    name: "fc3"
    dense { units: 12 }
  }
  layer {
    name: "relu3"
    relu {}
  }
  layer {
    name: "logits"
    dense { units: 5 }
  }
  layer {
    name: "loss"
    softmax_cross_entropy {}
  }
)pb";

// Skip connections across stages: "a" (stage 0) is read by stages 1 and 2,
// and "b" (stage 1) by a layer of stage 1 and one of stage 2.
constexpr char kResidual[] = R"pb(
  input_shape: 10
  num_classes: 3
  layer {
    name: "a"
    dense { units: 8 }
  }
  layer {
    name: "ra"
    relu {}
  }
  layer {
    name: "b"
    dense { units: 8 }
  }
  layer {
    name: "rb"
    relu {}
  }
  layer {
    name: "sum1"
    inputs: [ "ra", "rb" ]
    add {}
  }
  layer {
    name: "c"
    dense { units: 8 }
  }
  layer {
    name: "sum2"
    inputs: [ "c", "ra", "b" ]
    add {}
  }
  layer {
    name: "rc"
    relu {}
  }
  layer {
    name: "logits"
    dense { units: 3 }
  }
  layer {
    name: "loss"
    softmax_cross_entropy {}
  }
)pb";

// Convolutions, pooling and a flatten at the end of the first stage.
constexpr char kCnn[] = R"pb(
  input_shape: [ 6, 6, 2 ]
  num_classes: 4
  layer {
    name: "conv1"
    conv2d { filters: 4 kernel_size: 3 padding: SAME }
  }
  layer {
    name: "relu1"
    relu {}
  }
  layer {
    name: "pool"
    max_pool { window: 2 }
  }
  layer {
    name: "flat"
    flatten {}
  }
  layer {
    name: "fc"
    dense { units: 8 }
  }
  layer {
    name: "relu2"
    relu {}
  }
  layer {
    name: "logits"
    dense { units: 4 }
  }
  layer {
    name: "loss"
    softmax_cross_entropy {}
  }
)pb";

std::unique_ptr<PipelineModel> MakePipeline(const ModelSpec& spec, int stages,
                                            const ModelOptions& options = {}) {
  auto created = PipelineModel::Create(spec, /*seed=*/7, std::vector<int>(stages, -1), options);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(created).value() : nullptr;
}

// max |a - b| / (max |b| + 1e-6) over every gradient.
double GradientDifference(const PipelineModel& a, const PipelineModel& b) {
  double diff = 0, scale = 1e-6;
  for (const ParamInfo& p : b.params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      diff = std::max(diff, std::fabs(double{a.grad(p.id)[i]} - b.grad(p.id)[i]));
      scale = std::max(scale, std::fabs(double{b.grad(p.id)[i]}));
    }
  }
  return diff / scale;
}

TEST(PipelineStagesTest, SplitsLayersParametersAndBoundaries) {
  const ModelSpec spec = WithPipeline(
      kResidual, {{"a", "ra"}, {"b", "rb", "sum1"}, {"c", "sum2", "rc", "logits", "loss"}}, 4);
  auto shape = InferModel(spec);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->pipeline.first_layer, (std::vector<int>{0, 2, 5}));
  auto stages = SplitModel(*shape);
  ASSERT_TRUE(stages.ok()) << stages.status();
  ASSERT_EQ(stages->size(), 3u);
  // Stage 0: a, ra, then its outputs: ra for stage 1 and for stage 2.
  const StageShape& s0 = (*stages)[0];
  ASSERT_EQ(s0.shape.layers.size(), 3u);
  EXPECT_EQ(s0.shape.layers.back().kind, LayerKind::kStageOutput);
  EXPECT_EQ(s0.shape.layers.back().inputs, (std::vector<int>{1, 1}));
  ASSERT_EQ(s0.outputs.size(), 2u);
  EXPECT_EQ(s0.outputs[0].stage, 1);
  EXPECT_EQ(s0.outputs[1].stage, 2);
  EXPECT_EQ(s0.first_param, 0);
  EXPECT_EQ(s0.shape.params.size(), 2u);
  // Stage 1 reads ra; sends b and rb? No: stage 2 reads ra, b and sum1.
  const StageShape& s1 = (*stages)[1];
  ASSERT_EQ(s1.shape.input_slots.size(), 1u);
  EXPECT_EQ(s1.shape.input_slots[0].name, "ra");
  EXPECT_EQ(s1.inputs[0].stage, 0);
  EXPECT_EQ(s1.inputs[0].output, 0);
  EXPECT_EQ(s1.first_param, 2);
  EXPECT_EQ(s1.shape.params[0].name, "b/weight");
  EXPECT_EQ(s1.shape.params[0].id, 0);
  EXPECT_EQ(s1.init_params[0].id, 2);
  // sum1 reads the slot (ra) and rb.
  EXPECT_EQ(s1.shape.layers[2].inputs, (std::vector<int>{LayerShape::ModelInputSlot(0), 1}));
  const StageShape& s2 = (*stages)[2];
  std::vector<std::string> slots;
  for (const InputSlot& slot : s2.shape.input_slots) slots.push_back(slot.name);
  EXPECT_EQ(slots, (std::vector<std::string>{"ra", "b", "sum1"}));
  EXPECT_EQ(s2.shape.input_size, 24);
  EXPECT_EQ(s2.shape.layers.back().kind, LayerKind::kSoftmaxCrossEntropy);
  EXPECT_TRUE(s2.outputs.empty());
}

TEST(PipelineScheduleTest, OneForwardOneBackwardAndGpipe) {
  using P = StagePass;
  EXPECT_EQ(StageSchedule(PipelineSpec::ONE_F_ONE_B, 3, 0, 4), (std::vector<P>{{true, 0},
                                                                               {true, 1},
                                                                               {true, 2},
                                                                               {false, 0},
                                                                               {true, 3},
                                                                               {false, 1},
                                                                               {false, 2},
                                                                               {false, 3}}));
  EXPECT_EQ(StageSchedule(PipelineSpec::ONE_F_ONE_B, 3, 2, 2),
            (std::vector<P>{{true, 0}, {false, 0}, {true, 1}, {false, 1}}));
  EXPECT_EQ(StageSchedule(PipelineSpec::GPIPE, 2, 1, 2),
            (std::vector<P>{{true, 0}, {true, 1}, {false, 0}, {false, 1}}));
  EXPECT_EQ(InFlight(PipelineSpec::ONE_F_ONE_B, 4, 0, 16), 4);
  EXPECT_EQ(InFlight(PipelineSpec::ONE_F_ONE_B, 4, 3, 16), 1);
  EXPECT_EQ(InFlight(PipelineSpec::ONE_F_ONE_B, 4, 0, 2), 2);
  EXPECT_EQ(InFlight(PipelineSpec::GPIPE, 4, 3, 16), 16);
  // A micro-batch's set is free again: its last user's backward came first.
  for (int stages = 1; stages <= 4; ++stages) {
    for (int s = 0; s < stages; ++s) {
      for (int m = 1; m <= 9; ++m) {
        const int sets = InFlight(PipelineSpec::ONE_F_ONE_B, stages, s, m);
        std::set<int> held;
        for (const P& pass : StageSchedule(PipelineSpec::ONE_F_ONE_B, stages, s, m)) {
          const int set = pass.micro_batch % sets;
          if (pass.forward) {
            EXPECT_TRUE(held.insert(set).second) << stages << " " << s << " " << m;
          } else {
            held.erase(set);
          }
        }
      }
    }
  }
}

struct SplitCase {
  const char* base;
  std::vector<std::vector<std::string>> stages;
  int micro;
  PipelineSpec::Schedule schedule;
  int64_t batch;
};

class SplitGradientsTest : public ::testing::TestWithParam<SplitCase> {};

// The split model and the unsplit one, run in the same micro-batches, agree
// on everything a step yields, over several steps of SGD.
TEST_P(SplitGradientsTest, EqualTheUnsplitModelsInTheSameMicroBatches) {
  const SplitCase& c = GetParam();
  auto whole = MakePipeline(OneStage(c.base, c.micro), 1);
  auto split = MakePipeline(WithPipeline(c.base, c.stages, c.micro, c.schedule),
                            static_cast<int>(c.stages.size()));
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(split, nullptr);
  ASSERT_EQ(split->params().size(), whole->params().size());
  for (const ParamInfo& p : whole->params()) {
    EXPECT_EQ(split->params()[p.id].name, p.name);
    for (int64_t i = 0; i < p.num_elements; ++i) {
      ASSERT_EQ(split->param(p.id)[i], whole->param(p.id)[i]) << p.name;
    }
  }
  for (int step = 0; step < 3; ++step) {
    const TestBatch b = RandomBatch(whole->shape(), c.batch, 100 + step);
    auto w = whole->TrainStep(b.features.data(), b.labels.data(), b.size, step);
    auto s = split->TrainStep(b.features.data(), b.labels.data(), b.size, step);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_NEAR(s->loss, w->loss, 1e-6 * std::max(1.0, std::fabs(w->loss)));
    EXPECT_EQ(s->correct, w->correct);
    EXPECT_LT(GradientDifference(*split, *whole), 1e-5) << "step " << step;
    for (const ParamInfo& p : whole->local_state()) {
      for (int64_t i = 0; i < p.num_elements; ++i) {
        EXPECT_NEAR(split->local_state_data(p.id)[i], whole->local_state_data(p.id)[i], 1e-5)
            << p.name;
      }
    }
    // SGD on the host copies, as the shards would.
    for (PipelineModel* model : {whole.get(), split.get()}) {
      for (const ParamInfo& p : model->params()) {
        for (int64_t i = 0; i < p.num_elements; ++i) {
          model->param(p.id)[i] -= 0.1f * model->grad(p.id)[i];
        }
      }
    }
  }
  const TestBatch test = RandomBatch(whole->shape(), 13, 9);
  std::vector<float> wl, sl;
  auto we = whole->Evaluate(test.features.data(), test.labels.data(), test.size, &wl);
  auto se = split->Evaluate(test.features.data(), test.labels.data(), test.size, &sl);
  ASSERT_TRUE(we.ok()) << we.status();
  ASSERT_TRUE(se.ok()) << se.status();
  EXPECT_NEAR(se->loss_sum, we->loss_sum, 1e-5 * std::max(1.0, we->loss_sum));
  EXPECT_EQ(se->correct, we->correct);
  ASSERT_EQ(sl.size(), wl.size());
  for (size_t i = 0; i < wl.size(); ++i) EXPECT_NEAR(sl[i], wl[i], 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Models, SplitGradientsTest,
    ::testing::Values(
        SplitCase{
            kMlp,
            {{"fc1", "bn1", "relu1"}, {"fc2", "drop", "relu2", "fc3", "relu3", "logits", "loss"}},
            4,
            PipelineSpec::ONE_F_ONE_B,
            16},
        SplitCase{
            kMlp,
            {{"fc1", "bn1"}, {"relu1", "fc2", "drop"}, {"relu2", "fc3", "relu3", "logits", "loss"}},
            5,
            PipelineSpec::ONE_F_ONE_B,
            13},
        SplitCase{
            kMlp,
            {{"fc1", "bn1"}, {"relu1", "fc2", "drop"}, {"relu2", "fc3", "relu3", "logits", "loss"}},
            3,
            PipelineSpec::GPIPE,
            12},
        SplitCase{kResidual,
                  {{"a", "ra"}, {"b", "rb", "sum1"}, {"c", "sum2", "rc", "logits", "loss"}},
                  4,
                  PipelineSpec::ONE_F_ONE_B,
                  11},
        SplitCase{kResidual,
                  {{"a", "ra", "b"}, {"rb", "sum1", "c", "sum2", "rc"}, {"logits"}, {"loss"}},
                  6,
                  PipelineSpec::GPIPE,
                  6},
        SplitCase{kCnn,
                  {{"conv1", "relu1", "pool", "flat"}, {"fc", "relu2", "logits", "loss"}},
                  2,
                  PipelineSpec::ONE_F_ONE_B,
                  8},
        // Fewer examples than micro-batches: one example each.
        SplitCase{kCnn,
                  {{"conv1", "relu1"}, {"pool", "flat", "fc"}, {"relu2", "logits", "loss"}},
                  8,
                  PipelineSpec::ONE_F_ONE_B,
                  3}));

// Without batch norm and dropout, micro-batches change only the order of
// the sums: the split model's gradient is the plain model's whole-batch one.
TEST(PipelineModelTest, GradientsMatchAPlainModelOnTheWholeBatch) {
  const ModelSpec spec = WithPipeline(
      kResidual, {{"a", "ra"}, {"b", "rb", "sum1"}, {"c", "sum2", "rc", "logits", "loss"}}, 4);
  auto split = MakePipeline(spec, 3);
  ModelSpec plain_spec = spec;
  plain_spec.clear_pipeline();
  auto plain = Model::Create(plain_spec, 7);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const TestBatch b = RandomBatch(split->shape(), 10, 3);
  auto s = split->TrainStep(b.features.data(), b.labels.data(), b.size, 0);
  auto p = (*plain)->TrainStep(b.features.data(), b.labels.data(), b.size, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(s->loss, p->loss, 1e-5);
  EXPECT_EQ(s->correct, p->correct);
  for (const ParamInfo& info : (*plain)->params()) {
    for (int64_t i = 0; i < info.num_elements; ++i) {
      EXPECT_NEAR(split->grad(info.id)[i], (*plain)->grad(info.id)[i], 1e-5) << info.name;
    }
  }
}

TEST(PipelineModelTest, CallsTheTrainersHooksWithWholeModelIds) {
  const ModelSpec spec = WithPipeline(
      kMlp, {{"fc1", "bn1", "relu1"}, {"fc2", "drop", "relu2"}, {"fc3", "relu3", "logits", "loss"}},
      6);
  auto model = MakePipeline(spec, 3);
  const TestBatch b = RandomBatch(model->shape(), 12, 5);
  std::vector<int> awaited;
  int before = 0;
  std::vector<std::pair<int, int64_t>> queued;
  TrainStepOptions options;
  options.await_layer_params = [&](int layer) {
    awaited.push_back(layer);
    return absl::OkStatus();
  };
  options.before_backward = [&] {
    ++before;
    return absl::OkStatus();
  };
  options.gradient_queued = [&](int id, int64_t ticket) { queued.emplace_back(id, ticket); };
  auto result = model->TrainStep(b.features.data(), b.labels.data(), b.size, 0, options);
  ASSERT_TRUE(result.ok()) << result.status();
  std::sort(awaited.begin(), awaited.end());
  // Layers with parameters: fc1, bn1, fc2, fc3, logits.
  EXPECT_EQ(awaited, (std::vector<int>{0, 1, 3, 6, 8}));
  EXPECT_EQ(before, 1);
  std::set<int> ids;
  for (const auto& [id, ticket] : queued) {
    EXPECT_TRUE(ids.insert(id).second) << id;
    EXPECT_TRUE(model->WaitGradient(id, ticket).ok());
  }
  EXPECT_EQ(ids.size(), model->params().size());
  // The streamed gradients are the step's.
  auto again = MakePipeline(spec, 3);
  ASSERT_TRUE(again->TrainStep(b.features.data(), b.labels.data(), b.size, 0).ok());
  EXPECT_EQ(GradientDifference(*model, *again), 0);
}

TEST(PipelineModelTest, AHookErrorEndsTheStep) {
  auto model = MakePipeline(
      WithPipeline(kCnn, {{"conv1", "relu1", "pool", "flat"}, {"fc", "relu2", "logits", "loss"}},
                   4),
      2);
  const TestBatch b = RandomBatch(model->shape(), 8, 5);
  TrainStepOptions options;
  options.await_layer_params = [](int layer) {
    return layer == 4 ? absl::UnavailableError("shard gone") : absl::OkStatus();
  };
  auto result = model->TrainStep(b.features.data(), b.labels.data(), b.size, 0, options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("shard gone"));
  // The model is usable again.
  EXPECT_TRUE(model->TrainStep(b.features.data(), b.labels.data(), b.size, 1).ok());
}

TEST(PipelineModelTest, RefusesBadBatchesAndDevices) {
  auto model = MakePipeline(
      WithPipeline(kCnn, {{"conv1", "relu1", "pool", "flat"}, {"fc", "relu2", "logits", "loss"}},
                   4),
      2);
  TestBatch b = RandomBatch(model->shape(), 4, 5);
  b.labels[2] = 4;
  auto result = model->TrainStep(b.features.data(), b.labels.data(), b.size, 0);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("labels[2] = 4"));
  auto three = PipelineModel::Create(
      WithPipeline(kCnn, {{"conv1", "relu1", "pool", "flat"}, {"fc", "relu2", "logits", "loss"}},
                   4),
      1, {-1, -1, -1});
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(three.status().message()),
              HasSubstr("the model has 2 pipeline stages but 3 devices were given"));
}

// A model over the memory limit on one device trains split over two.
TEST(PipelineModelTest, AModelOverTheMemoryLimitTrainsSplit) {
  constexpr char kWide[] = R"pb(
    input_shape: 64
    num_classes: 4
    layer {
      name: "fc1"
      dense { units: 256 }
    }
    layer {
      name: "r1"
      relu {}
    }
    layer {
      name: "fc2"
      dense { units: 256 }
    }
    layer {
      name: "r2"
      relu {}
    }
    layer {
      name: "fc3"
      dense { units: 256 }
    }
    layer {
      name: "r3"
      relu {}
    }
    layer {
      name: "logits"
      dense { units: 4 }
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb";
  // Parameters and gradients: about 2 * 4 * 148k floats = 1.2 MB.
  ModelOptions options;
  options.memory_limit = 900 << 10;
  ModelSpec plain = ParseModelSpec(kWide);
  auto whole = Model::Create(plain, 7, options);
  ASSERT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(whole.status().message()),
              HasSubstr("over the limit of 900.0 KiB (--device_memory_limit)"));
  EXPECT_THAT(std::string(whole.status().message()), HasSubstr("cpu: allocating"));
  auto one = PipelineModel::Create(OneStage(kWide, 4), 7, {-1}, options);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(one.status().message()), HasSubstr("pipeline stage 0: cpu: allocating"));

  auto split = PipelineModel::Create(
      WithPipeline(kWide, {{"fc1", "r1", "fc2", "r2"}, {"fc3", "r3", "logits", "loss"}}, 4), 7,
      {-1, -1}, options);
  ASSERT_TRUE(split.ok()) << split.status();
  const TestBatch b = RandomBatch((*split)->shape(), 32, 11);
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    auto result = (*split)->TrainStep(b.features.data(), b.labels.data(), b.size, step);
    ASSERT_TRUE(result.ok()) << result.status();
    if (step == 0) first = result->loss;
    last = result->loss;
    OptimizerHyperparams hp;
    hp.learning_rate = 0.05f;
    hp.step = step + 1;
    ASSERT_TRUE((*split)->ApplyOptimizerOnDevice(OptimizerKind::kSgd, hp).ok());
  }
  EXPECT_LT(last, 0.5 * first);
  for (const Model::ComputeMemory& m : (*split)->compute_memory()) {
    EXPECT_LE(m.total(), options.memory_limit);
  }
}

struct SpecError {
  std::string pipeline;  // Text of ModelSpec.pipeline.
  std::string message;
};

class PipelineSpecTest : public ::testing::TestWithParam<SpecError> {};

TEST_P(PipelineSpecTest, NamesTheFieldAtFault) {
  ModelSpec spec = ParseModelSpec(kResidual);
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(GetParam().pipeline, spec.mutable_pipeline()));
  auto shape = InferModel(spec);
  ASSERT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument) << GetParam().pipeline;
  EXPECT_EQ(shape.status().message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Errors, PipelineSpecTest,
    ::testing::Values(
        SpecError{"micro_batches: 2", "model.pipeline.stage is empty: give one stage or more"},
        SpecError{R"(stage { layers: ["a", "x"] })",
                  "model.pipeline.stage[0].layers[1] (\"x\"): not a layer of the model"},
        SpecError{R"(stage { layers: ["a", "ra", "b", "rb", "sum1"] }
                     stage { layers: ["b", "c", "sum2", "rc", "logits", "loss"] })",
                  "model.pipeline.stage[1].layers[0] (\"b\"): already in stage[0]"},
        SpecError{R"(stage { layers: ["a", "ra", "b", "rb", "sum1"] }
                     stage { layers: ["c", "sum2", "rc", "logits"] })",
                  "model.pipeline: layer \"loss\" is in no stage"},
        SpecError{R"(stage { layers: ["a", "ra", "b", "rb", "sum1"] } stage {})",
                  "model.pipeline.stage[1]: no layers"},
        SpecError{R"(stage { layers: ["c", "sum2", "rc", "logits", "loss"] }
                     stage { layers: ["a", "ra", "b", "rb", "sum1"] })",
                  "model.pipeline: layer \"c\" (stage[0]) follows \"sum1\" (stage[1]); stages "
                  "follow the layer order"},
        SpecError{R"(stage { layers: ["a", "ra", "b", "rb", "sum1"] }
                     stage { layers: ["c", "sum2", "rc", "logits", "loss"] }
                     micro_batches: -1)",
                  "model.pipeline.micro_batches must be in [0, 4096], got -1"}));

TEST(PipelineSpecTest, RefusesALaterStageReadingTheModelInputOrFlatteningAnEarlierStage) {
  auto reading = InferModel(ParseModelSpec(R"pb(
    num_classes: 2
    inputs { name: "x" shape: 4 }
    layer {
      name: "fc1"
      inputs: "x"
      dense { units: 2 }
    }
    layer {
      name: "fc2"
      inputs: "x"
      dense { units: 2 }
    }
    layer {
      name: "sum"
      inputs: [ "fc1", "fc2" ]
      add {}
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
    pipeline {
      stage { layers: "fc1" }
      stage { layers: [ "fc2", "sum", "loss" ] }
    }
  )pb"));
  EXPECT_EQ(reading.status().message(),
            "model.pipeline.stage[1]: layer \"fc2\" reads the model input; only the first stage "
            "does");
  auto flattening = InferModel(ParseModelSpec(R"pb(
    input_shape: [ 4, 4, 1 ]
    num_classes: 2
    layer {
      name: "conv"
      conv2d { filters: 2 kernel_size: 3 }
    }
    layer {
      name: "flat"
      flatten {}
    }
    layer {
      name: "fc"
      dense { units: 2 }
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
    pipeline {
      stage { layers: "conv" }
      stage { layers: [ "flat", "fc", "loss" ] }
    }
  )pb"));
  EXPECT_EQ(flattening.status().message(),
            "model.pipeline.stage[1]: layer \"flat\" flattens \"conv\" of an earlier stage; put "
            "the flatten in that stage");
}

}  // namespace
}  // namespace downpour
