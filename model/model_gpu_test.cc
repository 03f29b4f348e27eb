// The GPU path of Model against the CPU path: the same spec, seed and
// batches give the same losses, gradients and evaluation (within float
// rounding of different summation orders) in FP32_STRICT, through TrainStep
// (host copies) and through the device-resident loop with the fused
// optimizer; FP32 (TF32 convolutions), TF32, BF16 and FP16 against
// FP32_STRICT on the GPU. Skips, with the reason, where there is no CUDA
// device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/devices.h"
#include "model/model.h"
#include "model/model_testing.h"

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

// Strict fp32 (no TF32): compared with the CPU at fp32's tolerances.
std::unique_ptr<Model> MakeStrictModel(const std::string& text, int device) {
  ModelOptions options;
  options.device = device;
  options.precision = FP32_STRICT;
  auto model = Model::Create(ParseModelSpec(text), /*seed=*/7, options);
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

// A Batch copied to a model's compute memory, freed with the object.
struct DeviceBatch {
  DeviceBatch(kernels::ComputeBackend& backend, const Batch& b) {
    const size_t feature_bytes = b.features.size() * sizeof(float);
    const size_t label_bytes = b.labels.size() * sizeof(int32_t);
    auto f = backend.Allocate(feature_bytes);
    auto l = backend.Allocate(label_bytes);
    copied = f.ok() && l.ok();
    if (!copied) return;
    feature_memory = std::move(f).value();
    label_memory = std::move(l).value();
    features = feature_memory.as<float>();
    labels = label_memory.as<int32_t>();
    copied = backend.ToDevice(features, b.features.data(), feature_bytes).ok() &&
             backend.ToDevice(labels, b.labels.data(), label_bytes).ok() &&
             backend.Synchronize().ok();
  }
  bool ok() const { return copied; }

  kernels::DeviceMemory feature_memory, label_memory;
  float* features = nullptr;
  int32_t* labels = nullptr;
  bool copied = false;
};

// Copies `n` floats of a model's compute memory to the host.
std::vector<float> FromDevice(Model& model, const float* device, int64_t n) {
  std::vector<float> host(n);
  EXPECT_TRUE(model.backend().ToHost(host.data(), device, n * sizeof(float)).ok());
  EXPECT_TRUE(model.backend().Synchronize().ok());
  return host;
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
  const int count = GpuCount();
  auto model = Model::Create(ParseModelSpec(kSmallNet), 1, ModelOptions{count});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition) << model.status();
  auto cpu = Model::Create(ParseModelSpec(kSmallNet), 1, ModelOptions{-1});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device_name(), "cpu");
}

class ModelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (GpuCount() == 0) GTEST_SKIP() << GpuUnavailableReason();
  }
};

