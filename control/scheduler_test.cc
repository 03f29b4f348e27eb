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

// A node with a memory budget on a host whose daemons may use `host` bytes.
NodeInfo Sized(const std::string& id, NodeRole role, int64_t limit, const std::string& hostname,
               int64_t host) {
  NodeInfo node = Node(id, role);
  node.set_memory_limit_bytes(limit);
  node.set_hostname(hostname);
  node.set_host_memory_bytes(host);
  return node;
}

// SmallMlpJob (195 parameters, SGD, SYNC) with its first layer `units` wide.
JobStatus Wide(const std::string& id, JobState state, int64_t units) {
  JobStatus job = Job(id, state, 1, 1);
  job.mutable_spec()->mutable_model()->mutable_layer(0)->mutable_dense()->set_units(units);
  return job;
}

TEST(SchedulerTest, AJobWaitsForMemoryAndTakesTheShardsThatHaveRoom) {
  // 8 -> 1000 -> 3: 12,003 parameters, 96 KB on its shard (value and SYNC
  // sum); about 100 KB on its worker with a batch of 4.
  JobStatus running = Wide("running", RUNNING, 1000);
  JobStatus pending = Wide("pending", PENDING, 1000);
  const int64_t kMiB = 1 << 20;
  std::vector<NodeInfo> nodes = {
      Sized("s1", SHARD, 150 << 10, "a", 64 * kMiB), Sized("s2", SHARD, 0, "b", 64 * kMiB),
      Sized("w1", WORKER, 0, "a", 64 * kMiB), Sized("w2", WORKER, 0, "b", 64 * kMiB)};
  running.mutable_placement()->add_worker_nodes("w1");
  running.mutable_placement()->add_shard_nodes("s1");
  std::vector<ScheduleDecision> decisions = SchedulePending({&running, &pending}, nodes);
  ASSERT_EQ(decisions.size(), 1u);
  // s1 (less loaded than none, but full) is passed over for s2.
  EXPECT_EQ(decisions[0].action, Action::kStart);
  EXPECT_THAT(decisions[0].placement.shard_nodes(), ElementsAre("s2"));
  EXPECT_THAT(decisions[0].placement.worker_nodes(), ElementsAre("w2"));

  // Host b is small: the job waits, saying which limit holds it back.
  nodes[1].set_host_memory_bytes(100 << 10);
  nodes[3].set_host_memory_bytes(100 << 10);
  decisions = SchedulePending({&running, &pending}, nodes);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].action, Action::kWait);
  EXPECT_THAT(decisions[0].message, HasSubstr("waiting for memory: it needs about "));
  // The first node passed over says why: s2, the least loaded, on host b.
  EXPECT_THAT(decisions[0].message,
              HasSubstr("the daemons on host b may hold 80.0 KiB together (80% of its memory)"));
}

// A SYNC rank no free worker took goes to a worker of its job only where a
// second replica of the model fits beside what the node holds.
TEST(SchedulerTest, AWorkerHasRoomForAnotherRankOnlyWithinItsBudget) {
  // 156.6 KiB a replica.
  JobStatus running = Wide("running", RUNNING, 1000);
  running.mutable_placement()->add_worker_nodes("w1");
  running.mutable_placement()->add_shard_nodes("s1");
  const int64_t kMiB = 1 << 20;
  std::vector<NodeInfo> nodes = {Sized("s1", SHARD, 0, "a", 64 * kMiB),
                                 Sized("w1", WORKER, 0, "a", 64 * kMiB)};
  EXPECT_EQ(WhyNoRoomForAnotherRank(running, "w1", {&running}, nodes), std::nullopt);
  // Room for one replica only.
  nodes[1].set_memory_limit_bytes(200 << 10);
  const std::optional<std::string> why = WhyNoRoomForAnotherRank(running, "w1", {&running}, nodes);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("worker w1 may hold 200.0 KiB (its --device_memory_limit)"));
  EXPECT_THAT(*why, HasSubstr("of it taken"));
  EXPECT_THAT(WhyNoRoomForAnotherRank(running, "gone", {&running}, nodes).value_or(""),
              HasSubstr("worker gone takes no new work"));
}

