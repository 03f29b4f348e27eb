#include "control/scheduler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_validation.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace control {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Action = ScheduleDecision::Action;

JobStatus Job(const std::string& id, JobState state, int workers, int shards) {
  JobStatus job;
  job.set_id(id);
  job.set_state(state);
  *job.mutable_spec() = SmallMlpJob(workers, shards);
  ApplyJobDefaults(job.mutable_spec());
  return job;
}

NodeInfo Node(const std::string& id, NodeRole role) {
  NodeInfo node;
  node.set_id(id);
  node.set_role(role);
  return node;
}

TEST(SchedulerTest, StartsPendingJobsInOrderOnFreeWorkers) {
  JobStatus first = Job("first", PENDING, 2, 1);
  JobStatus second = Job("second", PENDING, 1, 1);
  std::vector<ScheduleDecision> decisions = SchedulePending(
      {&first, &second}, {Node("s", SHARD), Node("w1", WORKER), Node("w2", WORKER)});
  ASSERT_EQ(decisions.size(), 2u);
  EXPECT_EQ(decisions[0].action, Action::kStart);
  EXPECT_THAT(decisions[0].placement.worker_nodes(), ElementsAre("w1", "w2"));
  EXPECT_THAT(decisions[0].placement.shard_nodes(), ElementsAre("s"));
  EXPECT_EQ(decisions[0].placement.partitions_size(), 4);  // 2 weights, 2 biases.
  // Both workers went to the first job.
  EXPECT_EQ(decisions[1].action, Action::kWait);
  EXPECT_THAT(decisions[1].message, HasSubstr("waiting for 1 free workers (0 free of 2 alive)"));
}

TEST(SchedulerTest, RunningJobsKeepTheirWorkersAndLoadTheirShards) {
  JobStatus running = Job("running", RUNNING, 1, 1);
  running.mutable_placement()->add_worker_nodes("w1");
  running.mutable_placement()->add_shard_nodes("s1");
  JobStatus pending = Job("pending", PENDING, 1, 1);
  std::vector<ScheduleDecision> decisions = SchedulePending(
      {&running, &pending},
      {Node("s1", SHARD), Node("s2", SHARD), Node("w1", WORKER), Node("w2", WORKER)});
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].job_id, "pending");
  EXPECT_EQ(decisions[0].action, Action::kStart);
  EXPECT_THAT(decisions[0].placement.worker_nodes(), ElementsAre("w2"));
  EXPECT_THAT(decisions[0].placement.shard_nodes(), ElementsAre("s2"));  // The less loaded.
}

TEST(SchedulerTest, WaitsForShards) {
  JobStatus job = Job("j", PENDING, 1, 2);
  std::vector<ScheduleDecision> decisions =
      SchedulePending({&job}, {Node("s", SHARD), Node("w", WORKER)});
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].action, Action::kWait);
  EXPECT_THAT(decisions[0].message, HasSubstr("2 shards (1 alive)"));
}

TEST(SchedulerTest, FailsAJobThatCannotBePlaced) {
  // More shards than the model has partitions (a job stored by a coordinator
  // that did not check).
  JobStatus job = Job("j", PENDING, 1, 5);
  std::vector<ScheduleDecision> decisions =
      SchedulePending({&job}, {Node("s1", SHARD), Node("s2", SHARD), Node("s3", SHARD),
                               Node("s4", SHARD), Node("s5", SHARD), Node("w", WORKER)});
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].action, Action::kFail);
  EXPECT_FALSE(decisions[0].message.empty());
}

}  // namespace
}  // namespace control
}  // namespace downpour
