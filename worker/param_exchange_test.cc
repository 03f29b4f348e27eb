#include "worker/param_exchange.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "worker/slow_shard_for_tests.h"

namespace downpour {
namespace {

// A gradient of 0.1 and zeroed values for every parameter, and the
// pointers an exchange takes to them.
struct StepBuffers {
  explicit StepBuffers(const std::vector<ParamInfo>& params) {
    for (const ParamInfo& p : params) {
      grads.emplace_back(p.num_elements, 0.1f);
      values.emplace_back(p.num_elements);
      g.push_back(grads.back().data());
      v.push_back(values.back().data());
    }
  }
  std::vector<std::vector<float>> grads, values;
  std::vector<const float*> g;
  std::vector<float*> v;
};

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
          if (copy == 1) {
            EXPECT_TRUE(r->duplicate());
          }
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

// A combined push+pull that applies the push, then times out, as one whose
// pull outlived its deadline would: the exchange must finish with a separate
// push (a duplicate, not applied again) and pull.
class TimingOutPushPullShard final : public ParameterShard {
 public:
  explicit TimingOutPushPullShard(ParameterShard* inner) : inner_(inner) {}
  using ParameterShard::Pull;
  using ParameterShard::Push;

  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    absl::StatusOr<PushResponse> response = inner_->Push(request, payload);
    if (response.ok() && response->duplicate()) ++duplicates_;
    return response;
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    return inner_->Pull(request, deadline, payload);
  }
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& /*pull*/, absl::Time /*deadline*/,
                                            Payload* /*pull_payload*/) override {
    absl::StatusOr<PushResponse> response = inner_->Push(push, push_payload);
    if (!response.ok()) return response.status();
    return absl::DeadlineExceededError("pull timed out");
  }

  int duplicates() const { return duplicates_.load(); }

 private:
  ParameterShard* const inner_;
  std::atomic<int> duplicates_{0};
};

enum class Transport { kClean, kDuplicatingReordering, kTimingOutPushPull };

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

// Trains 5 steps of fixed gradients over `transport`, with a Push then a Pull
// per step or (`combined`) one PushPull — `streamed`: BeginPushPull, each
// tensor announced last first, FinishPushPull — and returns the pulled
// parameters.
// Adds to `duplicates` the pushes the faulty transport saw answered as
// duplicates.
std::vector<float> Train(Transport transport, bool combined, int* duplicates,
                         bool streamed = false) {
  const JobSpec spec = SmallSpec();
  auto params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, 2, spec.partition_bytes());
  EXPECT_TRUE(placed.ok());
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<DuplicatingReorderingShard>> reordering;
  std::vector<std::unique_ptr<TimingOutPushPullShard>> timing_out;
  std::vector<ParameterShard*> shards;
  for (int s = 0; s < 2; ++s) {
    stores.push_back(std::make_unique<ParameterStore>());
    EXPECT_TRUE(stores.back()->AddJob("j", spec, s, *placed).ok());
    reordering.push_back(std::make_unique<DuplicatingReorderingShard>(stores.back().get()));
    timing_out.push_back(std::make_unique<TimingOutPushPullShard>(stores.back().get()));
    switch (transport) {
      case Transport::kClean:
        shards.push_back(stores.back().get());
        break;
      case Transport::kDuplicatingReordering:
        shards.push_back(reordering.back().get());
        break;
      case Transport::kTimingOutPushPull:
        shards.push_back(timing_out.back().get());
        break;
    }
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
    std::vector<float*> v;
    for (auto& t : values) v.push_back(t.data());
    if (combined && streamed) {
      exchange.BeginPushPull(step, g, 0, 0, v, [] { return false; });
      for (int id = static_cast<int>(g.size()) - 1; id >= 0; --id) {
        exchange.GradientReady(id, [] { return absl::OkStatus(); });
      }
      EXPECT_TRUE(exchange.FinishPushPull().ok());
    } else if (combined) {
      EXPECT_TRUE(exchange.PushPull(step, g, 0, 0, v, [] { return false; }).ok());
    } else {
      EXPECT_TRUE(exchange.Push(step, g).ok());
      EXPECT_TRUE(exchange.Pull(0, step + 1, v, [] { return false; }).ok());
    }
  }
  std::vector<float> out;
  for (auto& t : values) out.insert(out.end(), t.begin(), t.end());
  for (auto& w : reordering) *duplicates += w->late_duplicates();
  for (auto& w : timing_out) *duplicates += w->duplicates();
  return out;
}

