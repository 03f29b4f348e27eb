#include "worker/param_exchange.h"

#include <algorithm>
#include <memory>
#include <random>

#include "absl/synchronization/mutex.h"
#include "core/job_validation.h"
#include "core/model.h"
#include "core/shard_map.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

// A transport that acknowledges pushes before delivering them, then, before
// the next pull, delivers the held ones in reverse order, each twice, and
// replays every push of the previous step once more: duplication and
// reordering as retries over several connections produce them.
class DuplicatingReorderingShard final : public ParameterShard {
 public:
  explicit DuplicatingReorderingShard(ParameterShard* inner) : inner_(inner) {}
  using ParameterShard::Pull;
  using ParameterShard::Push;

  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    absl::MutexLock lock(&mu_);
    Held held{request, payload.ToString()};
    held_.push_back(std::move(held));
    return PushResponse();
  }

  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    {
      absl::MutexLock lock(&mu_);
      std::reverse(held_.begin(), held_.end());
      for (const Held& h : held_) {
        for (int copy = 0; copy < 2; ++copy) {
          absl::StatusOr<PushResponse> r = Deliver(h);
          if (!r.ok()) return r.status();
          if (copy == 1) EXPECT_TRUE(r->duplicate());
        }
      }
      for (const Held& h : previous_) {
        absl::StatusOr<PushResponse> r = Deliver(h);
        if (!r.ok()) return r.status();
        EXPECT_TRUE(r->duplicate());
        ++late_duplicates_;
      }
      if (!held_.empty()) previous_ = std::move(held_);
      held_.clear();
    }
    return inner_->Pull(request, deadline, payload);
  }

  int late_duplicates() {
    absl::MutexLock lock(&mu_);
    return late_duplicates_;
  }

 private:
  struct Held {
    PushRequest request;
    std::string bytes;
  };
  absl::StatusOr<PushResponse> Deliver(const Held& h) {
    Payload payload;
    payload.Append(h.bytes.data(), h.bytes.size());
    return inner_->Push(h.request, payload);
  }

  ParameterShard* const inner_;
  absl::Mutex mu_;
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  std::vector<Held> previous_ ABSL_GUARDED_BY(mu_);
  int late_duplicates_ ABSL_GUARDED_BY(mu_) = 0;
};

JobSpec SmallSpec() {
  JobSpec spec;
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(64);
  model->set_num_classes(32);
  model->add_layer()->mutable_dense()->set_units(32);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_dataset()->set_train_files("x");
  spec.mutable_dataset()->set_test_files("x");
  spec.mutable_dataset()->set_batch_size(1);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  spec.set_num_workers(1);
  spec.set_num_shards(2);
  spec.set_steps(5);
  spec.set_partition_bytes(1024);
  spec.set_seed(3);
  ApplyJobDefaults(&spec);
  return spec;
}

// Trains 5 steps of fixed gradients through `wrap` (or directly) and returns
// the pulled parameters.
std::vector<float> Train(bool faulty, int* late_duplicates) {
  const JobSpec spec = SmallSpec();
  auto params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, 2, spec.partition_bytes());
  EXPECT_TRUE(placed.ok());
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<DuplicatingReorderingShard>> wrappers;
  std::vector<ParameterShard*> shards;
  for (int s = 0; s < 2; ++s) {
    stores.push_back(std::make_unique<ParameterStore>());
    EXPECT_TRUE(stores.back()->AddJob("j", spec, s, *params, *placed).ok());
    wrappers.push_back(std::make_unique<DuplicatingReorderingShard>(stores.back().get()));
    shards.push_back(faulty ? static_cast<ParameterShard*>(wrappers.back().get())
                            : stores.back().get());
  }
  ExchangeOptions options;
  options.job_id = "j";
  options.worker_id = "w";
  options.incarnation = 1;
  options.message_bytes = 2048;  // Several messages per shard per step.
  ParameterExchange exchange(options, *placed, shards);
  std::vector<std::vector<float>> grads, values;
  for (const ParamInfo& p : *params) {
    grads.emplace_back(p.num_elements);
    values.emplace_back(p.num_elements);
  }
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.f, 0.1f);
  for (int step = 0; step < 5; ++step) {
    std::vector<const float*> g;
    for (auto& t : grads) {
      for (float& x : t) x = dist(rng);
      g.push_back(t.data());
    }
    EXPECT_TRUE(exchange.Push(step, g).ok());
    std::vector<float*> v;
    for (auto& t : values) v.push_back(t.data());
    EXPECT_TRUE(exchange.Pull(0, step + 1, v, [] { return false; }).ok());
  }
  std::vector<float> out;
  for (auto& t : values) out.insert(out.end(), t.begin(), t.end());
  for (auto& w : wrappers) *late_duplicates += w->late_duplicates();
  return out;
}

TEST(ParameterExchangeTest, DuplicatedAndReorderedPushesApplyExactlyOnce) {
  int late = 0;
  const std::vector<float> clean = Train(false, &late);
  const std::vector<float> faulty = Train(true, &late);
  EXPECT_GT(late, 0);
  ASSERT_EQ(clean.size(), faulty.size());
  for (size_t i = 0; i < clean.size(); ++i) ASSERT_EQ(clean[i], faulty[i]) << i;
}

TEST(ParameterExchangeTest, Float16WireRoundTrips) {
  const float values[] = {0.f, 1.f, -2.5f, 1e-3f, 65504.f, 3e-6f, 1e-8f};
  for (DType dtype : {BFLOAT16, FLOAT16}) {
    char wire[sizeof(values) / 2];
    float back[7];
    EncodeGradients(dtype, values, 7, wire);
    DecodeGradients(dtype, wire, 7, back);
    for (int i = 0; i < 7; ++i) {
      const float tolerance = dtype == BFLOAT16 ? 1.f / 128 : 1.f / 1024;
      EXPECT_NEAR(back[i], values[i], std::abs(values[i]) * tolerance + 6e-8f)
          << DType_Name(dtype) << " " << values[i];
    }
  }
}

}  // namespace
}  // namespace downpour
