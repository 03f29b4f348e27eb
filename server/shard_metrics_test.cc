#include "server/shard_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "ps/memory_budget.h"

namespace downpour {
namespace {

// A shard that answers as told: pushes of sequence 2 are duplicates, pulls
// send 24 bytes and the sparse rows asked for; everything of job "gone"
// fails.
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
    PullResponse response;
    *response.mutable_sparse() = request.sparse();
    return response;
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

TEST_F(MeasuredShardTest, CountsSparseRowsPushedAndPulled) {
  measured_.AddJob("j");
  PushRequest push;
  push.set_job_id("j");
  push.mutable_request_id()->set_sequence(1);
  SparseRows* first = push.add_sparse();
  for (int64_t id : {1, 2, 3}) first->add_ids(id);
  SparseRows* second = push.add_sparse();
  for (int64_t id : {4, 5}) second->add_ids(id);
  ASSERT_TRUE(measured_.Push(push, Payload()).ok());
  push.mutable_request_id()->set_sequence(2);  // A duplicate: applied before.
  ASSERT_TRUE(measured_.Push(push, Payload()).ok());
  push.mutable_request_id()->set_sequence(3);
  push.set_skipped(true);  // Brings no gradients.
  ASSERT_TRUE(measured_.Push(push, Payload()).ok());
  PullRequest pull;
  pull.set_job_id("j");
  SparseRows* asked = pull.add_sparse();
  for (int64_t id : {7, 8, 9, 10}) asked->add_ids(id);
  Payload pulled;
  ASSERT_TRUE(measured_.Pull(pull, absl::InfiniteFuture(), &pulled).ok());
  EXPECT_TRUE(Has("downpour_shard_sparse_rows_pushed_total{job=\"j\"} 5")) << metrics_.Exposition();
  EXPECT_TRUE(Has("downpour_shard_sparse_rows_pulled_total{job=\"j\"} 4")) << metrics_.Exposition();
  measured_.RemoveJob("j");
  EXPECT_EQ(metrics_.Exposition().find("sparse"), std::string::npos);
}

TEST_F(MeasuredShardTest, ExportsTheMemoryBudget) {
  MemoryBudget budget(1000);
  AddMemoryBudgetMetrics(&budget, &metrics_);
  ASSERT_TRUE(budget.TryReserve(600));
  EXPECT_FALSE(budget.TryReserve(600));
  EXPECT_TRUE(Has("downpour_shard_memory_used_bytes 600")) << metrics_.Exposition();
  EXPECT_TRUE(Has("downpour_shard_memory_limit_bytes 1000"));
  EXPECT_TRUE(Has("downpour_shard_memory_refusals_total 1"));
  budget.Release(600);
  EXPECT_TRUE(Has("downpour_shard_memory_used_bytes 0"));
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