void ExpectEqual(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << i;
}

TEST(ParameterExchangeTest, DuplicatedAndReorderedPushesApplyExactlyOnce) {
  int late = 0;
  const std::vector<float> clean = Train(Transport::kClean, false, &late);
  const std::vector<float> faulty = Train(Transport::kDuplicatingReordering, false, &late);
  EXPECT_GT(late, 0);
  ExpectEqual(clean, faulty);
}

TEST(ParameterExchangeTest, PushPullEqualsPushThenPull) {
  int duplicates = 0;
  const std::vector<float> separate = Train(Transport::kClean, false, &duplicates);
  ExpectEqual(separate, Train(Transport::kClean, true, &duplicates));
  ExpectEqual(separate, Train(Transport::kDuplicatingReordering, true, &duplicates));
  EXPECT_GT(duplicates, 0);  // The faulty transport replayed pushes; none applied twice.
}

TEST(ParameterExchangeTest, StreamedPushPullEqualsPushThenPull) {
  int duplicates = 0;
  const std::vector<float> separate = Train(Transport::kClean, false, &duplicates);
  ExpectEqual(separate, Train(Transport::kClean, true, &duplicates, /*streamed=*/true));
  ExpectEqual(separate,
              Train(Transport::kDuplicatingReordering, true, &duplicates, /*streamed=*/true));
  ExpectEqual(separate, Train(Transport::kTimingOutPushPull, true, &duplicates, /*streamed=*/true));
  EXPECT_GT(duplicates, 0);
}

// SmallSpec on one shard, validated and placed (a failure aborts the test).
struct OneShardJob {
  explicit OneShardJob(int workers = 1, ConsistencySpec::Mode mode = ConsistencySpec::ASYNC) {
    spec = SmallSpec();
    spec.set_num_shards(1);
    spec.set_num_workers(workers);
    spec.mutable_consistency()->set_mode(mode);
    params = ValidateJobSpec(spec).value();
    placed = PlacePartitions(params, 1, spec.partition_bytes()).value();
  }
  JobSpec spec;
  std::vector<ParamInfo> params;
  std::vector<PartitionPlacement> placed;
};

// Job "j", worker "w": each partition a message of its own.
ExchangeOptions OnePartitionAMessage() {
  ExchangeOptions options;
  options.job_id = "j";
  options.worker_id = "w";
  options.incarnation = 1;
  options.message_bytes = 1024;
  return options;
}

// Passes calls to a store, counting the pushes that reach it and recording
// how many calls are inside at once; each call takes `delay` first.
class ObservingShard final : public ParameterShard {
 public:
  explicit ObservingShard(ParameterShard* inner, absl::Duration delay = absl::ZeroDuration())
      : inner_(inner), delay_(delay) {}
  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    Inside inside(this, /*push=*/true);
    return inner_->Push(request, payload);
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    Inside inside(this, /*push=*/false);
    return inner_->Pull(request, deadline, payload);
  }
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload) override {
    Inside inside(this, /*push=*/true);
    return inner_->PushPull(push, push_payload, pull, deadline, pull_payload);
  }
  int pushes() const { return pushes_.load(); }
  // The most calls inside at once since the last call of this.
  int TakeMost() { return most_.exchange(0); }

 private:
  struct Inside {
    Inside(ObservingShard* shard, bool push) : shard(shard) {
      if (push) ++shard->pushes_;
      const int now = ++shard->inside_;
      int most = shard->most_.load();
      while (now > most && !shard->most_.compare_exchange_weak(most, now)) {
      }
      if (shard->delay_ > absl::ZeroDuration()) absl::SleepFor(shard->delay_);
    }
    ~Inside() { --shard->inside_; }
    ObservingShard* shard;
  };
  ParameterShard* const inner_;
  const absl::Duration delay_;
  std::atomic<int> pushes_{0};
  std::atomic<int> inside_{0};
  std::atomic<int> most_{0};
};

