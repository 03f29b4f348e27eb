// The GPU path of Model against the CPU path: the same spec, seed and
// batches give the same losses, gradients and evaluation (within float
// rounding of different summation orders), through TrainStep (host copies)
// and through the device-resident loop with the fused optimizer. Skips, with
// the reason, where there is no CUDA device.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/model.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/cuda.h"

namespace downpour {
namespace {

// Conv + batch norm + residual add + pooling + dropout + dense: every layer
// kind a CNN uses, in a graph.
constexpr char kSmallNet[] = R"pb(
  input_shape: [ 8, 8, 3 ]
  num_classes: 5
  layer {
    name: "conv1"
    conv2d { filters: 8 kernel_size: 3 padding: SAME }
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
    name: "conv2"
    conv2d { filters: 8 kernel_size: 3 padding: SAME no_bias: true }
  }
  layer {
    name: "bn2"
    batch_norm {}
  }
  layer {
    name: "res"
    add {}
    inputs: [ "bn2", "relu1" ]
  }
  layer {
    name: "relu2"
    relu {}
  }
  layer {
    name: "pool"
    max_pool { window: 2 }
  }
  layer {
    name: "conv3"
    conv2d { filters: 12 kernel_size: 3 stride: 2 padding: SAME }
  }
  layer {
    name: "avg"
    avg_pool { window: 2 }
  }
  layer {
    name: "gap_in"
    relu {}
  }
  layer {
    name: "flat"
    flatten {}
  }
  layer {
    name: "fc1"
    dense { units: 16 }
  }
  layer {
    name: "drop"
    dropout { rate: 0.25 }
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

ModelSpec ParseSpec(const std::string& text) {
  ModelSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

std::unique_ptr<Model> MakeModel(const std::string& text, int device) {
  auto model = Model::Create(ParseSpec(text), /*seed=*/7, ModelOptions{device});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

struct Batch {
  std::vector<float> features;
  std::vector<int32_t> labels;
};

Batch RandomBatch(int64_t batch, int64_t features, int classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> value(-1.f, 1.f);
  Batch b;
  b.features.resize(batch * features);
  for (float& f : b.features) f = value(gen);
  for (int64_t i = 0; i < batch; ++i) b.labels.push_back(static_cast<int32_t>(gen() % classes));
  return b;
}

void ExpectClose(const float* cpu, const float* gpu, int64_t n, double tolerance,
                 const std::string& what) {
  int reported = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(std::abs(cpu[i] - gpu[i]) <= tolerance * (1.0 + std::abs(cpu[i])))) {
      ADD_FAILURE() << what << "[" << i << "]: cpu " << cpu[i] << " gpu " << gpu[i];
      if (++reported == 5) return;
    }
  }
}

TEST(ModelDeviceTest, UnusableDeviceIsAnErrorNamingIt) {
  const int count = kernels::cuda::CudaDeviceCount();
  auto model = Model::Create(ParseSpec(kSmallNet), 1, ModelOptions{count});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition) << model.status();
  auto cpu = Model::Create(ParseSpec(kSmallNet), 1, ModelOptions{-1});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device_name(), "cpu");
}

class ModelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::cuda::CudaAvailable()) GTEST_SKIP() << kernels::cuda::CudaUnavailableReason();
  }
};

// A few SGD steps done by the caller on param(id), as the worker does with
// the parameter server: same losses, gradients, statistics and evaluation.
TEST_F(ModelGpuTest, TrainStepMatchesTheCpu) {
  auto cpu = MakeModel(kSmallNet, -1);
  auto gpu = MakeModel(kSmallNet, 0);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->device_name().rfind("cuda:0 ", 0), 0u) << gpu->device_name();
  for (const ParamInfo& p : cpu->params()) {
    ExpectClose(cpu->param(p.id), gpu->param(p.id), p.num_elements, 0, p.name + " initial");
  }
  const int64_t batch = 32;
  for (int step = 0; step < 8; ++step) {
    // A smaller batch at the end exercises reuse of larger buffers.
    const int64_t n = step == 7 ? batch / 2 : batch;
    const Batch b = RandomBatch(n, cpu->input_size(), 5, 100 + step);
    auto c = cpu->TrainStep(b.features.data(), b.labels.data(), n, step);
    auto g = gpu->TrainStep(b.features.data(), b.labels.data(), n, step);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_NEAR(c->loss, g->loss, 1e-4 * (1 + std::abs(c->loss))) << "step " << step;
    EXPECT_EQ(c->correct, g->correct) << "step " << step;
    for (const ParamInfo& p : cpu->params()) {
      ExpectClose(cpu->grad(p.id), gpu->grad(p.id), p.num_elements, 1e-3,
                  p.name + " grad, step " + std::to_string(step));
      // Both take the same update from the CPU gradient, so they stay equal.
      for (int64_t i = 0; i < p.num_elements; ++i) {
        cpu->param(p.id)[i] -= 0.1f * cpu->grad(p.id)[i];
        gpu->param(p.id)[i] = cpu->param(p.id)[i];
      }
    }
    for (const ParamInfo& s : cpu->local_state()) {
      ExpectClose(cpu->local_state_data(s.id), gpu->local_state_data(s.id), s.num_elements, 1e-4,
                  s.name);
    }
  }
  const Batch test = RandomBatch(100, cpu->input_size(), 5, 999);
  auto c = cpu->Evaluate(test.features.data(), test.labels.data(), 100);
  auto g = gpu->Evaluate(test.features.data(), test.labels.data(), 100);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_NEAR(c->loss_sum, g->loss_sum, 1e-4 * (1 + std::abs(c->loss_sum)));
  EXPECT_EQ(c->correct, g->correct);
}

// The device-resident loop (bench/step_time's): forward, backward and the
// fused Adam on the device; the CPU runs the same loop on host memory.
TEST_F(ModelGpuTest, DeviceResidentTrainingMatchesTheCpuAndLearns) {
  auto cpu = MakeModel(kSmallNet, -1);
  auto gpu = MakeModel(kSmallNet, 0);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const int64_t batch = 64;
  const Batch b = RandomBatch(batch, cpu->input_size(), 5, 5);
  float* features = nullptr;
  int32_t* labels = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&features), b.features.size() * sizeof(float)),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&labels), b.labels.size() * sizeof(int32_t)),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(features, b.features.data(), b.features.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(labels, b.labels.data(), b.labels.size() * sizeof(int32_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  OptimizerHyperparams hp;
  hp.learning_rate = 0.01f;
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    hp.step = step + 1;
    ASSERT_TRUE(cpu->TrainStepOnDevice(b.features.data(), b.labels.data(), batch, step).ok());
    ASSERT_TRUE(gpu->TrainStepOnDevice(features, labels, batch, step).ok());
    auto c = cpu->LastStepResult();
    auto g = gpu->LastStepResult();
    ASSERT_TRUE(c.ok() && g.ok());
    EXPECT_NEAR(c->loss, g->loss, 2e-3 * (1 + std::abs(c->loss))) << "step " << step;
    ASSERT_TRUE(cpu->ApplyOptimizerOnDevice(OptimizerKind::kAdam, hp).ok());
    ASSERT_TRUE(gpu->ApplyOptimizerOnDevice(OptimizerKind::kAdam, hp).ok());
    if (step == 0) first = g->loss;
    last = g->loss;
  }
  EXPECT_LT(last, 0.5 * first) << "one repeated batch should be learned";
  cudaFree(features);
  cudaFree(labels);
}

}  // namespace
}  // namespace downpour