// A few SGD steps done by the caller on param(id), as the worker does with
// the parameter server: same losses, gradients, statistics and evaluation.
TEST_F(ModelGpuTest, TrainStepMatchesTheCpu) {
  auto cpu = MakeStrictModel(kSmallNet, -1);
  auto gpu = MakeStrictModel(kSmallNet, 0);
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

// Features written into the staging buffer (FeatureStaging) train as the
// same features handed over from elsewhere, through a larger batch's growth
// too; the CPU has no staging. (Within 1e-5, not bit for bit: two models may
// time their way to different convolution algorithms.)
TEST_F(ModelGpuTest, FeaturesWrittenIntoTheStagingBufferTrainAsCopiedOnes) {
  auto copied = MakeStrictModel(kSmallNet, 0);
  auto staged = MakeStrictModel(kSmallNet, 0);
  auto cpu = MakeStrictModel(kSmallNet, -1);
  ASSERT_NE(copied, nullptr);
  ASSERT_NE(staged, nullptr);
  ASSERT_NE(cpu, nullptr);
  absl::StatusOr<float*> none = cpu->FeatureStaging(8);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  for (int step = 0; step < 4; ++step) {
    const int64_t n = step < 2 ? 16 : 48;
    const Batch b = RandomBatch(n, copied->input_size(), 5, 300 + step);
    absl::StatusOr<float*> staging = staged->FeatureStaging(n);
    ASSERT_TRUE(staging.ok()) << staging.status();
    ASSERT_NE(*staging, nullptr);
    std::copy(b.features.begin(), b.features.end(), *staging);
    auto c = copied->TrainStep(b.features.data(), b.labels.data(), n, step);
    auto g = staged->TrainStep(*staging, b.labels.data(), n, step);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_NEAR(c->loss, g->loss, 1e-5 * (1 + std::abs(c->loss))) << "step " << step;
    for (const ParamInfo& p : copied->params()) {
      ExpectClose(copied->grad(p.id), staged->grad(p.id), p.num_elements, 1e-5,
                  p.name + " grad, step " + std::to_string(step));
    }
  }
}

// Rows pooled on the device (PooledStaging, TrainStepOptions::pooled_rows)
// train as the same rows pooled on the host into the features: the same
// parameter gradients bit for bit, and each row's gradient within
// 1e-6 of the host's sum from input_grad (the device sums a row's reads in
// 32 lanes); in FP32_STRICT and BF16.
TEST_F(ModelGpuTest, RowsPooledOnTheDeviceTrainAsPooledOnTheHost) {
  for (Precision precision : {FP32_STRICT, BF16}) {
    SCOPED_TRACE(Precision_Name(precision));
    ModelOptions options;
    options.device = 0;
    options.precision = precision;
    auto created = Model::Create(ParseModelSpec(kTwoSparseTablesSpec), 3, options);
    ASSERT_TRUE(created.ok()) << created.status();
    Model& model = **created;
    const ModelShape& shape = model.shape();
    ASSERT_EQ(shape.sparse_tables.size(), 2u);
    for (int64_t batch : {40, 90}) {
      std::mt19937 rng(static_cast<uint32_t>(batch));
      // Per table: rows, and each example's reads of them (0-5).
      std::vector<std::vector<float>> values(2);
      std::vector<std::vector<int32_t>> offsets(2), index(2);
      std::vector<int32_t> rows = {7, 12}, ids(2);
      for (int t = 0; t < 2; ++t) {
        const int64_t dim = shape.sparse_tables[t].dim;
        for (int64_t i = 0; i < rows[t] * dim; ++i) {
          values[t].push_back(std::uniform_real_distribution<float>(-1, 1)(rng));
        }
        offsets[t] = {0};
        for (int64_t b = 0; b < batch; ++b) {
          for (int k = static_cast<int>(rng() % 6); k > 0; --k) {
            index[t].push_back(static_cast<int32_t>(rng() % rows[t]));
          }
          offsets[t].push_back(static_cast<int32_t>(index[t].size()));
        }
        ids[t] = static_cast<int32_t>(index[t].size());
      }
      // On the host: the features pooled, the rows' gradients from
      // input_grad, in id order.
      const auto scale = [&](int t, int64_t b) {
        const int32_t n = offsets[t][b + 1] - offsets[t][b];
        return shape.sparse_tables[t].mean && n > 1 ? 1.f / static_cast<float>(n) : 1.f;
      };
      const auto slot = [&](int t) {
        return batch * shape.input_slots[shape.sparse_tables[t].slot].offset;
      };
      std::vector<float> features(batch * shape.input_size, 0.f);
      for (int64_t i = 0; i < batch * 2; ++i) features[i] = 0.01f * static_cast<float>(i % 17);
      for (int t = 0; t < 2; ++t) {
        const int64_t dim = shape.sparse_tables[t].dim;
        for (int64_t b = 0; b < batch; ++b) {
          float* out = features.data() + slot(t) + b * dim;
          for (int32_t k = offsets[t][b]; k < offsets[t][b + 1]; ++k) {
            for (int64_t d = 0; d < dim; ++d) out[d] += values[t][index[t][k] * dim + d];
          }
          if (scale(t, b) != 1.f) {
            for (int64_t d = 0; d < dim; ++d) out[d] *= scale(t, b);
          }
        }
      }
      std::vector<int32_t> labels(batch);
      for (int64_t b = 0; b < batch; ++b) labels[b] = static_cast<int32_t>(rng() % 2);
      // A first step at this batch measures the layers' scratch, and the
      // steps after it run planned: the two compared are both planned.
      ASSERT_TRUE(model.TrainStep(features.data(), labels.data(), batch, 0).ok());
      auto host = model.TrainStep(features.data(), labels.data(), batch, 0);
      ASSERT_TRUE(host.ok()) << host.status();
      std::vector<std::vector<float>> host_grads;
      for (const ParamInfo& p : model.params()) {
        host_grads.emplace_back(model.grad(p.id), model.grad(p.id) + p.num_elements);
      }
      std::vector<std::vector<float>> row_grads(2);
      for (int t = 0; t < 2; ++t) {
        const int64_t dim = shape.sparse_tables[t].dim;
        row_grads[t].assign(rows[t] * dim, 0.f);
        for (int64_t b = 0; b < batch; ++b) {
          const float* g = model.input_grad() + slot(t) + b * dim;
          for (int32_t k = offsets[t][b]; k < offsets[t][b + 1]; ++k) {
            for (int64_t d = 0; d < dim; ++d) {
              row_grads[t][index[t][k] * dim + d] += scale(t, b) * g[d];
            }
          }
        }
      }

      // On the device: the block filled, the features' dense slots only;
      // then with table 1's rows kept in a store on the device (row r at
      // place rows + 2 - r): all of them sent fresh, then none (read as
      // the step before left them, the store grown to 100 places), then
      // them and 300 rows the batch does not read (more fresh rows than
      // the pooling has threads for the batch) at the places after them.
      const auto place = [&](int32_t r) { return r < rows[1] ? rows[1] + 2 - r : r + 3; };
      const std::vector<std::vector<StoredRows>> layouts = {
          {}, {{}, {rows[1] + 3, rows[1]}}, {{}, {100, 0}}, {{}, {rows[1] + 303, rows[1] + 300}}};
      for (const std::vector<StoredRows>& stored : layouts) {
        const bool stores = !stored.empty();
        auto block = model.PooledStaging(batch, rows, ids, stored);
        ASSERT_TRUE(block.ok()) << block.status();
        ASSERT_NE(*block, nullptr);
        for (int t = 0; t < 2; ++t) {
          PooledRows& p = (**block)[t];
          ASSERT_EQ(p.rows, rows[t]);
          if (stores && t == 1) {
            ASSERT_EQ(p.values, nullptr);
            ASSERT_EQ(p.fresh, stored[1].fresh);
            const int64_t dim = shape.sparse_tables[t].dim;
            for (int32_t r = 0; r < rows[t]; ++r) p.places[r] = place(r);
            for (int32_t i = 0; i < p.fresh; ++i) {
              p.fresh_places[i] = place(i);
              if (i < rows[t]) {
                std::copy_n(values[t].begin() + i * dim, dim, p.fresh_values + i * dim);
              } else {
                std::fill_n(p.fresh_values + i * dim, dim, 1e6f);  // Never read.
              }
            }
          } else {
            std::copy(values[t].begin(), values[t].end(), p.values);
          }
          std::copy(offsets[t].begin(), offsets[t].end(), p.offsets);
          std::copy(index[t].begin(), index[t].end(), p.index);
          std::fill(p.row_reads, p.row_reads + rows[t] + 1, 0);
          for (int32_t r : index[t]) ++p.row_reads[r + 1];
          for (int32_t r = 0; r < rows[t]; ++r) p.row_reads[r + 1] += p.row_reads[r];
          std::vector<int32_t> at(p.row_reads, p.row_reads + rows[t]);
          for (int64_t b = 0; b < batch; ++b) {
            for (int32_t k = offsets[t][b]; k < offsets[t][b + 1]; ++k) {
              p.readers[at[index[t][k]]++] = static_cast<int32_t>(b);
            }
          }
        }
        const std::string which =
            "batch " + std::to_string(batch) +
            (stores ? ", stored, " + std::to_string(stored[1].fresh) + " fresh" : "");
        auto staging = model.FeatureStaging(batch);
        ASSERT_TRUE(staging.ok()) << staging.status();
        std::copy(features.begin(), features.begin() + batch * 2, *staging);
        TrainStepOptions pooled;
        pooled.pooled_rows = true;
        auto device = model.TrainStep(*staging, labels.data(), batch, 0, pooled);
        ASSERT_TRUE(device.ok()) << device.status();
        // The loss is summed with atomics: equal within their order's rounding.
        EXPECT_NEAR(host->loss, device->loss, 1e-6 * host->loss) << which;
        for (const ParamInfo& p : model.params()) {
          EXPECT_EQ(host_grads[p.id],
                    std::vector<float>(model.grad(p.id), model.grad(p.id) + p.num_elements))
              << p.name << ", " << which;
        }
        for (int t = 0; t < 2; ++t) {
          const PooledRows& p = (**block)[t];
          ExpectClose(row_grads[t].data(), p.grads, static_cast<int64_t>(row_grads[t].size()), 1e-6,
                      "table " + std::to_string(t) + " row grads, " + which);
        }
        // An evaluation pooled from the same block: the logits of the
        // features pooled on the host, bit for bit.
        std::copy(features.begin(), features.begin() + batch * 2, *staging);
        std::vector<float> device_logits, host_logits;
        auto evaluated =
            model.Evaluate(*staging, labels.data(), batch, &device_logits, /*pooled_rows=*/true);
        ASSERT_TRUE(evaluated.ok()) << evaluated.status();
        auto host_evaluated = model.Evaluate(features.data(), labels.data(), batch, &host_logits);
        ASSERT_TRUE(host_evaluated.ok()) << host_evaluated.status();
        EXPECT_EQ(host_logits, device_logits) << which;
        EXPECT_EQ(host_evaluated->correct, evaluated->correct) << which;
      }
    }
    // A pooled step or evaluation needs its batch's block.
    TrainStepOptions pooled;
    pooled.pooled_rows = true;
    std::vector<float> features(5 * model.shape().input_size, 0.f);
    std::vector<int32_t> labels(5, 0);
    auto refused = model.TrainStep(features.data(), labels.data(), 5, 1, pooled);
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
    auto refused_evaluation =
        model.Evaluate(features.data(), labels.data(), 5, nullptr, /*pooled_rows=*/true);
    EXPECT_TRUE(absl::IsFailedPrecondition(refused_evaluation.status()))
        << refused_evaluation.status();
  }
  // The CPU pools on the host.
  auto cpu = Model::Create(ParseModelSpec(kTwoSparseTablesSpec), 3, ModelOptions{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto none = (*cpu)->PooledStaging(4, {1, 1}, {1, 1});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
}

// The overlapped worker's step: gradients announced layer by layer as they
// go down (each once, last layer first, waited for on another thread);
// parameters queued up tensor by tensor (UploadParam) after the step, or,
// every other step, layer by layer as the forward reaches them
// (await_layer_params, which bf16 follows with each layer's cast): the same
// steps as the plain TrainStep's, in strict fp32 and in bf16.
TEST_F(ModelGpuTest, StreamedGradientsAndUploadedParamsMatchThePlainStep) {
  for (Precision precision : {FP32_STRICT, BF16}) {
    SCOPED_TRACE(Precision_Name(precision));
    ModelOptions model_options;
    model_options.device = 0;
    model_options.precision = precision;
    auto plain_or = Model::Create(ParseModelSpec(kSmallNet), 7, model_options);
    auto streamed_or = Model::Create(ParseModelSpec(kSmallNet), 7, model_options);
    ASSERT_TRUE(plain_or.ok()) << plain_or.status();
    ASSERT_TRUE(streamed_or.ok()) << streamed_or.status();
    Model& plain = **plain_or;
    Model& streamed = **streamed_or;
    const double tolerance = precision == BF16 ? 2e-2 : 1e-5;
    const int64_t batch = 32;
    const int num_params = static_cast<int>(plain.params().size());
    for (int step = 0; step < 6; ++step) {
      const Batch b = RandomBatch(batch, plain.input_size(), 5, 300 + step);
      const bool gated = step % 2 == 1;
      std::vector<std::pair<int, int64_t>> announced;
      int awaited = 0, before_backward = 0;
      TrainStepOptions options;
      options.params_from_host = step == 0;  // Later: UploadParam.
      options.gradient_queued = [&](int id, int64_t ticket) { announced.emplace_back(id, ticket); };
      if (gated) {
        options.await_layer_params = [&](int layer) -> absl::Status {
          ++awaited;
          for (int32_t id : streamed.shape().layers[layer].param_ids) {
            absl::Status up = streamed.UploadParam(id, 0, streamed.params()[id].num_elements);
            if (!up.ok()) return up;
          }
          return absl::OkStatus();
        };
        options.before_backward = [&] {
          ++before_backward;
          return absl::OkStatus();
        };
      }
      auto p = plain.TrainStep(b.features.data(), b.labels.data(), batch, step);
      auto s = streamed.TrainStep(b.features.data(), b.labels.data(), batch, step, options);
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_EQ(static_cast<int>(announced.size()), num_params);
      for (int k = 0; k < num_params; ++k) {
        EXPECT_EQ(announced[k].first, num_params - 1 - k) << "announced out of order";
      }
      if (gated) {
        EXPECT_GT(awaited, 1);  // Every layer with parameters.
        EXPECT_EQ(before_backward, 1);
      }
      absl::Status waited;
      std::thread([&] {
        for (const auto& [id, ticket] : announced) waited.Update(streamed.WaitGradient(ticket));
      }).join();
      ASSERT_TRUE(waited.ok()) << waited;
      EXPECT_NEAR(p->loss, s->loss, tolerance * (1 + std::abs(p->loss))) << "step " << step;
      for (const ParamInfo& info : plain.params()) {
        ExpectClose(plain.grad(info.id), streamed.grad(info.id), info.num_elements, tolerance,
                    info.name + " grad, step " + std::to_string(step));
        for (int64_t i = 0; i < info.num_elements; ++i) {
          plain.param(info.id)[i] -= 0.1f * plain.grad(info.id)[i];
          streamed.param(info.id)[i] = plain.param(info.id)[i];
        }
        if (step % 2 == 0) continue;  // The next step uploads as it goes.
        // Half now, half later: partitions arrive in pieces.
        const int64_t half = info.num_elements / 2;
        ASSERT_TRUE(streamed.UploadParam(info.id, half, info.num_elements - half).ok());
        ASSERT_TRUE(streamed.UploadParam(info.id, 0, half).ok());
      }
    }
  }
}

// The device-resident loop (bench/step_time's): forward, backward and the
// fused Adam on the device; the CPU runs the same loop on host memory.
TEST_F(ModelGpuTest, DeviceResidentTrainingMatchesTheCpuAndLearns) {
  auto cpu = MakeStrictModel(kSmallNet, -1);
  auto gpu = MakeStrictModel(kSmallNet, 0);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const int64_t batch = 64;
  const Batch b = RandomBatch(batch, cpu->input_size(), 5, 5);
  const DeviceBatch on_device(gpu->backend(), b);
  ASSERT_TRUE(on_device.ok());
  float* const features = on_device.features;
  const int32_t* const labels = on_device.labels;
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
}

// ---- Mixed precision.

std::unique_ptr<Model> MakeModelIn(int device, Precision precision, double initial_scale) {
  ModelOptions options;
  options.device = device;
  options.precision = precision;
  options.initial_loss_scale = initial_scale;
  auto model = Model::Create(ParseModelSpec(kSmallNet), /*seed=*/7, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// ||a - b|| <= tolerance * ||b|| (+ a floor for all-zero tensors): reduced
// precision rounds every product input, so elementwise bounds are too
// strict for small entries, the tensor's norm is what matters.
void ExpectNormClose(const float* ref, const float* got, int64_t n, double tolerance,
                     const std::string& what) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "]";
    diff += (ref[i] - got[i]) * double{ref[i] - got[i]};
    norm += ref[i] * double{ref[i]};
  }
  EXPECT_LE(std::sqrt(diff), tolerance * std::sqrt(norm) + 1e-6) << what;
}

// kSmallNet's parameters whose gradients pass through a batch norm's backward.
bool BeforeBatchNorm(const std::string& name) {
  return name.rfind("conv1", 0) == 0 || name.rfind("conv2", 0) == 0 || name.rfind("bn", 0) == 0;
}

double Norm(const float* v, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += v[i] * double{v[i]};
  return std::sqrt(sum);
}

// ||got - ref|| / ||ref|| (for the log).
double RelativeError(const float* ref, const float* got, int64_t n) {
  double diff = 0;
  for (int64_t i = 0; i < n; ++i) diff += (ref[i] - got[i]) * double{ref[i] - got[i]};
  const double norm = Norm(ref, n);
  return norm > 0 ? std::sqrt(diff) / norm : std::sqrt(diff);
}

// cos(a, b) >= min_cosine.
void ExpectAligned(const float* ref, const float* got, int64_t n, double min_cosine,
                   const std::string& what) {
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += ref[i] * double{got[i]};
  const double norms = Norm(ref, n) * Norm(got, n);
  EXPECT_GE(norms > 0 ? dot / norms : 1.0, min_cosine) << what;
}

// A reduced-precision gradient of kSmallNet against fp32's (both on the GPU,
// same parameters and batch), for each kind of parameter:
// - conv1's bias feeds a batch norm, which removes any per-channel constant:
//   its exact gradient is 0 and fp32's is rounding noise, so the reduced one
//   (noise of dy summed over the batch's rows) need only be small next to
//   its layer's weight gradient (5%);
// - the rest upstream of a batch norm: its backward subtracts near-equal
//   terms (the batch means of dy and dy * xhat) from rounded activations, so
//   the error is not small in norm (up to ~30% with every activation in
//   fp16/bf16, as with PyTorch's autocast); their direction must still agree
//   (cosine >= 0.9; a wrong kernel gives about 0);
// - everything else within `tolerance` in norm.
void ExpectReducedGradClose(const Model& ref, const Model& low, const ParamInfo& p,
                            double tolerance, const std::string& what) {
  if (p.name == "conv1/bias") {
    const ParamInfo& w = ref.params()[p.id - 1];
    EXPECT_LE(Norm(low.grad(p.id), p.num_elements), 0.05 * Norm(ref.grad(w.id), w.num_elements))
        << what;
  } else if (BeforeBatchNorm(p.name)) {
    ExpectAligned(ref.grad(p.id), low.grad(p.id), p.num_elements, 0.9, what);
  } else {
    ExpectNormClose(ref.grad(p.id), low.grad(p.id), p.num_elements, tolerance, what);
  }
}

// The CPU path runs every precision in full fp32 (TF32 and the reduced ones
// included): same numbers as FP32, never an error.
TEST(ModelPrecisionTest, CpuRunsEveryPrecisionInFp32) {
  auto fp32 = MakeModelIn(-1, FP32, DynamicLossScale::kDefaultInitial);
  ASSERT_TRUE(fp32);
  const Batch b = RandomBatch(16, fp32->input_size(), 5, 3);
  auto a = fp32->TrainStep(b.features.data(), b.labels.data(), 16, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  for (Precision precision : {TF32, FP32_STRICT, BF16, FP16}) {
    SCOPED_TRACE(Precision_Name(precision));
    auto other = MakeModelIn(-1, precision, DynamicLossScale::kDefaultInitial);
    ASSERT_TRUE(other);
    EXPECT_EQ(other->precision(), FP32);
    EXPECT_EQ(other->loss_scale(), 1.0);
    auto c = other->TrainStep(b.features.data(), b.labels.data(), 16, 0);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(a->loss, c->loss);
    EXPECT_FALSE(c->skipped);
  }
}

// bf16 / fp16 compute against strict fp32 on the same GPU, over steps with
// the same SGD updates applied: losses within 2% (bf16, 8-bit mantissa) /
// 0.5% (fp16); gradients as ExpectReducedGradClose says, within 10% / 3% of
// fp32's in norm where no batch norm is in the way (every activation is
// rounded to the reduced type, and a ReLU flips where rounding crosses 0).
// FP32 (TF32 convolutions) and TF32 (GEMMs too) round only the inputs of
// products, to fp16's 11 significant bits, and keep fp32 activations: held
// to fp16's bounds.
class ReducedPrecisionTest : public ModelGpuTest,
                             public ::testing::WithParamInterface<Precision> {};

TEST_P(ReducedPrecisionTest, LossesAndGradientsMatchFp32) {
  const Precision precision = GetParam();
  const double loss_tol = precision == BF16 ? 2e-2 : 5e-3;
  const double grad_tol = precision == BF16 ? 0.10 : 0.03;
  auto ref = MakeModelIn(0, FP32_STRICT, 1.0);
  auto low = MakeModelIn(0, precision, DynamicLossScale::kDefaultInitial);
  ASSERT_TRUE(ref && low);
  EXPECT_EQ(low->precision(), precision);
  for (int step = 0; step < 5; ++step) {
    const Batch b = RandomBatch(32, ref->input_size(), 5, 200 + step);
    auto r = ref->TrainStep(b.features.data(), b.labels.data(), 32, step);
    auto l = low->TrainStep(b.features.data(), b.labels.data(), 32, step);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_FALSE(l->skipped) << "step " << step;
    EXPECT_NEAR(r->loss, l->loss, loss_tol * (1 + std::abs(r->loss))) << "step " << step;
    for (const ParamInfo& p : ref->params()) {
      const std::string what = p.name + " grad, step " + std::to_string(step);
      ExpectReducedGradClose(*ref, *low, p, grad_tol, what);
      std::printf("%s %s: relative error %.4f\n", Precision_Name(precision).c_str(), what.c_str(),
                  RelativeError(ref->grad(p.id), low->grad(p.id), p.num_elements));
      for (int64_t i = 0; i < p.num_elements; ++i) {
        ref->param(p.id)[i] -= 0.1f * ref->grad(p.id)[i];
        low->param(p.id)[i] = ref->param(p.id)[i];
      }
    }
  }
}

std::string PrecisionParamName(const ::testing::TestParamInfo<Precision>& info) {
  return Precision_Name(info.param);
}

INSTANTIATE_TEST_SUITE_P(BothHalves, ReducedPrecisionTest, ::testing::Values(BF16, FP16),
                         PrecisionParamName);
INSTANTIATE_TEST_SUITE_P(Tf32, ReducedPrecisionTest, ::testing::Values(FP32, TF32),
                         PrecisionParamName);

// FP16 with a scale far too large: the first step overflows, is skipped
// (zero gradients, parameters untouched by the optimizer), the scale halves
// each such step, and training then proceeds with finite gradients that
// match fp32's.
TEST_F(ModelGpuTest, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  const double huge = std::ldexp(1.0, 40);
  auto low = MakeModelIn(0, FP16, huge);
  auto ref = MakeModelIn(0, FP32_STRICT, 1.0);
  ASSERT_TRUE(low && ref);
  const int64_t batch = 32;
  const Batch b = RandomBatch(batch, low->input_size(), 5, 77);
  const DeviceBatch on_device(low->backend(), b);
  ASSERT_TRUE(on_device.ok());
  float* const features = on_device.features;
  const int32_t* const labels = on_device.labels;
  auto device_params = [&](Model& m) {
    std::vector<float> all;
    for (const ParamInfo& p : m.params()) {
      const std::vector<float> v = FromDevice(m, m.device_param(p.id), p.num_elements);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  OptimizerHyperparams hp;
  hp.learning_rate = 0.01f;
  // Device-resident: the skipped step leaves the parameters as they were.
  const std::vector<float> before = device_params(*low);
  ASSERT_TRUE(low->TrainStepOnDevice(features, labels, batch, 0).ok());
  auto first = low->LastStepResult();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->skipped);
  EXPECT_EQ(first->loss_scale, huge);
  EXPECT_EQ(low->loss_scale(), huge / 2);
  hp.step = 1;
  ASSERT_TRUE(low->ApplyOptimizerOnDevice(OptimizerKind::kAdam, hp).ok());
  ASSERT_TRUE(low->Synchronize().ok());
  EXPECT_EQ(device_params(*low), before) << "a skipped step must not move the parameters";

  // TrainStep (the worker's path): skipped steps report zero gradients and
  // lower the scale until one is clean.
  int skipped = 1;
  bool clean = false;
  for (int step = 1; step < 60 && !clean; ++step) {
    auto l = low->TrainStep(b.features.data(), b.labels.data(), batch, step);
    ASSERT_TRUE(l.ok()) << l.status();
    if (l->skipped) {
      ++skipped;
      for (const ParamInfo& p : low->params()) {
        for (int64_t i = 0; i < p.num_elements; ++i) ASSERT_EQ(low->grad(p.id)[i], 0.f);
      }
      continue;
    }
    clean = true;
    EXPECT_LT(l->loss_scale, huge);
    auto r = ref->TrainStep(b.features.data(), b.labels.data(), batch, step);
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r->loss, l->loss, 5e-3 * (1 + std::abs(r->loss)));
    for (const ParamInfo& p : ref->params()) {
      ExpectReducedGradClose(*ref, *low, p, 0.03, p.name + " grad");
    }
  }
  EXPECT_TRUE(clean) << "no clean step after " << skipped << " skipped ones";
  EXPECT_GT(skipped, 1);
  std::printf("fp16 loss scaling: %d skipped steps from 2^40 down to %g\n", skipped,
              low->loss_scale());
}

// Convolutions whose output only a ReLU reads apply it themselves (the
// ReLU's forward does nothing): the strict fp32 GPU matches the CPU, which runs
// them apart, and bf16 (reduced convolutions, the ReLU in the output's
// epilogue) stays within 10% of it in norm (every activation and its
// gradient rounded to bf16; 6.7% seen on an H200), conv1's within 15% (its
// gradient crosses both ReLU masks, which rounding flips near zero; 10.6%
// seen).
constexpr char kConvReluNet[] = R"pb(
  input_shape: [ 8, 8, 3 ]
  num_classes: 5
  layer {
    name: "conv1"
    conv2d { filters: 8 kernel_size: 3 padding: SAME }
  }
  layer {
    name: "relu1"
    relu {}
  }
  layer {
    name: "conv2"
    conv2d { filters: 16 kernel_size: 3 stride: 2 padding: SAME no_bias: true }
  }
  layer {
    name: "relu2"
    relu {}
  }
  layer {
    name: "flat"
    flatten {}
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

TEST_F(ModelGpuTest, ConvolutionWithFusedReluMatchesTheCpuAndFp32) {
  auto make = [](int device, Precision precision) -> std::unique_ptr<Model> {
    ModelOptions options;
    options.device = device;
    options.precision = precision;
    auto model = Model::Create(ParseModelSpec(kConvReluNet), /*seed=*/11, options);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(model).value() : nullptr;
  };
  auto cpu = make(-1, FP32);
  auto gpu = make(0, FP32_STRICT);  // At fp32's tolerance: no TF32.
  auto bf16 = make(0, BF16);
  ASSERT_TRUE(cpu && gpu && bf16);
  for (int step = 0; step < 4; ++step) {
    const Batch b = RandomBatch(32, cpu->input_size(), 5, 300 + step);
    auto c = cpu->TrainStep(b.features.data(), b.labels.data(), 32, step);
    auto g = gpu->TrainStep(b.features.data(), b.labels.data(), 32, step);
    auto h = bf16->TrainStep(b.features.data(), b.labels.data(), 32, step);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_NEAR(c->loss, g->loss, 1e-4 * (1 + std::abs(c->loss))) << "step " << step;
    EXPECT_NEAR(c->loss, h->loss, 2e-2 * (1 + std::abs(c->loss))) << "step " << step;
    for (const ParamInfo& p : cpu->params()) {
      const std::string what = p.name + " grad, step " + std::to_string(step);
      ExpectClose(cpu->grad(p.id), gpu->grad(p.id), p.num_elements, 1e-3, what);
      const double bf16_tol = p.name.rfind("conv1", 0) == 0 ? 0.15 : 0.10;
      ExpectNormClose(cpu->grad(p.id), bf16->grad(p.id), p.num_elements, bf16_tol, what + " bf16");
      for (int64_t i = 0; i < p.num_elements; ++i) {
        cpu->param(p.id)[i] -= 0.1f * cpu->grad(p.id)[i];
        gpu->param(p.id)[i] = bf16->param(p.id)[i] = cpu->param(p.id)[i];
      }
    }
  }
}

}  // namespace
}  // namespace downpour