// The window bounds the messages in flight, whatever the threads (one more
// may run: the lowest not finished); moved between steps, the next step
// keeps to it.
TEST(ParameterExchangeTest, TheWindowBoundsTheMessagesInFlight) {
  const OneShardJob job;
  ParameterStore store;
  ASSERT_TRUE(store.AddJob("j", job.spec, 0, job.placed).ok());
  ObservingShard shard(&store, absl::Milliseconds(30));
  ExchangeOptions options = OnePartitionAMessage();
  options.max_inflight = 8;
  ParameterExchange exchange(options, job.placed, {&shard});
  EXPECT_EQ(exchange.window(), 8);
  StepBuffers buffers(job.params);
  const auto never = [] { return false; };
  const auto step = [&](int s) {
    exchange.BeginPushPull(s, buffers.g, 0, 0, buffers.v, never);
    for (int id = static_cast<int>(buffers.g.size()) - 1; id >= 0; --id) {
      exchange.GradientReady(id, [] { return absl::OkStatus(); });
    }
    // The caller helps with the queue while it waits: it counts too.
    ASSERT_TRUE(exchange.AwaitTensors({0}).ok());
    ASSERT_TRUE(exchange.FinishPushPull().ok());
  };
  step(0);
  EXPECT_GT(shard.TakeMost(), 2);
  exchange.SetWindow(2);
  EXPECT_EQ(exchange.window(), 2);
  step(1);
  EXPECT_LE(shard.TakeMost(), 3);
  ASSERT_TRUE(exchange.Pull(0, 0, buffers.v, never).ok());
  EXPECT_LE(shard.TakeMost(), 3);
  exchange.SetWindow(1000);  // Within the threads.
  EXPECT_EQ(exchange.window(), 8);
  exchange.SetWindow(0);
  EXPECT_EQ(exchange.window(), 1);
  step(2);
  EXPECT_LE(shard.TakeMost(), 2);
}

// Two SYNC workers whose windows (one message) start different messages
// first: each message waits for the other worker's push of it. The lowest
// message not finished may always start, so neither waits for good.
TEST(ParameterExchangeTest, SyncWorkersWithNarrowWindowsNeverWaitOnEachOther) {
  const OneShardJob job(/*workers=*/2, ConsistencySpec::SYNC);
  ParameterStore store;
  ASSERT_TRUE(store.AddJob("j", job.spec, 0, job.placed).ok());
  StepBuffers buffers0(job.params), buffers1(job.params);
  ASSERT_EQ(buffers0.g.size(), 2u);  // Weight (8 messages), bias (1).
  absl::Status finished[2];
  std::thread workers[2];
  for (int rank = 0; rank < 2; ++rank) {
    workers[rank] = std::thread([&, rank] {
      ExchangeOptions options = OnePartitionAMessage();
      options.worker_id = absl::StrCat("w", rank);
      options.rank = rank;
      options.max_inflight = 4;
      options.pull_timeout = absl::Seconds(20);
      ParameterExchange exchange(options, job.placed, {&store});
      exchange.SetWindow(1);
      StepBuffers& buffers = rank == 0 ? buffers0 : buffers1;
      exchange.BeginPushPull(0, buffers.g, 1, 0, buffers.v, [] { return false; });
      // Rank 0 announces the bias (the last message) first, rank 1 the
      // weight (the first eight): their windows hold different messages.
      const int first = rank == 0 ? 1 : 0;
      exchange.GradientReady(first, [] { return absl::OkStatus(); });
      absl::SleepFor(absl::Milliseconds(300));
      exchange.GradientReady(1 - first, [] { return absl::OkStatus(); });
      finished[rank] = exchange.FinishPushPull();
    });
  }
  for (std::thread& worker : workers) worker.join();
  EXPECT_TRUE(finished[0].ok()) << finished[0];
  EXPECT_TRUE(finished[1].ok()) << finished[1];
  EXPECT_EQ(buffers0.values, buffers1.values);
}

// A pull that waits for the worker's own step (SSP with staleness 0) needs
// every message of the step pushed: PushPull pushes them first, so a
// window narrower than the step's messages still completes.
TEST(ParameterExchangeTest, APullWaitingForItsOwnStepCompletesWithANarrowWindow) {
  const OneShardJob job;
  ParameterStore store;
  ASSERT_TRUE(store.AddJob("j", job.spec, 0, job.placed).ok());
  ExchangeOptions options = OnePartitionAMessage();
  options.pull_timeout = absl::Minutes(10);  // A wait for good fails the test's own timeout.
  ParameterExchange exchange(options, job.placed, {&store});
  exchange.SetWindow(1);
  StepBuffers buffers(job.params);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(
        exchange.PushPull(step, buffers.g, 0, step + 1, buffers.v, [] { return false; }).ok());
  }
}

