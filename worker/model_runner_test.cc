// The two ways a worker holds a job's model behind one interface: replicas
// and pipeline stages (on the CPU) compute the same steps, keep the same
// checkpointed state, and refuse a worker whose devices do not fit the
// pipeline or the memory limit.
#include "worker/model_runner.h"

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "spec/test_jobs.h"
#include "worker/worker_state.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// An MLP with batch norm (local state to checkpoint), no dropout.
constexpr char kModel[] = R"pb(
  input_shape: 12
  num_classes: 4
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

// kModel's job; with `stages`, split after the layers named (micro_batches
// `micro`).
JobSpec Job(const std::vector<std::vector<std::string>>& stages = {}, int micro = 1) {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kModel, spec.mutable_model()));
  spec.set_seed(11);
  for (const auto& layers : stages) {
    PipelineSpec::Stage* stage = spec.mutable_model()->mutable_pipeline()->add_stage();
    for (const std::string& name : layers) stage->add_layers(name);
  }
  if (!stages.empty()) spec.mutable_model()->mutable_pipeline()->set_micro_batches(micro);
  return spec;
}

const std::vector<std::vector<std::string>> kTwoStages = {{"fc1", "bn1", "relu1"},
                                                          {"fc2", "relu2", "logits", "loss"}};

std::unique_ptr<ModelRunner> Make(const JobSpec& spec, const std::vector<int>& devices = {}) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(spec, devices);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(runner).value() : nullptr;
}

struct Batch {
  std::vector<float> features;
  std::vector<int32_t> labels;
  int64_t size = 0;
};

Batch RandomBatch(int64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  Batch b;
  b.size = size;
  for (int64_t i = 0; i < size * 12; ++i) b.features.push_back(normal(rng));
  for (int64_t i = 0; i < size; ++i) b.labels.push_back(static_cast<int32_t>(rng() % 4));
  return b;
}

TEST(ModelRunnerTest, SparseEmbeddingsTrainOnTheFirstOfSeveralDevices) {
  JobSpec spec;
  *spec.mutable_model() = SmallSparseModel();
  std::unique_ptr<ModelRunner> runner = Make(spec, {-1, -1});
  ASSERT_NE(runner, nullptr);
  EXPECT_EQ(runner->Describe().size(), 1u);
  // Without sparse tables, each device holds a replica.
  runner = Make(Job(), {-1, -1});
  ASSERT_NE(runner, nullptr);
  EXPECT_EQ(runner->Describe().size(), 2u);
}

TEST(ModelRunnerTest, APipelineNeedsOneDevicePerStage) {
  // Checked before any device is touched: no GPU is needed to see it.
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(
      Job({{"fc1", "bn1"}, {"relu1", "fc2"}, {"relu2", "logits", "loss"}}), {0, 1});
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner.status().message(),
            "the job's pipeline has 3 stages; this worker has 2 devices (--devices)");
  runner = ModelRunner::Create(Job(kTwoStages), {0});
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().message(),
            "the job's pipeline has 2 stages; this worker has 1 device (--devices)");
}

TEST(ModelRunnerTest, WithoutDevicesEveryStageComputesOnTheCpu) {
  std::unique_ptr<ModelRunner> pipeline = Make(Job(kTwoStages, 8));
  ASSERT_NE(pipeline, nullptr);
  EXPECT_EQ(pipeline->device(), -1);
  EXPECT_TRUE(pipeline->reads_host_params());
  EXPECT_FALSE(pipeline->uploads_pulled_params());
  EXPECT_EQ(pipeline->whole_model(), nullptr);
  EXPECT_THAT(pipeline->Describe(),
              ::testing::ElementsAre(
                  "pipeline of 2 stages in 8 micro-batches (ONE_F_ONE_B): stage 0 on cpu, stage "
                  "1 on cpu, FP32"));

  std::unique_ptr<ModelRunner> replica = Make(Job());
  ASSERT_NE(replica, nullptr);
  EXPECT_TRUE(replica->reads_host_params());
  EXPECT_NE(replica->whole_model(), nullptr);
  EXPECT_THAT(replica->Describe(), ::testing::ElementsAre("model replica on cpu, FP32"));
}

// In one micro-batch the stages compute what the whole model does: the same
// parameters to start from, and the same gradients, loss and evaluation,
// step after step.
TEST(ModelRunnerTest, StagesInOneMicroBatchComputeTheWholeModelsSteps) {
  std::unique_ptr<ModelRunner> whole = Make(Job());
  std::unique_ptr<ModelRunner> split = Make(Job(kTwoStages, 1));
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(split, nullptr);
  ASSERT_EQ(split->params().size(), whole->params().size());
  for (const ParamInfo& p : whole->params()) {
    ASSERT_EQ(split->params()[p.id].name, p.name);
    for (int64_t i = 0; i < p.num_elements; ++i) {
      ASSERT_EQ(split->param(p.id)[i], whole->param(p.id)[i]) << p.name;
    }
  }
  for (int step = 0; step < 3; ++step) {
    const Batch b = RandomBatch(10, 40 + step);
    auto w = whole->TrainStep(b.features.data(), b.labels.data(), b.size, step, {});
    auto s = split->TrainStep(b.features.data(), b.labels.data(), b.size, step, {});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_NEAR(s->loss, w->loss, 1e-6);
    EXPECT_EQ(s->correct, w->correct);
    for (const ParamInfo& p : whole->params()) {
      for (int64_t i = 0; i < p.num_elements; ++i) {
        ASSERT_NEAR(split->grad(p.id)[i], whole->grad(p.id)[i], 1e-6) << p.name << " step " << step;
      }
    }
    for (ModelRunner* runner : {whole.get(), split.get()}) {
      for (const ParamInfo& p : runner->params()) {
        for (int64_t i = 0; i < p.num_elements; ++i) {
          runner->param(p.id)[i] -= 0.1f * runner->grad(p.id)[i];
        }
      }
    }
  }
  const Batch test = RandomBatch(7, 99);
  std::vector<float> wl, sl;
  auto we = whole->Evaluate(test.features.data(), test.labels.data(), test.size, &wl, false);
  auto se = split->Evaluate(test.features.data(), test.labels.data(), test.size, &sl, false);
  ASSERT_TRUE(we.ok()) << we.status();
  ASSERT_TRUE(se.ok()) << se.status();
  EXPECT_NEAR(se->loss_sum, we->loss_sum, 1e-5);
  EXPECT_EQ(se->correct, we->correct);
  ASSERT_EQ(sl.size(), wl.size());
  for (size_t i = 0; i < wl.size(); ++i) EXPECT_NEAR(sl[i], wl[i], 1e-5);
}

