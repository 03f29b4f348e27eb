#include "worker/replicas.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda.h"

namespace downpour {
namespace {

ModelSpec Mlp() {
  ModelSpec spec;
  spec.add_input_shape(12);
  spec.set_num_classes(4);
  spec.add_layer()->mutable_dense()->set_units(16);
  spec.add_layer()->mutable_relu();
  spec.add_layer()->mutable_dense()->set_units(4);
  spec.add_layer()->mutable_softmax_cross_entropy();
  return spec;
}

std::vector<std::unique_ptr<Model>> Replicas(const std::vector<int>& devices) {
  std::vector<std::unique_ptr<Model>> replicas;
  for (int device : devices) {
    ModelOptions options;
    options.device = device;
    auto model = Model::Create(Mlp(), /*seed=*/3, options);
    EXPECT_TRUE(model.ok()) << model.status();
    replicas.push_back(std::move(model).value());
  }
  return replicas;
}

// Split across replicas, the averaged gradient and the loss equal one model's
// over the whole batch.
void ExpectSplitMatchesWhole(const std::vector<int>& devices, int64_t batch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> x(batch * 12);
  std::vector<int32_t> y(batch);
  for (float& v : x) v = uniform(rng);
  for (int32_t& v : y) v = rng() % 4;

  auto whole = Replicas({devices[0]});
  auto split = Replicas(devices);
  // Replicas start from the primary's parameters, whatever they held.
  for (float* p = split.back()->param(0); p != split.back()->param(0) + 12 * 16; ++p) *p = 9.f;
  auto expected = whole[0]->TrainStep(x.data(), y.data(), batch, 0);
  auto actual = TrainStepOnReplicas(split, x.data(), y.data(), batch, 0);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(actual.ok()) << actual.status();
  EXPECT_NEAR(actual->loss, expected->loss, 1e-5);
  EXPECT_EQ(actual->correct, expected->correct);
  for (const ParamInfo& p : whole[0]->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      ASSERT_NEAR(split[0]->grad(p.id)[i], whole[0]->grad(p.id)[i], 1e-5)
          << p.name << "[" << i << "]";
    }
  }
}

TEST(ReplicasTest, TwoCpuReplicasMatchOneOverTheWholeBatch) {
  ExpectSplitMatchesWhole({-1, -1}, 9);  // Uneven slices: 4 and 5.
}

TEST(ReplicasTest, MoreReplicasThanExamples) { ExpectSplitMatchesWhole({-1, -1, -1}, 2); }

TEST(ReplicasTest, OneReplicaPerGpuMatchesOneGpu) {
  if (kernels::cuda::CudaDeviceCount() < 2) {
    GTEST_SKIP() << "needs two CUDA devices: " << kernels::cuda::CudaUnavailableReason();
  }
  ExpectSplitMatchesWhole({0, 1}, 64);
}

}  // namespace
}  // namespace downpour