// A SYNC step abandoned mid-backward (its last messages never released)
// does not wait for parameters: the other worker may never push the
// messages this one's wait for, its window held by messages that wait for
// this worker's unreleased ones.
TEST(ParameterExchangeTest, AnAbandonedStepWaitsForNoParameters) {
  const OneShardJob job(/*workers=*/2, ConsistencySpec::SYNC);
  ParameterStore store;
  ASSERT_TRUE(store.AddJob("j", job.spec, 0, job.placed).ok());
  std::vector<ParameterExchange*> exchanges;
  std::vector<std::unique_ptr<ParameterExchange>> owned;
  for (int rank = 0; rank < 2; ++rank) {
    ExchangeOptions options = OnePartitionAMessage();
    options.worker_id = absl::StrCat("w", rank);
    options.rank = rank;
    options.max_inflight = 4;
    options.pull_timeout = absl::Minutes(10);
    owned.push_back(std::make_unique<ParameterExchange>(options, job.placed,
                                                        std::vector<ParameterShard*>{&store}));
    owned.back()->SetWindow(1);
  }
  StepBuffers buffers0(job.params), buffers1(job.params);
  std::atomic<bool> stop_other{false};
  // Rank 1 releases everything: its window holds message 0, which waits
  // for rank 0's message 0, which rank 0 never releases.
  std::thread other([&] {
    owned[1]->BeginPushPull(0, buffers1.g, 1, 0, buffers1.v, [&] { return stop_other.load(); });
    owned[1]->GradientReady(0, [] { return absl::OkStatus(); });
    owned[1]->GradientReady(1, [] { return absl::OkStatus(); });
    (void)owned[1]->FinishPushPull();
  });
  // Rank 0 releases the bias (the last message), whose pull waits for
  // rank 1's, then its backward fails.
  owned[0]->BeginPushPull(0, buffers0.g, 1, 0, buffers0.v, [] { return false; });
  owned[0]->GradientReady(1, [] { return absl::OkStatus(); });
  absl::SleepFor(absl::Milliseconds(100));
  (void)owned[0]->FinishPushPull(/*abandon=*/true);
  stop_other.store(true);
  other.join();
}

