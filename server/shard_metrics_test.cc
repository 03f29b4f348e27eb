#include "server/shard_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace downpour {
namespace {

// A shard that answers as told: pushes of sequence 2 are duplicates, pulls
// send 24 bytes; everything of job "gone" fails.
class FakeShard : public ParameterShard {
 public:
  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload&) override {
    if (request.job_id() == "gone") return absl::NotFoundError("gone");
    PushResponse response;
    response.set_duplicate(request.request_id().sequence() == 2);
    return response;
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time,
                                    Payload* payload) override {
    if (request.job_id() == "gone") return absl::NotFoundError("gone");
    *payload = Payload();
    payload->Append(bytes_, sizeof(bytes_));
    return PullResponse();
  }

 private:
  char bytes_[24] = {};
};

class MeasuredShardTest : public ::testing::Test {
 protected:
  absl::Status Push(const std::string& job, int64_t sequence, size_t bytes) {
    PushRequest request;
    request.set_job_id(job);
    request.mutable_request_id()->set_sequence(sequence);
    Payload payload;
    payload.Append(gradient_.data(), bytes);
    return measured_.Push(request, payload).status();
  }
  absl::Status Pull(const std::string& job) {
    PullRequest request;
    request.set_job_id(job);
    Payload payload;
    return measured_.Pull(request, absl::InfiniteFuture(), &payload).status();
  }
  bool Has(const std::string& line) {
    return metrics_.Exposition().find(line + "\n") != std::string::npos;
  }

  std::string gradient_ = std::string(1024, 'g');
  FakeShard shard_;
  MetricsRegistry metrics_;
  MeasuredShard measured_{&shard_, &metrics_};
};

TEST_F(MeasuredShardTest, CountsEachHostedJobsTraffic) {
  measured_.AddJob("j");
  ASSERT_TRUE(Push("j", 1, 100).ok());
  ASSERT_TRUE(Push("j", 2, 100).ok());  // A retry, answered as a duplicate.
  ASSERT_TRUE(Pull("j").ok());
  // PushPull goes through both.
  PushRequest push;
  push.set_job_id("j");
  PullRequest pull;
  pull.set_job_id("j");
  Payload push_payload, pulled;
  push_payload.Append(gradient_.data(), 50);
  ASSERT_TRUE(measured_.PushPull(push, push_payload, pull, absl::InfiniteFuture(), &pulled).ok());

  EXPECT_TRUE(Has("downpour_ps_received_bytes_total{job=\"j\"} 250")) << metrics_.Exposition();
  EXPECT_TRUE(Has("downpour_ps_sent_bytes_total{job=\"j\"} 48")) << metrics_.Exposition();
  EXPECT_TRUE(Has("downpour_ps_deduplicated_pushes_total{job=\"j\"} 1"));
  EXPECT_TRUE(Has("downpour_ps_apply_seconds_count{job=\"j\"} 3")) << metrics_.Exposition();
}

TEST_F(MeasuredShardTest, JobsNotHostedLeaveNoSeries) {
  measured_.AddJob("j");
  EXPECT_FALSE(Push("gone", 1, 10).ok());
  EXPECT_FALSE(Pull("gone").ok());
  ASSERT_TRUE(Push("other", 1, 10).ok());  // Not added: passed on, not measured.
  EXPECT_EQ(metrics_.Exposition().find("job=\"other\""), std::string::npos);
  EXPECT_EQ(metrics_.Exposition().find("job=\"gone\""), std::string::npos);
  measured_.RemoveJob("j");
  ASSERT_TRUE(Push("j", 1, 10).ok());
  EXPECT_EQ(metrics_.Exposition(), "");
}

}  // namespace
}  // namespace downpour
