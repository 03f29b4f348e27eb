#include "worker/worker_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

// A shard client whose calls fail while `failing` is set (Unavailable, or
// DeadlineExceeded as a pull that waited its slice out), and whose pulls
// bring 40 bytes.
class FakeShard : public ParameterShard {
 public:
  absl::Status failing = absl::OkStatus();

  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest&, const Payload&) override {
    if (!failing.ok()) return failing;
    return PushResponse();
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest&, absl::Time, Payload* payload) override {
    if (!failing.ok()) return failing;
    *payload = Payload();
    payload->Append(bytes_, sizeof(bytes_));
    return PullResponse();
  }
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload) override {
    if (!failing.ok()) return failing;
    return ParameterShard::PushPull(push, push_payload, pull, deadline, pull_payload);
  }

 private:
  char bytes_[40] = {};
};

class MeasuredShardClientTest : public ::testing::Test {
 protected:
  MeasuredShardClientTest() {
    auto fake = std::make_unique<FakeShard>();
    fake_ = fake.get();
    client_ = std::make_unique<MeasuredShardClient>(std::move(fake), &metrics_, "j", 3);
  }

  static PushRequest Push(int64_t sequence) {
    PushRequest push;
    push.mutable_request_id()->set_sequence(sequence);
    return push;
  }
  static PullRequest Pull(int32_t tensor, int64_t min_version) {
    PullRequest pull;
    pull.add_keys()->set_tensor_id(tensor);
    pull.set_min_version(min_version);
    return pull;
  }
  Payload Gradient(size_t bytes) {
    Payload payload;
    payload.Append(gradient_.data(), bytes);
    return payload;
  }
  bool Has(const std::string& line) {
    return metrics_.Exposition().find(line + "\n") != std::string::npos;
  }

  std::string gradient_ = std::string(1000, 'g');
  MetricsRegistry metrics_;
  FakeShard* fake_;
  std::unique_ptr<MeasuredShardClient> client_;
};

TEST_F(MeasuredShardClientTest, TimesAndCountsTheBytesOfEachCall) {
  ASSERT_TRUE(client_->Push(Push(1), Gradient(100)).ok());
  Payload pulled;
  ASSERT_TRUE(client_->Pull(Pull(0, 1), absl::InfiniteFuture(), &pulled).ok());
  ASSERT_TRUE(
      client_->PushPull(Push(2), Gradient(50), Pull(0, 2), absl::InfiniteFuture(), &pulled).ok());
  const std::string text = metrics_.Exposition();
  EXPECT_TRUE(Has("downpour_worker_pushed_bytes_total{job=\"j\",shard=\"3\"} 150")) << text;
  EXPECT_TRUE(Has("downpour_worker_pulled_bytes_total{job=\"j\",shard=\"3\"} 80")) << text;
  // The combined call counts in both histograms.
  EXPECT_TRUE(Has("downpour_worker_push_seconds_count{job=\"j\",shard=\"3\"} 2")) << text;
  EXPECT_TRUE(Has("downpour_worker_pull_seconds_count{job=\"j\",shard=\"3\"} 2")) << text;
  EXPECT_TRUE(Has("downpour_worker_rpc_retries_total{job=\"j\",shard=\"3\"} 0")) << text;
}

TEST_F(MeasuredShardClientTest, ARepeatedFailedCallIsARetry) {
  Payload pulled;
  fake_->failing = absl::UnavailableError("shard gone");
  EXPECT_FALSE(client_->Push(Push(1), Gradient(10)).ok());
  EXPECT_FALSE(client_->Pull(Pull(0, 1), absl::InfiniteFuture(), &pulled).ok());
  EXPECT_FALSE(
      client_->PushPull(Push(2), Gradient(10), Pull(1, 1), absl::InfiniteFuture(), &pulled).ok());
  fake_->failing = absl::OkStatus();
  ASSERT_TRUE(client_->Push(Push(1), Gradient(10)).ok());                        // Retry.
  ASSERT_TRUE(client_->Pull(Pull(0, 1), absl::InfiniteFuture(), &pulled).ok());  // Retry.
  ASSERT_TRUE(client_->Push(Push(2), Gradient(10)).ok());                        // Retry.
  ASSERT_TRUE(client_->Pull(Pull(1, 1), absl::InfiniteFuture(), &pulled).ok());  // Retry.
  ASSERT_TRUE(client_->Push(Push(3), Gradient(10)).ok());                        // New.
  ASSERT_TRUE(client_->Pull(Pull(0, 2), absl::InfiniteFuture(), &pulled).ok());  // New.
  EXPECT_TRUE(Has("downpour_worker_rpc_retries_total{job=\"j\",shard=\"3\"} 4"))
      << metrics_.Exposition();
  // Failed calls are not timed; their bytes went out.
  EXPECT_TRUE(Has("downpour_worker_push_seconds_count{job=\"j\",shard=\"3\"} 3"));
  EXPECT_TRUE(Has("downpour_worker_pushed_bytes_total{job=\"j\",shard=\"3\"} 50"));
}