TEST(SchedulerTest, AJobTooLargeForTheNodesEvenIdleIsRefusedNamingTheLimit) {
  // The Fashion-MNIST MLP with a 784 -> 2,000,000 layer: 6.3 GB of weights.
  JobStatus job = Wide("huge", PENDING, 2000000);
  job.mutable_spec()->mutable_model()->set_input_shape(0, 784);
  const int64_t kGiB = int64_t{1} << 30;
  // Two shards and two workers on one 24 GiB host, as the demo runs them.
  const std::vector<NodeInfo> nodes = {
      Sized("s1", SHARD, 0, "box", 24 * kGiB), Sized("s2", SHARD, 0, "box", 24 * kGiB),
      Sized("w1", WORKER, 0, "box", 24 * kGiB), Sized("w2", WORKER, 0, "box", 24 * kGiB)};
  job.mutable_spec()->set_num_workers(2);
  job.mutable_spec()->set_num_shards(2);
  ScheduleOptions saved;
  saved.checkpoints = true;
  absl::Status fits = CheckFits(job.spec(), nodes, saved);
  EXPECT_EQ(fits.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(fits.message(), HasSubstr("the job needs about "));
  EXPECT_THAT(fits.message(), HasSubstr("the daemons on host box may hold 19.2 GiB together"));
  EXPECT_THAT(fits.message(), HasSubstr("num_shards"));
  // The small job fits; too few nodes to tell waits instead.
  EXPECT_TRUE(CheckFits(Wide("small", PENDING, 16).spec(), nodes, saved).ok());
  EXPECT_TRUE(CheckFits(job.spec(), {nodes[0], nodes[2]}, saved).ok());
  // Nodes that say nothing of their memory take anything.
  EXPECT_TRUE(
      CheckFits(job.spec(),
                {Node("s1", SHARD), Node("s2", SHARD), Node("w1", WORKER), Node("w2", WORKER)},
                saved)
          .ok());
}

TEST(SchedulerTest, AJobThatRanBeforeStartsShortHandedAfterTheWait) {
  JobStatus restarting = Job("again", PENDING, 2, 1);
  restarting.set_attempt(1);
  restarting.set_pending_since_ms(1000);
  const std::vector<NodeInfo> nodes = {Node("s", SHARD), Node("w1", WORKER)};
  ScheduleOptions options;
  options.short_start_after_ms = 30000;
  options.now_ms = 30999;
  std::vector<ScheduleDecision> decisions = SchedulePending({&restarting}, nodes, options);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].action, Action::kWait);
  options.now_ms = 31000;
  decisions = SchedulePending({&restarting}, nodes, options);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].action, Action::kStart);
  EXPECT_THAT(decisions[0].placement.worker_nodes(), ElementsAre("w1", ""));
  // A job that never ran waits for all its workers.
  JobStatus fresh = Job("fresh", PENDING, 2, 1);
  decisions = SchedulePending({&fresh}, nodes, options);
  EXPECT_EQ(decisions[0].action, Action::kWait);
}

// Short of workers, a SYNC job's workers will train the missing ranks
// beside their own: it starts only where their replicas fit.
TEST(SchedulerTest, ASyncJobStartsShortHandedOnlyWhereItsWorkersHoldTheMissingRanks) {
  JobStatus restarting = Wide("again", PENDING, 1000);  // 156.6 KiB a replica.
  restarting.mutable_spec()->set_num_workers(3);
  restarting.set_attempt(1);
  const int64_t kMiB = 1 << 20;
  std::vector<NodeInfo> nodes = {Sized("s", SHARD, 0, "a", 64 * kMiB),
                                 Sized("w1", WORKER, 350 << 10, "a", 64 * kMiB)};
  ScheduleOptions options;
  options.short_start_after_ms = 1;
  options.now_ms = 1000;
  // w1 would train all three ranks: room for two replicas only.
  std::vector<ScheduleDecision> decisions = SchedulePending({&restarting}, nodes, options);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].action, Action::kWait);
  EXPECT_THAT(decisions[0].message,
              HasSubstr("started on 1 of 3 workers, each would train up to 3 ranks: worker w1 "
                        "may hold 350.0 KiB"));
  nodes[1].set_memory_limit_bytes(500 << 10);
  decisions = SchedulePending({&restarting}, nodes, options);
  EXPECT_EQ(decisions[0].action, Action::kStart) << decisions[0].message;
  EXPECT_THAT(decisions[0].placement.worker_nodes(), ElementsAre("w1", "", ""));
  // ASYNC deals the missing ranks' data out: one replica.
  restarting.mutable_spec()->mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  nodes[1].set_memory_limit_bytes(200 << 10);
  decisions = SchedulePending({&restarting}, nodes, options);
  EXPECT_EQ(decisions[0].action, Action::kStart);
}

}  // namespace
}  // namespace control
}  // namespace downpour