// The workers' state of a checkpoint names the whole model's tensors, so
// rank 0's pipeline saves it and a worker loads it into its stages (or a
// whole model), each tensor where it lives.
TEST(ModelRunnerTest, WorkerStateMovesBetweenStagesAndAWholeModel) {
  std::unique_ptr<ModelRunner> trained = Make(Job(kTwoStages, 2));
  ASSERT_NE(trained, nullptr);
  const Batch b = RandomBatch(8, 3);
  ASSERT_TRUE(trained->TrainStep(b.features.data(), b.labels.data(), b.size, 0, {}).ok());
  ASSERT_FALSE(trained->local_state().empty());
  absl::StatusOr<std::string> saved = SaveWorkerState(*trained);
  ASSERT_TRUE(saved.ok()) << saved.status();

  for (bool split : {true, false}) {
    std::unique_ptr<ModelRunner> fresh = Make(split ? Job(kTwoStages, 2) : Job());
    ASSERT_NE(fresh, nullptr);
    const absl::Status loaded = LoadWorkerState(*saved, fresh.get());
    ASSERT_TRUE(loaded.ok()) << loaded;
    for (const ParamInfo& state : trained->local_state()) {
      for (int64_t i = 0; i < state.num_elements; ++i) {
        ASSERT_EQ(fresh->local_state_data(state.id)[i], trained->local_state_data(state.id)[i])
            << state.name;
      }
    }
  }
  // Not this model's state: refused naming the tensor.
  std::unique_ptr<ModelRunner> other = Make([] {
    JobSpec spec = Job(kTwoStages, 2);
    spec.mutable_model()->mutable_layer(1)->set_name("bn_other");
    spec.mutable_model()->mutable_pipeline()->mutable_stage(0)->set_layers(1, "bn_other");
    return spec;
  }());
  ASSERT_NE(other, nullptr);
  const absl::Status refused = LoadWorkerState(*saved, other.get());
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("bn_other"));
}

// --device_memory_limit reaches every model the runner makes, split or not.
TEST(ModelRunnerTest, TheMemoryLimitCapsReplicasAndStages) {
  ModelOptions options;
  options.memory_limit = 1024;
  for (const JobSpec& spec : {Job(), Job(kTwoStages, 2)}) {
    absl::StatusOr<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(spec, {}, options);
    absl::Status status = runner.status();
    if (runner.ok()) {
      // Within the limit at creation: the first step's activations pass it.
      const Batch b = RandomBatch(64, 5);
      status = (*runner)->TrainStep(b.features.data(), b.labels.data(), b.size, 0, {}).status();
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("--device_memory_limit"));
  }
}

// Replicas made with one worker's shared caps (two ranks on one worker) hold
// its --device_memory_limit together: where one fits, two need twice.
TEST(ModelRunnerTest, ReplicasOfSharedMemoryHoldTheLimitTogether) {
  const Batch b = RandomBatch(64, 5);
  auto train = [&](ModelRunner* runner) {
    return runner->TrainStep(b.features.data(), b.labels.data(), b.size, 0, {}).status();
  };
  ModelOptions measure;
  measure.memory_caps = std::make_shared<kernels::MemoryCaps>(0);
  absl::StatusOr<std::unique_ptr<ModelRunner>> alone = ModelRunner::Create(Job(), {}, measure);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(train(alone->get()).ok());
  const int64_t one = measure.memory_caps->For("cpu")->held();
  ASSERT_GT(one, 0);

  ModelOptions options;
  options.memory_caps = std::make_shared<kernels::MemoryCaps>(one + one / 2);
  absl::StatusOr<std::unique_ptr<ModelRunner>> first = ModelRunner::Create(Job(), {}, options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(train(first->get()).ok());
  absl::StatusOr<std::unique_ptr<ModelRunner>> second = ModelRunner::Create(Job(), {}, options);
  absl::Status status = second.status();
  if (second.ok()) status = train(second->get());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("--device_memory_limit"));
  // Each alone fits: the second trains once the first is gone.
  *first = nullptr;
  absl::StatusOr<std::unique_ptr<ModelRunner>> again = ModelRunner::Create(Job(), {}, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(train(again->get()).ok());
}

}  // namespace
}  // namespace downpour
