#include "model/replica_set.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "model/devices.h"

namespace downpour {
namespace {

constexpr int kFeatures = 12;
constexpr int kClasses = 4;

ModelSpec Mlp() {
  ModelSpec spec;
  spec.add_input_shape(kFeatures);
  spec.set_num_classes(kClasses);
  spec.add_layer()->mutable_dense()->set_units(16);
  spec.add_layer()->mutable_relu();
  spec.add_layer()->mutable_dense()->set_units(kClasses);
  spec.add_layer()->mutable_softmax_cross_entropy();
  return spec;
}

std::unique_ptr<Model> MakeModel(int device, Precision precision = FP32) {
  ModelOptions options;
  options.device = device;
  options.precision = precision;
  auto model = Model::Create(Mlp(), /*seed=*/3, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

std::unique_ptr<ReplicaSet> MakeSet(const std::vector<int>& devices, Precision precision = FP32) {
  std::vector<std::unique_ptr<Model>> replicas;
  for (int device : devices) {
    replicas.push_back(MakeModel(device, precision));
    if (replicas.back() == nullptr) return nullptr;
  }
  auto set = ReplicaSet::Create(std::move(replicas));
  EXPECT_TRUE(set.ok()) << set.status();
  return set.ok() ? std::move(set).value() : nullptr;
}

struct Batch {
  std::vector<float> features;
  std::vector<int32_t> labels;
  int64_t size = 0;
};

Batch RandomBatch(int64_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1, 1);
  Batch b;
  b.size = size;
  b.features.resize(size * kFeatures);
  b.labels.resize(size);
  for (float& v : b.features) v = uniform(rng);
  for (int32_t& v : b.labels) v = static_cast<int32_t>(rng() % kClasses);
  return b;
}

// Why a test of two GPU replicas cannot run here, or "" when it can.
std::string WhyNoTwoGpus() {
  const int count = GpuCount();
  if (count == 0) return GpuUnavailableReason();
  if (count < 2) return absl::StrCat("needs two CUDA devices, this process sees ", count);
  return "";
}

#define SKIP_WITHOUT_TWO_GPUS()             \
  do {                                      \
    const std::string why = WhyNoTwoGpus(); \
    if (!why.empty()) GTEST_SKIP() << why;  \
  } while (0)

// One step of `set` on `b` gives `whole`'s loss, correct count and gradient
// over the whole batch (gradients elementwise within `tolerance`).
void ExpectStepMatches(ReplicaSet* set, Model* whole, const Batch& b, int64_t step,
                       double tolerance = 1e-5) {
  auto expected = whole->TrainStep(b.features.data(), b.labels.data(), b.size, step);
  auto actual = set->TrainStep(b.features.data(), b.labels.data(), b.size, step);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(actual.ok()) << actual.status();
  EXPECT_FALSE(actual->skipped);
  EXPECT_NEAR(actual->loss, expected->loss, tolerance) << "step " << step;
  EXPECT_EQ(actual->correct, expected->correct) << "step " << step;
  for (const ParamInfo& p : whole->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      ASSERT_NEAR(set->primary()->grad(p.id)[i], whole->grad(p.id)[i], tolerance)
          << p.name << "[" << i << "] at step " << step;
    }
  }
}

// Gives every replica but the primary other parameters than the primary's,
// on the host and, on a GPU, on the device too: a step must not use them.
void ScrambleSecondaryReplicas(ReplicaSet* set) {
  for (int r = 1; r < set->size(); ++r) {
    Model* m = set->replica(r);
    for (const ParamInfo& p : m->params()) {
      std::fill(m->param(p.id), m->param(p.id) + p.num_elements, 9.f);
    }
    if (m->device() >= 0) {
      ASSERT_TRUE(m->ParamsToDevice().ok());
      ASSERT_TRUE(m->Synchronize().ok());
    }
  }
}

// Split across replicas, the averaged gradient and the loss equal one model's
// over the whole batch.
void ExpectSplitMatchesWhole(const std::vector<int>& devices, int64_t batch) {
  auto whole = MakeModel(devices[0]);
  auto set = MakeSet(devices);
  ASSERT_TRUE(whole && set);
  ScrambleSecondaryReplicas(set.get());
  ExpectStepMatches(set.get(), whole.get(), RandomBatch(batch, 7), 0);
}

// Parameters of every replica's device as the primary's host copy: what the
// last step's broadcast left there.
void ExpectDeviceParamsArePrimarys(ReplicaSet* set) {
  Model* primary = set->primary();
  for (int r = 0; r < set->size(); ++r) {
    Model* m = set->replica(r);
    for (const ParamInfo& p : m->params()) {
      std::vector<float> on_device(p.num_elements);
      ASSERT_TRUE(
          m->backend()
              .ToHost(on_device.data(), m->device_param(p.id), p.num_elements * sizeof(float))
              .ok());
      ASSERT_TRUE(m->backend().Synchronize().ok());
      for (int64_t i = 0; i < p.num_elements; ++i) {
        ASSERT_EQ(on_device[i], primary->param(p.id)[i])
            << "replica " << r << " " << p.name << "[" << i << "]";
      }
    }
  }
}

// Several steps, the primary's parameters moved between them (an SGD step,
// as a pull would bring): each step trains on the primary's current host
// parameters, as one model given the same parameters does.
void ExpectStepsMatchWhole(const std::vector<int>& devices, int64_t batch, int steps) {
  auto whole = MakeModel(devices[0]);
  auto set = MakeSet(devices);
  ASSERT_TRUE(whole && set);
  ScrambleSecondaryReplicas(set.get());
  for (int step = 0; step < steps; ++step) {
    ExpectStepMatches(set.get(), whole.get(), RandomBatch(batch, 100 + step), step);
    if (::testing::Test::HasFatalFailure()) return;
    if (set->reduces_with_nccl()) {
      ExpectDeviceParamsArePrimarys(set.get());
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (const ParamInfo& p : whole->params()) {
      for (int64_t i = 0; i < p.num_elements; ++i) {
        const float updated = whole->param(p.id)[i] - 0.5f * whole->grad(p.id)[i];
        whole->param(p.id)[i] = updated;
        set->primary()->param(p.id)[i] = updated;
      }
    }
  }
}

// A label out of range in the last replica's slice fails the step with that
// replica's error; nothing is left pending, so the next step runs and is
// right.
void ExpectBadSliceFailsCleanly(const std::vector<int>& devices) {
  auto whole = MakeModel(devices[0]);
  auto set = MakeSet(devices);
  ASSERT_TRUE(whole && set);
  Batch bad = RandomBatch(6, 5);
  bad.labels[5] = kClasses + 3;
  auto failed = set->TrainStep(bad.features.data(), bad.labels.data(), bad.size, 0);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  ExpectStepMatches(set.get(), whole.get(), RandomBatch(6, 6), 1);
}

// ---- CPU replicas: averaged on the host.

TEST(ReplicasTest, TwoCpuReplicasMatchOneOverTheWholeBatch) {
  ExpectSplitMatchesWhole({-1, -1}, 9);  // Uneven slices: 4 and 5.
}

TEST(ReplicasTest, MoreReplicasThanExamples) { ExpectSplitMatchesWhole({-1, -1, -1}, 2); }

TEST(ReplicasTest, CpuReplicasFollowTheUpdatedParameters) { ExpectStepsMatchWhole({-1, -1}, 7, 3); }

TEST(ReplicasTest, CpuReplicaFailureIsReturned) { ExpectBadSliceFailsCleanly({-1, -1}); }

TEST(ReplicasTest, CpuReplicasDoNotUseNccl) {
  auto set = MakeSet({-1, -1});
  ASSERT_TRUE(set);
  EXPECT_FALSE(set->reduces_with_nccl());
}

TEST(ReplicasTest, CreateRejectsNoReplicaAndMismatchedReplicas) {
  EXPECT_EQ(ReplicaSet::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  ModelSpec other = Mlp();
  other.mutable_layer(0)->mutable_dense()->set_units(8);
  auto different = Model::Create(other, /*seed=*/3);
  ASSERT_TRUE(different.ok()) << different.status();
  std::vector<std::unique_ptr<Model>> replicas;
  replicas.push_back(MakeModel(-1));
  replicas.push_back(std::move(different).value());
  EXPECT_EQ(ReplicaSet::Create(std::move(replicas)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- One replica per GPU: NCCL.

TEST(ReplicasTest, OneReplicaPerGpuMatchesOneGpu) {
  SKIP_WITHOUT_TWO_GPUS();
  ExpectSplitMatchesWhole({0, 1}, 64);
}

TEST(ReplicasTest, TwoGpusReduceWithNccl) {
  SKIP_WITHOUT_TWO_GPUS();
  auto set = MakeSet({0, 1});
  ASSERT_TRUE(set);
  EXPECT_TRUE(set->reduces_with_nccl());
}

TEST(ReplicasTest, TwoGpusUnequalSlices) {
  SKIP_WITHOUT_TWO_GPUS();
  ExpectSplitMatchesWhole({0, 1}, 7);  // 3 and 4: weights 3/7 and 4/7.
}

TEST(ReplicasTest, TwoGpusOneExample) {
  SKIP_WITHOUT_TWO_GPUS();
  ExpectSplitMatchesWhole({0, 1}, 1);  // Replica 0 alone.
}

TEST(ReplicasTest, TwoGpusFollowTheUpdatedParameters) {
  SKIP_WITHOUT_TWO_GPUS();
  ExpectStepsMatchWhole({0, 1}, 9, 4);
}

TEST(ReplicasTest, TwoGpusReplicaFailureLeavesNothingPending) {
  SKIP_WITHOUT_TWO_GPUS();
  ExpectBadSliceFailsCleanly({0, 1});
}

// Each GPU owns a contiguous run of whole tensors, in order, and both own
// some: each moves its own share between the host and its device.
TEST(ReplicasTest, TwoGpusEachOwnAShareOfTheParameters) {
  SKIP_WITHOUT_TWO_GPUS();
  auto set = MakeSet({0, 1});
  ASSERT_TRUE(set);
  std::vector<int> owned(2, 0);
  int last = 0;
  for (const ParamInfo& p : set->primary()->params()) {
    const int owner = set->owner(p.id);
    ASSERT_GE(owner, last) << p.name;
    ASSERT_LT(owner, 2) << p.name;
    last = owner;
    owned[owner] += p.num_elements;
  }
  EXPECT_GT(owned[0], 0);
  EXPECT_GT(owned[1], 0);
}

// The gradients streamed out as each share lands (gradient_queued, then
// WaitGradient on any thread), with the parameters of every share queued to
// its GPU as a pull brings them (UploadParam, params_from_host false): the
// same steps as one GPU over the whole batch.
TEST(ReplicasTest, TwoGpusStreamGradientsAndTakeUploadedShares) {
  SKIP_WITHOUT_TWO_GPUS();
  auto whole = MakeModel(0);
  auto set = MakeSet({0, 1});
  ASSERT_TRUE(whole && set);
  ScrambleSecondaryReplicas(set.get());
  Model* primary = set->primary();
  for (int step = 0; step < 3; ++step) {
    const Batch b = RandomBatch(10, 40 + step);
    std::vector<std::pair<int, int64_t>> queued;
    TrainStepOptions options;
    options.params_from_host = step == 0;  // Later steps: uploaded below.
    options.gradient_queued = [&](int id, int64_t ticket) { queued.emplace_back(id, ticket); };
    // The host gradient must come from the step, not be left over.
    for (const ParamInfo& p : primary->params()) {
      std::fill(primary->grad(p.id), primary->grad(p.id) + p.num_elements, -7.f);
    }
    auto expected = whole->TrainStep(b.features.data(), b.labels.data(), b.size, step);
    auto actual = set->TrainStep(b.features.data(), b.labels.data(), b.size, step, options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, 1e-5);
    ASSERT_EQ(queued.size(), primary->params().size());
    std::vector<bool> seen(queued.size(), false);
    std::thread waiter([&] {
      for (const auto& [id, ticket] : queued) EXPECT_TRUE(set->WaitGradient(id, ticket).ok());
    });
    waiter.join();
    for (const auto& [id, ticket] : queued) {
      ASSERT_FALSE(seen[id]) << "param " << id << " announced twice";
      seen[id] = true;
      const ParamInfo& p = primary->params()[id];
      for (int64_t i = 0; i < p.num_elements; ++i) {
        ASSERT_NEAR(primary->grad(id)[i], whole->grad(id)[i], 1e-5)
            << p.name << "[" << i << "] at step " << step;
      }
    }
    // A pull's worth of new parameters, partition by partition (two pieces
    // of each tensor), queued to their GPUs as they come.
    for (const ParamInfo& p : whole->params()) {
      for (int64_t i = 0; i < p.num_elements; ++i) {
        const float updated = whole->param(p.id)[i] - 0.5f * whole->grad(p.id)[i];
        whole->param(p.id)[i] = updated;
        primary->param(p.id)[i] = updated;
      }
      const int64_t half = p.num_elements / 2;
      ASSERT_TRUE(set->UploadParam(p.id, 0, half).ok());
      ASSERT_TRUE(set->UploadParam(p.id, half, p.num_elements - half).ok());
    }
  }
}

// One step as the overlapped worker drives it: the parameters arrive layer
// by layer while the step runs (await_layer_params, which queues them with
// UploadParam), a hook runs once before backward, and each gradient is
// announced as it is ready. Returns the layers awaited, in order, and how
// often the hook ran; the gradients are checked against `whole`.
struct OverlappedStep {
  std::vector<int> awaited;
  int before_backward = 0;
};
OverlappedStep RunOverlappedStep(ReplicaSet* set, Model* whole, const Batch& b, int64_t step) {
  OverlappedStep seen;
  Model* primary = set->primary();
  std::vector<std::pair<int, int64_t>> queued;
  TrainStepOptions options;
  options.params_from_host = false;
  options.await_layer_params = [&](int layer) -> absl::Status {
    seen.awaited.push_back(layer);
    for (int id : primary->shape().layers[layer].param_ids) {
      const float* from = whole->param(id);
      std::copy(from, from + primary->params()[id].num_elements, primary->param(id));
      RETURN_IF_ERROR(set->UploadParam(id, 0, primary->params()[id].num_elements));
    }
    return absl::OkStatus();
  };
  options.before_backward = [&] {
    ++seen.before_backward;
    return absl::OkStatus();
  };
  options.gradient_queued = [&](int id, int64_t ticket) { queued.emplace_back(id, ticket); };
  auto expected = whole->TrainStep(b.features.data(), b.labels.data(), b.size, step);
  auto actual = set->TrainStep(b.features.data(), b.labels.data(), b.size, step, options);
  EXPECT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(actual.ok()) << actual.status();
  if (!expected.ok() || !actual.ok()) return seen;
  EXPECT_NEAR(actual->loss, expected->loss, 1e-5);
  EXPECT_EQ(queued.size(), primary->params().size());
  std::vector<int> times(primary->params().size(), 0);
  for (const auto& [id, ticket] : queued) {
    ++times[id];
    EXPECT_TRUE(set->WaitGradient(id, ticket).ok());
  }
  for (const ParamInfo& p : primary->params()) {
    EXPECT_EQ(times[p.id], 1) << p.name;
    for (int64_t i = 0; i < p.num_elements; ++i) {
      EXPECT_NEAR(primary->grad(p.id)[i], whole->grad(p.id)[i], 1e-5)
          << p.name << "[" << i << "] at step " << step;
    }
  }
  return seen;
}

// Several overlapped steps, new parameters each time (an SGD step of the
// whole-batch model, delivered layer by layer): every layer with parameters
// is awaited once, in order, the hook runs once, and the gradients are the
// whole batch's.
void ExpectOverlappedStepsMatchWhole(const std::vector<int>& devices, int64_t batch) {
  auto whole = MakeModel(devices[0]);
  auto set = MakeSet(devices);
  ASSERT_TRUE(whole && set);
  ScrambleSecondaryReplicas(set.get());
  std::vector<int> layers_with_params;
  const auto& layers = whole->shape().layers;
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    if (!layers[i].param_ids.empty()) layers_with_params.push_back(i);
  }
  for (int step = 0; step < 3; ++step) {
    const OverlappedStep seen =
        RunOverlappedStep(set.get(), whole.get(), RandomBatch(batch, 60 + step), step);
    if (::testing::Test::HasFailure()) return;
    EXPECT_EQ(seen.awaited, layers_with_params);
    EXPECT_EQ(seen.before_backward, 1);
    if (set->reduces_with_nccl()) ExpectDeviceParamsArePrimarys(set.get());
    for (const ParamInfo& p : whole->params()) {
      for (int64_t i = 0; i < p.num_elements; ++i) {
        whole->param(p.id)[i] -= 0.5f * whole->grad(p.id)[i];
      }
    }
  }
}

TEST(ReplicasTest, CpuReplicasTakeParametersAsTheyArrive) {
  ExpectOverlappedStepsMatchWhole({-1, -1}, 9);
}

TEST(ReplicasTest, TwoGpusOverlapGathersAndReducesWithTheSteps) {
  SKIP_WITHOUT_TWO_GPUS();
  ExpectOverlappedStepsMatchWhole({0, 1}, 9);
}

// Replica 1's slice overflows FP16 (features far outside its range), replica
// 0's does not: the whole step is skipped and replica 0's gradients are
// zeros; the next clean step reduces again.
TEST(ReplicasTest, TwoGpusFp16OverflowOnOneReplicaSkipsTheStep) {
  SKIP_WITHOUT_TWO_GPUS();
  auto whole = MakeModel(0, FP16);
  auto set = MakeSet({0, 1}, FP16);
  ASSERT_TRUE(whole && set);
  ASSERT_TRUE(set->reduces_with_nccl());
  const Batch clean = RandomBatch(8, 21);
  auto first = set->TrainStep(clean.features.data(), clean.labels.data(), clean.size, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->skipped) << "the clean batch overflowed at scale " << first->loss_scale;
  bool any_nonzero = false;
  for (const ParamInfo& p : set->primary()->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      any_nonzero = any_nonzero || set->primary()->grad(p.id)[i] != 0.f;
    }
  }
  ASSERT_TRUE(any_nonzero) << "a clean step's gradient should not be all zeros";

  // Slices of 4 and 4: the second is replica 1's.
  Batch overflowing = clean;
  std::fill(overflowing.features.begin() + 4 * kFeatures, overflowing.features.end(), 1e6f);
  auto second =
      set->TrainStep(overflowing.features.data(), overflowing.labels.data(), overflowing.size, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->skipped);
  for (const ParamInfo& p : set->primary()->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      ASSERT_EQ(set->primary()->grad(p.id)[i], 0.f) << p.name << "[" << i << "]";
    }
  }

  auto expected = whole->TrainStep(clean.features.data(), clean.labels.data(), clean.size, 2);
  auto third = set->TrainStep(clean.features.data(), clean.labels.data(), clean.size, 2);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->skipped);
  // FP16 rounds each slice's activations as the whole batch's, but the
  // sums run in another order: close in norm, not bit for bit.
  for (const ParamInfo& p : whole->params()) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < p.num_elements; ++i) {
      const double a = set->primary()->grad(p.id)[i], b = whole->grad(p.id)[i];
      ASSERT_TRUE(std::isfinite(a)) << p.name << "[" << i << "]";
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(norm) + 1e-6) << p.name;
  }
}

}  // namespace
}  // namespace downpour