TEST_F(MeasuredShardClientTest, APullThatWaitedItsSliceOutIsReissuedNotRetried) {
  Payload pulled;
  fake_->failing = absl::DeadlineExceededError("waiting for rank 1");
  EXPECT_FALSE(client_->Pull(Pull(0, 5), absl::InfiniteFuture(), &pulled).ok());
  fake_->failing = absl::OkStatus();
  ASSERT_TRUE(client_->Pull(Pull(0, 5), absl::InfiniteFuture(), &pulled).ok());
  EXPECT_TRUE(Has("downpour_worker_rpc_retries_total{job=\"j\",shard=\"3\"} 0"));
}

TEST(TrainerMetricsTest, MadeOnlyWithARegistryAndAccuracyOnlyForTheEvaluator) {
  const TrainerMetrics none = TrainerMetrics::Create(nullptr, "j", 0, true);
  EXPECT_EQ(none.steps, nullptr);
  EXPECT_EQ(none.step_seconds, nullptr);
  MetricsRegistry metrics;
  const TrainerMetrics rank1 = TrainerMetrics::Create(&metrics, "j", 1, false);
  EXPECT_EQ(rank1.test_accuracy, nullptr);
  rank1.step_seconds->Observe(0.01);
  rank1.input_wait_seconds->Observe(0.001);
  rank1.examples->Increment(64);
  const std::string text = metrics.Exposition();
  for (const char* name :
       {"downpour_worker_step_seconds", "downpour_worker_compute_seconds",
        "downpour_worker_exchange_seconds", "downpour_worker_input_wait_seconds"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " histogram\n"), std::string::npos) << name;
  }
  EXPECT_NE(text.find("downpour_worker_examples_total{job=\"j\"} 64\n"), std::string::npos);
  // The gauges by rank too (a worker may train two ranks of a job).
  rank1.loss->Set(0.5);
  EXPECT_NE(metrics.Exposition().find("downpour_worker_loss{job=\"j\",rank=\"1\"} 0.5\n"),
            std::string::npos)
      << metrics.Exposition();
  EXPECT_NE(TrainerMetrics::Create(&metrics, "j", 0, true).test_accuracy, nullptr);
}

TEST(FailureReasonTest, DivergedOrTheStatusCode) {
  EXPECT_EQ(FailureReason(absl::InternalError("training diverged"), true), "diverged");
  EXPECT_EQ(FailureReason(absl::UnavailableError("shard"), false), "unavailable");
  EXPECT_EQ(FailureReason(absl::DeadlineExceededError("x"), false), "deadline_exceeded");
  MetricsRegistry metrics;
  CountFailure(&metrics, "unavailable");
  CountFailure(&metrics, "unavailable");
  CountFailure(nullptr, "unavailable");
  EXPECT_NE(metrics.Exposition().find("downpour_worker_failures_total{reason=\"unavailable\"} 2\n"),
            std::string::npos);
}

TEST(GpuMemoryMetricsTest, ReadAtEveryScrapeUnderTheDevicesName) {
  MetricsRegistry metrics;
  int64_t used = 100;
  AddGpuMemoryMetrics(&metrics, {1}, {"cuda:1 Test GPU"},
                      [&](int device) -> absl::StatusOr<std::pair<int64_t, int64_t>> {
                        if (device != 1) return absl::NotFoundError("no such device");
                        return std::make_pair(used, int64_t{1000});
                      });
  EXPECT_NE(metrics.Exposition().find(
                "downpour_worker_gpu_memory_used_bytes{device=\"cuda:1 Test GPU\"} 100\n"),
            std::string::npos);
  used = 300;
  const std::string text = metrics.Exposition();
  EXPECT_NE(text.find("downpour_worker_gpu_memory_used_bytes{device=\"cuda:1 Test GPU\"} 300\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("downpour_worker_gpu_memory_total_bytes{device=\"cuda:1 Test GPU\"} 1000\n"),
            std::string::npos);
  MetricsRegistry cpu;
  AddGpuMemoryMetrics(&cpu, {}, {}, nullptr);
  EXPECT_EQ(cpu.Exposition(), "");
}

}  // namespace
}  // namespace downpour