// A streamed step's message goes as soon as its tensors are announced,
// before the others are (what overlaps the exchange with backward); one
// whose gradient wait fails fails the step; an abandoned step sends nothing
// it was not told of.
TEST(ParameterExchangeTest, StreamedMessagesGoAsTheirGradientsAreAnnounced) {
  const OneShardJob job;
  ParameterStore store;
  ASSERT_TRUE(store.AddJob("j", job.spec, 0, job.placed).ok());
  ObservingShard shard(&store);
  ExchangeOptions options = OnePartitionAMessage();
  ParameterExchange exchange(options, job.placed, {&shard});
  StepBuffers buffers(job.params);
  const std::vector<const float*>& g = buffers.g;
  const std::vector<float*>& v = buffers.v;
  ASSERT_EQ(g.size(), 2u);  // Weight, bias.
  const auto never = [] { return false; };

  exchange.BeginPushPull(0, g, 0, 0, v, never);
  // The bias (one partition): its message goes while the weight's are
  // still unannounced.
  exchange.GradientReady(1, [] { return absl::OkStatus(); });
  for (int i = 0; i < 1000 && shard.pushes() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(shard.pushes(), 1);
  exchange.GradientReady(0, [] { return absl::OkStatus(); });
  ASSERT_TRUE(exchange.FinishPushPull().ok());
  const int messages = shard.pushes();
  EXPECT_GT(messages, 2);  // The weight's 8 KiB went in 1 KiB messages.

  // A failed wait fails the step, naming it. (Later steps pull without
  // waiting for the worker's pushes: theirs are left incomplete.)
  exchange.BeginPushPull(1, g, 0, 0, v, never);
  exchange.GradientReady(1, [] { return absl::InternalError("the device is gone"); });
  exchange.GradientReady(0, [] { return absl::OkStatus(); });
  const absl::Status failed = exchange.FinishPushPull();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.message().find("the device is gone"), std::string::npos) << failed;

  // Abandoned before any gradient: nothing goes; unannounced without
  // abandoning is an error.
  const int before = shard.pushes();
  exchange.BeginPushPull(2, g, 0, 0, v, never);
  EXPECT_TRUE(exchange.FinishPushPull(/*abandon=*/true).ok());
  exchange.BeginPushPull(2, g, 0, 0, v, never);
  exchange.GradientReady(1, [] { return absl::OkStatus(); });
  EXPECT_EQ(exchange.FinishPushPull().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(shard.pushes(), before + 1);
}

// A streamed step's exchange is timed from its first and its last
// message's gradients to its last message's answer, with that message's
// round trip and its shard's part; a failed step is not counted.
TEST(ParameterExchangeTest, AStreamedStepSaysWhatItsExchangeTookAfterItsGradients) {
  const OneShardJob job;
  ParameterStore store;
  ASSERT_TRUE(store.AddJob("j", job.spec, 0, job.placed).ok());
  SlowShard shard(&store, absl::Milliseconds(30), absl::Milliseconds(30));
  ParameterExchange exchange(OnePartitionAMessage(), job.placed, {&shard});
  StepBuffers buffers(job.params);
  const auto never = [] { return false; };
  EXPECT_EQ(exchange.streamed_seconds().steps, 0);

  // The bias's gradient first, the weight's 100 ms later.
  exchange.BeginPushPull(0, buffers.g, 0, 0, buffers.v, never);
  exchange.GradientReady(1, [] { return absl::OkStatus(); });
  absl::SleepFor(absl::Milliseconds(100));
  exchange.GradientReady(0, [] { return absl::OkStatus(); });
  ASSERT_TRUE(exchange.FinishPushPull().ok());
  const ParameterExchange::StreamedSeconds took = exchange.streamed_seconds();
  EXPECT_EQ(took.steps, 1);
  EXPECT_GE(took.from_first_ready, 0.130);
  EXPECT_GE(took.from_last_ready, 0.030);
  EXPECT_LT(took.from_last_ready, took.from_first_ready - 0.09);
  EXPECT_DOUBLE_EQ(took.last_on_shard, 0.030);
  EXPECT_GE(took.last_round_trip, took.last_on_shard);

  exchange.BeginPushPull(1, buffers.g, 0, 0, buffers.v, never);
  exchange.GradientReady(1, [] { return absl::InternalError("the device is gone"); });
  exchange.GradientReady(0, [] { return absl::OkStatus(); });
  EXPECT_FALSE(exchange.FinishPushPull().ok());
  EXPECT_EQ(exchange.streamed_seconds().steps, 1);
}

// A step stopped after its first message went: by default the rest are
// given up (a part of the step reached the shard); with push_cancelled (a
// draining worker's exchange) every message is still pushed, and only the
// wait for the parameters is given up, so the shard counts the whole step.
TEST(ParameterExchangeTest, AStoppedStepIsPushedWholeWherePushesGoOn) {
  JobSpec spec = SmallSpec();
  spec.set_num_shards(1);
  auto params = ValidateJobSpec(spec);
  ASSERT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, 1, spec.partition_bytes());
  ASSERT_TRUE(placed.ok());
  for (const bool pushes_go_on : {false, true}) {
    SCOPED_TRACE(pushes_go_on ? "pushes go on" : "pushes stop");
    ParameterStore store;
    ASSERT_TRUE(store.AddJob("j", spec, 0, *placed).ok());
    ObservingShard shard(&store);
    ExchangeOptions options = OnePartitionAMessage();
    if (pushes_go_on) options.push_cancelled = [] { return false; };
    ParameterExchange exchange(options, *placed, {&shard});
    StepBuffers buffers(*params);
    const std::vector<const float*>& g = buffers.g;
    const std::vector<float*>& v = buffers.v;
    std::atomic<bool> stopped{false};
    exchange.BeginPushPull(0, g, 0, 0, v, [&stopped] { return stopped.load(); });
    exchange.GradientReady(1, [] { return absl::OkStatus(); });
    for (int i = 0; i < 1000 && shard.pushes() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(shard.pushes(), 1);
    stopped.store(true);
    exchange.GradientReady(0, [] { return absl::OkStatus(); });
    EXPECT_EQ(exchange.FinishPushPull().code(), absl::StatusCode::kCancelled);
    const std::vector<int64_t> steps = store.WorkerSteps("j");
    ASSERT_EQ(steps.size(), 1u);
    if (pushes_go_on) {
      EXPECT_GT(shard.pushes(), 2);  // The weight's 8 KiB in 1 KiB messages too.
      EXPECT_EQ(steps[0], 1);        // The step, whole.
    } else {
      EXPECT_EQ(shard.pushes(), 1);
      EXPECT_EQ(steps[0], 0);  // A part of it.
    }
  }
}

TEST(ParameterExchangeTest, TimedOutPushPullFinishesWithoutApplyingTwice) {
  int duplicates = 0;
  const std::vector<float> separate = Train(Transport::kClean, false, &duplicates);
  ExpectEqual(separate, Train(Transport::kTimingOutPushPull, true, &duplicates));
  EXPECT_GT(duplicates, 0);  // Every fallback push was recognised.
}

// A step that FP16 loss scaling skipped is pushed as skipped: the shards
// apply nothing but count the step, so the final pull (every worker has
// pushed every step) returns instead of waiting for a push that never comes.
TEST(ParameterExchangeTest, SkippedStepCountsWithoutAGradient) {
  const JobSpec spec = SmallSpec();
  auto params = ValidateJobSpec(spec);
  ASSERT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, 2, spec.partition_bytes());
  ASSERT_TRUE(placed.ok());
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<ParameterShard*> shards;
  for (int s = 0; s < 2; ++s) {
    stores.push_back(std::make_unique<ParameterStore>());
    ASSERT_TRUE(stores.back()->AddJob("j", spec, s, *placed).ok());
    shards.push_back(stores.back().get());
  }
  ExchangeOptions options;
  options.job_id = "j";
  options.worker_id = "w";
  options.incarnation = 1;
  options.pull_timeout = absl::Seconds(5);
  ParameterExchange exchange(options, *placed, shards);
  std::vector<std::vector<float>> initial, after;
  std::vector<float*> out_initial, out_after;
  for (const ParamInfo& p : *params) {
    initial.emplace_back(p.num_elements);
    after.emplace_back(p.num_elements);
  }
  for (auto& t : initial) out_initial.push_back(t.data());
  for (auto& t : after) out_after.push_back(t.data());
  ASSERT_TRUE(exchange.Pull(0, 0, out_initial, [] { return false; }).ok());
  // The job's only step, skipped.
  ASSERT_TRUE(exchange.Push(0, {}).ok());
  absl::Status final_pull =
      exchange.Pull(0, /*min_worker_steps=*/1, out_after, [] { return false; });
  ASSERT_TRUE(final_pull.ok()) << final_pull;
  EXPECT_EQ(initial, after);
}

