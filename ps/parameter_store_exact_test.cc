// SYNC exact versions (PullRequest.exact_version): a worker killed between
// its pushes of a step to two partitions leaves one a step ahead; the worker
// that takes its rank over pulls the step's version exactly, so it computes
// the step from the parameters the lost worker had, and the job goes on as
// a clean run does.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "ps/parameter_store_fixture.h"

namespace downpour {
namespace store_test {
namespace {

PullRequest ExactPull(std::vector<Key> keys, int64_t version) {
  PullRequest request = MakePull(std::move(keys), version);
  request.set_exact_version(true);
  return request;
}

TEST_F(ParameterStoreTest, AnExactPullGetsAPartitionsPreviousVersionUntilItsNextStepIsPushed) {
  AddJob(Spec(ConsistencySpec::SYNC, 2, 0, OptimizerSpec::ADAM));
  const Pulled initial = PullOne({0, 0});
  // Step 0: both ranks push partition 0/0; rank 1's worker dies before its
  // push of 0/1 and 1/0. 0/0 completes the step, the others wait.
  PushOk(MakePush(0, 1, 0, ShardZeroGrads({{0, 0}}, 0.1f)));
  PushOk(MakePush(1, 1, 0, ShardZeroGrads({{0, 0}}, 0.3f)));
  PushOk(MakePush(0, 2, 0, ShardZeroGrads({{0, 1}, {1, 0}}, 0.1f)));
  const Pulled ahead = PullOne({0, 0});
  ASSERT_EQ(ahead.version, 1);
  ASSERT_NE(ahead.values, initial.values);

  // The taker pulls version 0 exactly: 0/0's values of before the step.
  absl::StatusOr<PullResponse> exact = store_.Pull(ExactPull(kShardZero, 0), Soon());
  ASSERT_TRUE(exact.ok()) << exact.status();
  std::map<Key, Pulled> pulled = Decode(*exact);
  EXPECT_EQ(pulled[Key(0, 0)].version, 0);
  EXPECT_EQ(pulled[Key(0, 0)].values, initial.values);
  EXPECT_EQ(pulled[Key(0, 1)].values, Initial(0, 3, 3));

  // It pushes step 0 whole (the same gradient, computed from the same
  // parameters): 0/0 takes it as late, the others complete the step.
  PushOk(MakePush(1, 1, 0, ShardZeroGrads(kShardZero, 0.3f), "taker"));
  for (const Key& key : kShardZero) EXPECT_EQ(PullOne(key).version, 1);
  EXPECT_EQ(PullOne({0, 0}).values, ahead.values);
  // 0/0 keeps version 0 until some worker pushes its step 1 there.
  EXPECT_TRUE(store_.Pull(ExactPull({{0, 0}}, 0), Soon()).ok());
  PushOk(MakePush(0, 3, 1, ShardZeroGrads({{0, 0}}, 0.1f)));
  absl::StatusOr<PullResponse> gone = store_.Pull(ExactPull({{0, 0}}, 0), Soon());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition) << gone.status();
  EXPECT_NE(gone.status().message().find("no longer keeps its values of version 0"),
            std::string::npos)
      << gone.status();
  // The current version exactly is the live values.
  absl::StatusOr<PullResponse> now = store_.Pull(ExactPull({{0, 1}}, 1), Soon());
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(Decode(*now)[Key(0, 1)].values, PullOne({0, 1}).values);
}

// The faulty run above, to the end of step 0, holds what a clean one does.
TEST_F(ParameterStoreTest, AStepRepeatedByATakerEndsAsTheCleanStep) {
  ParameterStore clean;
  ASSERT_TRUE(
      clean.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2, 0, OptimizerSpec::ADAM), 0, Placements())
          .ok());
  ASSERT_TRUE(clean.Push(MakePush(0, 1, 0, ShardZeroGrads(kShardZero, 0.1f))).ok());
  ASSERT_TRUE(clean.Push(MakePush(1, 1, 0, ShardZeroGrads(kShardZero, 0.3f))).ok());

  AddJob(Spec(ConsistencySpec::SYNC, 2, 0, OptimizerSpec::ADAM));
  PushOk(MakePush(0, 1, 0, ShardZeroGrads(kShardZero, 0.1f)));
  PushOk(MakePush(1, 1, 0, ShardZeroGrads({{0, 0}}, 0.3f)));
  PushOk(MakePush(1, 1, 0, ShardZeroGrads(kShardZero, 0.3f), "taker"));
  for (const Key& key : kShardZero) {
    absl::StatusOr<PullResponse> want = clean.Pull(MakePull({key}, 1), Soon());
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(PullOne(key, 1).values, Decode(*want)[key].values);
  }
}

TEST_F(ParameterStoreTest, AnExactPullIsForSyncDensePartitions) {
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  absl::StatusOr<PullResponse> refused = store_.Pull(ExactPull({{0, 0}}, 0), Soon());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
}

// A restore holds no previous version: the checkpoint's is the only one.
TEST_F(ParameterStoreTest, ARestoredPartitionKeepsNoPreviousVersion) {
  AddJob(Spec(ConsistencySpec::SYNC, 1));
  PushOk(MakePush(0, 1, 0, ShardZeroGrads(kShardZero, 0.1f)));
  ASSERT_TRUE(store_.Pull(ExactPull({{0, 0}}, 0), Soon()).ok());
  ShardSnapshot snapshot;
  snapshot.step = 1;
  snapshot.sync = true;
  for (const Key& key : kShardZero) {
    const Pulled now = PullOne(key);
    PartitionSnapshot partition;
    partition.tensor_id = key.first;
    partition.partition = key.second;
    partition.offset = key == Key(0, 1) ? 3 : 0;
    partition.version = 1;
    partition.values = now.values;
    snapshot.partitions.push_back(partition);
  }
  ASSERT_TRUE(store_.Restore(kJob, snapshot).ok());
  EXPECT_EQ(store_.Pull(ExactPull({{0, 0}}, 0), Soon()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_.Pull(ExactPull({{0, 0}}, 1), Soon()).ok());
}

}  // namespace
}  // namespace store_test
}  // namespace downpour
