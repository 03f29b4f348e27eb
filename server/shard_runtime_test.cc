#include "server/shard_runtime.h"

#include <memory>
#include <string>
#include <vector>

#include "control/fake_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/node_agent.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kNode[] = "ps@test";

// A job of a small MLP over two shards, as the coordinator places it; this
// shard is `shard`.
Task MakeTask(const std::string& job_id, int shard) {
  Task task;
  task.set_job_id(job_id);
  task.set_rank(shard);
  JobSpec* spec = task.mutable_spec();
  *spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/2);
  ApplyJobDefaults(spec);
  auto params = ValidateJobSpec(*spec);
  EXPECT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, 2, spec->partition_bytes());
  EXPECT_TRUE(placed.ok()) << placed.status();
  Placement* placement = task.mutable_placement();
  placement->add_shard_nodes(kNode);
  placement->add_shard_nodes("ps@other");
  placement->add_worker_nodes("worker@w");
  for (const PartitionPlacement& p : *placed) *placement->add_partitions() = p;
  return task;
}

absl::StatusCode PullCode(ParameterStore& store, const std::string& job) {
  PullRequest pull;
  pull.set_job_id(job);
  return store.Pull(pull, absl::Now() + absl::Seconds(5)).status().code();
}

// The runtime driven as in the daemon: by a node agent's heartbeats, here
// against an in-process coordinator.
class ShardRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeAgent::Options options;
    options.coordinator_name = "fake";
    options.self.set_id(kNode);
    options.self.set_role(SHARD);
    options.self.set_address("127.0.0.1:1");
    auto agent = NodeAgent::Start(options, &coordinator_, [this](const std::vector<Task>& tasks) {
      runtime_.OnTasks(tasks);
    });
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(agent).value();
  }
  void TearDown() override { agent_.reset(); }

  // Sets the shard's tasks and waits for the agent to have handed them over.
  void Tasks(std::vector<Task> tasks) {
    coordinator_.SetTasks(kNode, std::move(tasks));
    ASSERT_TRUE(coordinator_.AwaitHeartbeats(2));
  }
  double Gauge(const std::string& name) { return metrics_.GetGauge(name, "")->value(); }

  ParameterStore store_;
  MetricsRegistry metrics_;
  ShardRuntime runtime_{&store_, /*writer=*/nullptr, &metrics_};
  control::FakeCoordinator coordinator_;
  std::unique_ptr<NodeAgent> agent_;
};

TEST_F(ShardRuntimeTest, HostsItsTasksAndDropsThemWhenTheyEnd) {
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kNotFound);
  const Task task = MakeTask("j", 0);
  Tasks({task});
  EXPECT_THAT(runtime_.HostedJobs(), ElementsAre("j"));
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kOk);
  EXPECT_EQ(Gauge("downpour_ps_jobs"), 1);
  const std::vector<PartitionPlacement> partitions(task.placement().partitions().begin(),
                                                   task.placement().partitions().end());
  EXPECT_EQ(Gauge("downpour_ps_parameter_bytes"), BytesPerShard(partitions, 2)[0]);
  // The job's memory: at least its parameters (Adam's slots come on top).
  EXPECT_GE(metrics_.GetGauge("downpour_ps_memory_bytes", "", {{"job", "j"}})->value(),
            BytesPerShard(partitions, 2)[0]);
  // Pushes and pulls through serving() are measured, per job.
  PullRequest pull;
  pull.set_job_id("j");
  ASSERT_TRUE(runtime_.serving()->Pull(pull, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_NE(metrics_.Exposition().find("downpour_ps_sent_bytes_total{job=\"j\"} " +
                                       std::to_string(BytesPerShard(partitions, 2)[0]) + "\n"),
            std::string::npos)
      << metrics_.Exposition();

  Tasks({});
  EXPECT_TRUE(runtime_.HostedJobs().empty());
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kNotFound);
  EXPECT_EQ(Gauge("downpour_ps_jobs"), 0);
  EXPECT_EQ(Gauge("downpour_ps_parameter_bytes"), 0);
  // The job's own series go with it.
  EXPECT_EQ(metrics_.Exposition().find("job=\"j\""), std::string::npos) << metrics_.Exposition();
}

TEST_F(ShardRuntimeTest, JobItCannotHostIsRefusedWithTheReasonUntilItEnds) {
  Task bad = MakeTask("bad", 0);
  bad.mutable_placement()->mutable_partitions(0)->set_num_elements(1 << 30);
  Task wrong_shard = MakeTask("wrong", 5);  // The job has 2 shards.
  Tasks({bad, wrong_shard});
  EXPECT_TRUE(runtime_.HostedJobs().empty());
  PullRequest pull;
  pull.set_job_id("bad");
  absl::Status refused = store_.Pull(pull, absl::Now() + absl::Seconds(5)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("the shard cannot host job bad"));
  EXPECT_THAT(refused.message(), HasSubstr("is not inside tensor"));
  pull.set_job_id("wrong");
  EXPECT_THAT(store_.Pull(pull, absl::Now() + absl::Seconds(5)).status().message(),
              HasSubstr("shard index 5 is outside the job's 2 shards"));

  Tasks({});
  EXPECT_EQ(PullCode(store_, "bad"), absl::StatusCode::kNotFound);
  EXPECT_EQ(PullCode(store_, "wrong"), absl::StatusCode::kNotFound);
}

TEST_F(ShardRuntimeTest, CoordinatorOutageKeepsTheJobs) {
  Tasks({MakeTask("j", 1)});
  ASSERT_THAT(runtime_.HostedJobs(), ElementsAre("j"));
  coordinator_.SetUp(false);
  ASSERT_TRUE(coordinator_.AwaitHeartbeats(3));
  EXPECT_THAT(runtime_.HostedJobs(), ElementsAre("j"));
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace downpour