// A shard whose pull answers arrive in 3-byte pieces, as network buffers
// may cut them: elements of every width split across pieces.
class ChoppingShard final : public ParameterShard {
 public:
  explicit ChoppingShard(ParameterShard* inner) : inner_(inner) {}
  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    return inner_->Push(request, payload);
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    Payload whole;
    absl::StatusOr<PullResponse> response = inner_->Pull(request, deadline, &whole);
    auto bytes = std::make_shared<std::string>(whole.ToString());
    *payload = Payload();
    for (size_t at = 0; at < bytes->size(); at += 3) {
      payload->Append(bytes->data() + at, std::min<size_t>(3, bytes->size() - at), bytes);
    }
    return response;
  }

 private:
  ParameterShard* const inner_;
};

// Two shards of `spec`'s job "j", in process, its parameters placed over
// them, their pull answers cut into 3-byte pieces where `chop`.
struct TwoShards {
  TwoShards(const JobSpec& spec, bool chop) {
    absl::StatusOr<std::vector<ParamInfo>> validated = ValidateJobSpec(spec);
    EXPECT_TRUE(validated.ok()) << validated.status();
    if (validated.ok()) params = *std::move(validated);
    absl::StatusOr<std::vector<PartitionPlacement>> placement =
        PlacePartitions(params, 2, spec.partition_bytes());
    EXPECT_TRUE(placement.ok()) << placement.status();
    if (placement.ok()) placed = *std::move(placement);
    for (int s = 0; s < 2; ++s) {
      stores.push_back(std::make_unique<ParameterStore>());
      EXPECT_TRUE(stores.back()->AddJob("j", spec, s, placed).ok());
      choppers.push_back(std::make_unique<ChoppingShard>(stores.back().get()));
      shards.push_back(chop ? static_cast<ParameterShard*>(choppers.back().get())
                            : stores.back().get());
    }
  }
  // The exchange options of a worker of job "j" named `worker_id`.
  static ExchangeOptions Options(const std::string& worker_id = "w") {
    ExchangeOptions options;
    options.job_id = "j";
    options.worker_id = worker_id;
    return options;
  }

  std::vector<ParamInfo> params;
  std::vector<PartitionPlacement> placed;
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<ChoppingShard>> choppers;
  std::vector<ParameterShard*> shards;
};

// Pushes `gradient` (one value per element of every tensor, by position) as
// `dtype` with SGD, and returns the parameters pulled back (through
// ChoppingShard with `chop`).
std::vector<float> PushOnceWithSgd(WireDtype dtype, const std::vector<float>& gradient,
                                   const std::vector<int32_t>& reduced_tensors = {},
                                   bool chop = false) {
  JobSpec spec = SmallSpec();
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  TwoShards two(spec, chop);
  ExchangeOptions options = TwoShards::Options();
  options.gradient_dtype = dtype;
  options.reduced_tensors = reduced_tensors;
  ParameterExchange exchange(options, two.placed, two.shards);
  std::vector<std::vector<float>> values;
  std::vector<const float*> g;
  std::vector<float*> v;
  int64_t at = 0;
  for (const ParamInfo& p : two.params) {
    values.emplace_back(p.num_elements);
    g.push_back(gradient.data() + at);
    at += p.num_elements;
  }
  for (auto& t : values) v.push_back(t.data());
  EXPECT_TRUE(exchange.Push(0, g).ok());
  EXPECT_TRUE(exchange.Pull(0, 1, v, [] { return false; }).ok());
  std::vector<float> out;
  for (auto& t : values) out.insert(out.end(), t.begin(), t.end());
  return out;
}

// Gradients pushed as bf16 are applied as their rounded values: the same as
// float32 gradients rounded beforehand, not as the unrounded ones.
TEST(ParameterExchangeTest, HalfWidthGradientsApplyAsTheirRoundedValues) {
  auto params = ValidateJobSpec(SmallSpec());
  ASSERT_TRUE(params.ok());
  int64_t total = 0;
  for (const ParamInfo& p : *params) total += p.num_elements;
  std::vector<float> raw(total), rounded(total);
  for (int64_t i = 0; i < total; ++i) raw[i] = 1.f + 0.001f * static_cast<float>(i % 97);
  std::vector<char> wire(2 * total);
  EncodeFloats(WireDtype::kBfloat16, raw.data(), total, wire.data());
  DecodeFloats(WireDtype::kBfloat16, wire.data(), total, rounded.data());
  ASSERT_NE(raw, rounded);

  const std::vector<float> as_bf16 = PushOnceWithSgd(WireDtype::kBfloat16, raw);
  ExpectEqual(as_bf16, PushOnceWithSgd(WireDtype::kFloat32, rounded));
  EXPECT_NE(as_bf16, PushOnceWithSgd(WireDtype::kFloat32, raw));
}

// Tensors pulled narrowed (a bf16 job's weights on a GPU) land as the
// shards' values rounded to bf16, the others exactly.
TEST(ParameterExchangeTest, ReducedTensorsArePulledAsTheirBf16RoundedValues) {
  auto params = ValidateJobSpec(SmallSpec());
  ASSERT_TRUE(params.ok());
  ASSERT_GE(params->size(), 2u);
  int64_t total = 0;
  for (const ParamInfo& p : *params) total += p.num_elements;
  std::vector<float> gradient(total);
  for (int64_t i = 0; i < total; ++i) gradient[i] = 0.37f + 0.0013f * static_cast<float>(i % 89);
  const std::vector<float> exact = PushOnceWithSgd(WireDtype::kFloat32, gradient);
  const std::vector<float> narrowed = PushOnceWithSgd(WireDtype::kFloat32, gradient, {0});
  ASSERT_EQ(narrowed.size(), exact.size());
  const int64_t first = (*params)[0].num_elements;
  std::vector<char> wire(2 * first);
  std::vector<float> rounded(first);
  EncodeFloats(WireDtype::kBfloat16, exact.data(), first, wire.data());
  DecodeFloats(WireDtype::kBfloat16, wire.data(), first, rounded.data());
  ASSERT_NE(std::vector<float>(exact.begin(), exact.begin() + first), rounded);
  EXPECT_EQ(std::vector<float>(narrowed.begin(), narrowed.begin() + first), rounded);
  EXPECT_EQ(std::vector<float>(narrowed.begin() + first, narrowed.end()),
            std::vector<float>(exact.begin() + first, exact.end()));
  // The same from answers cut into 3-byte pieces (elements split across
  // network buffers).
  EXPECT_EQ(PushOnceWithSgd(WireDtype::kFloat32, gradient, {0}, /*chop=*/true), narrowed);
  EXPECT_EQ(PushOnceWithSgd(WireDtype::kFloat32, gradient, {}, /*chop=*/true), exact);
}

// INT8 both ways (a SYNC job): the host parameters hold each shard's
// published copy bit for bit, step after step, whether the answers come
// whole or cut into 3-byte pieces (int8 blocks split across buffers).
TEST(ParameterExchangeTest, Int8PullsHoldTheShardsPublishedCopy) {
  for (const bool chop : {false, true}) {
    JobSpec spec = SmallSpec();
    spec.mutable_consistency()->set_mode(ConsistencySpec::SYNC);
    spec.set_gradient_wire_dtype(INT8);
    spec.set_parameter_wire_dtype(INT8);
    TwoShards two(spec, chop);
    ASSERT_FALSE(two.params.empty());
    ExchangeOptions options = TwoShards::Options();
    options.gradient_dtype = WireDtype::kInt8;
    options.parameter_dtype = WireDtype::kInt8;
    options.message_bytes = 2048;
    ParameterExchange exchange(options, two.placed, two.shards);
    StepBuffers worker(two.params);
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.f, 0.1f);
    for (int step = 0; step < 6; ++step) {
      for (auto& t : worker.grads) {
        for (float& x : t) x = dist(rng);
      }
      ASSERT_TRUE(
          exchange.PushPull(step, worker.g, step + 1, 0, worker.v, [] { return false; }).ok());
      // A worker holding no copy gets it whole: what this one holds.
      ExchangeOptions fresh_options = options;
      fresh_options.worker_id = "reader";
      ParameterExchange fresh(fresh_options, two.placed, two.shards);
      StepBuffers reader(two.params);
      ASSERT_TRUE(fresh.Pull(step + 1, 0, reader.v, [] { return false; }).ok());
      EXPECT_EQ(reader.values, worker.values) << "step " << step << " chop " << chop;
      // The shards' own values are within one change's rounding of it.
      StepBuffers exact(two.params);
      ExchangeOptions plain = fresh_options;
      plain.parameter_dtype = WireDtype::kFloat32;
      ParameterExchange plain_exchange(plain, two.placed, two.shards);
      ASSERT_TRUE(plain_exchange.Pull(step + 1, 0, exact.v, [] { return false; }).ok());
      for (size_t t = 0; t < exact.values.size(); ++t) {
        for (size_t i = 0; i < exact.values[t].size(); ++i) {
          EXPECT_NEAR(worker.values[t][i], exact.values[t][i], 2e-3) << t << " " << i;
        }
      }
    }
  }
}

TEST(AutoMessageBytesTest, AboutThirtyTwoMessagesAStepWithinBounds) {
  // The Fashion-MNIST CNN (1.7 MB): the smallest messages.
  EXPECT_EQ(AutoMessageBytes(1686568), 256 << 10);
  // ResNet-18 (45 MB): 32 messages of 1.4 MB.
  EXPECT_EQ(AutoMessageBytes(44691240), 44691240 / 32);
  // A large model: the largest.
  EXPECT_EQ(AutoMessageBytes(int64_t{1} << 32), 4 << 20);
}

}  // namespace
}  // namespace downpour
