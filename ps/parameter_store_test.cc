#include "ps/parameter_store.h"

#include <atomic>
#include <limits>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/lr_schedule.h"
#include "ps/parameter_store_fixture.h"
#include "ps/request_dedup.h"

namespace downpour {
namespace store_test {
namespace {

TEST_F(ParameterStoreTest, HostsOnlyThisShardsPartitionsWithInitialValues) {
  AddJob(Spec(ConsistencySpec::SYNC, 1));
  // Idempotent.
  EXPECT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 1), 0, Placements()).ok());

  absl::StatusOr<PullResponse> response = store_.Pull(MakePull({}), Soon());
  ASSERT_TRUE(response.ok()) << response.status();
  std::map<Key, Pulled> pulled = Decode(*response);
  ASSERT_EQ(pulled.size(), 3u);
  ExpectNear(pulled[{0, 0}].values, Initial(0, 0, 3));
  ExpectNear(pulled[{0, 1}].values, Initial(0, 3, 3));
  ExpectNear(pulled[{1, 0}].values, {1.f, 1.f});
  EXPECT_EQ((pulled[{0, 0}].version), 0);

  absl::StatusOr<PullResponse> missing = store_.Pull(MakePull({{1, 1}}), Soon());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("1/1"));
}

TEST_F(ParameterStoreTest, RejectsBadPlacement) {
  std::vector<PartitionPlacement> placements = Placements();
  placements[0].set_num_elements(100);
  absl::Status status = store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 1), 0, placements);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("partition 0/0"));
  // The spec is validated as the coordinator validates it (one rule set).
  status = store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 0), 0, Placements());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("job job-1: num_workers must be at least 1"));
  status = store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2, 2), 0, Placements());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("consistency.backup_workers"));
  EXPECT_EQ(store_.Pull(MakePull({}), Soon()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ParameterStoreTest, SyncAppliesOneAveragedUpdateOnceAllWorkersPushed) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  const std::vector<float> g0 = {1.f, 2.f, 3.f};
  const std::vector<float> g1 = {3.f, -2.f, 0.5f};

  PushOk(MakePush(0, 1, 0, {{{0, 0}, g0}}));
  Pulled after_one = PullOne({0, 0});
  EXPECT_EQ(after_one.version, 0);
  ExpectNear(after_one.values, Initial(0, 0, 3));

  // A second push of the same rank for the same step changes nothing.
  PushOk(MakePush(0, 2, 0, {{{0, 0}, g1}}));
  EXPECT_EQ(PullOne({0, 0}).version, 0);

  PushOk(MakePush(1, 1, 0, {{{0, 0}, g1}}));
  Pulled after_two = PullOne({0, 0}, 1);
  EXPECT_EQ(after_two.version, 1);
  std::vector<float> expected = Initial(0, 0, 3);
  for (int i = 0; i < 3; ++i) expected[i] -= 0.1f * (g0[i] + g1[i]) / 2;
  ExpectNear(after_two.values, expected);
  // Other partitions untouched.
  EXPECT_EQ(PullOne({0, 1}).version, 0);
}

TEST_F(ParameterStoreTest, SyncRejectsPushesAheadOfTheVersion) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  absl::StatusOr<PushResponse> ahead = store_.Push(MakePush(0, 1, 1, {{{0, 0}, {1, 1, 1}}}));
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ahead.status().message(), HasSubstr("0/0"));
  // The rejected request id is not burnt: resent for the right step, it applies.
  PushResponse response = PushOk(MakePush(0, 1, 0, {{{0, 0}, {1, 1, 1}}}));
  EXPECT_FALSE(response.duplicate());
}

TEST_F(ParameterStoreTest, PullBlocksUntilMinVersionAndTimesOut) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  absl::Notification done;
  Pulled pulled;
  std::thread waiter([&] {
    pulled = PullOne({0, 0}, 1);
    done.Notify();
  });
  PushOk(MakePush(0, 1, 0, {{{0, 0}, {1, 1, 1}}}));
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  PushOk(MakePush(1, 1, 0, {{{0, 0}, {1, 1, 1}}}));
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(pulled.version, 1);

  const absl::Time start = absl::Now();
  absl::StatusOr<PullResponse> late =
      store_.Pull(MakePull({{0, 0}}, 2), absl::Now() + absl::Milliseconds(50));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.status().message(),
              HasSubstr("job job-1: partition 0/0 still at version 1 < 2"));
  EXPECT_THAT(late.status().message(), HasSubstr("a worker may be down"));
}

TEST_F(ParameterStoreTest, BackupWorkerAppliesAfterFirstPushAndIgnoresTheLateOne) {
  AddJob(Spec(ConsistencySpec::SYNC, 2, /*backup_workers=*/1));
  PushOk(MakePush(0, 1, 0, {{{0, 0}, {1, 2, 3}}}));
  std::vector<float> expected = Initial(0, 0, 3);
  for (int i = 0; i < 3; ++i) expected[i] -= 0.1f * (i + 1);
  Pulled after = PullOne({0, 0}, 1);
  EXPECT_EQ(after.version, 1);
  ExpectNear(after.values, expected);

  PushResponse late = PushOk(MakePush(1, 1, 0, {{{0, 0}, {100, 100, 100}}}));
  EXPECT_FALSE(late.duplicate());
  Pulled still = PullOne({0, 0});
  EXPECT_EQ(still.version, 1);
  ExpectNear(still.values, expected);
}

TEST_F(ParameterStoreTest, AStragglerTheBackupsReplacedCountsTheStepsItsJobCompleted) {
  AddJob(Spec(ConsistencySpec::SYNC, 2, /*backup_workers=*/1));
  for (int64_t step = 0; step < 3; ++step) {
    PushOk(
        MakePush(0, step + 1, step, {{{0, 0}, {1, 2, 3}}, {{0, 1}, {1, 2, 3}}, {{1, 0}, {1, 2}}}));
  }
  // Rank 1 pushed none of the three (it skipped to the job's step, as a
  // left-behind worker does): the shard vouches for them all the same.
  EXPECT_THAT(store_.WorkerSteps(kJob), ::testing::ElementsAre(3, 3));
}

TEST_F(ParameterStoreTest, AsyncAppliesEachPushOnArrival) {
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  PushOk(MakePush(0, 1, 0, {{{1, 0}, {1, 2}}}));
  Pulled one = PullOne({1, 0});
  EXPECT_EQ(one.version, 1);
  ExpectNear(one.values, {0.9f, 0.8f});
  PushOk(MakePush(1, 1, 0, {{{1, 0}, {1, 1}}}));
  PushOk(MakePush(0, 2, 5, {{{1, 0}, {1, 1}}}));
  Pulled three = PullOne({1, 0});
  EXPECT_EQ(three.version, 3);
  ExpectNear(three.values, {0.7f, 0.6f});
}

TEST_F(ParameterStoreTest, MemoryBytesCountsValuesAndOptimizerSlots) {
  EXPECT_EQ(store_.MemoryBytes(kJob), 0);
  // 8 elements on this shard (Placements): values only with SGD.
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  EXPECT_EQ(store_.MemoryBytes(kJob), 8 * 4);
  store_.DropJob(kJob);
  EXPECT_EQ(store_.MemoryBytes(kJob), 0);
  // Adam: values, m and v.
  AddJob(Spec(ConsistencySpec::ASYNC, 2, 0, OptimizerSpec::ADAM));
  EXPECT_EQ(store_.MemoryBytes(kJob), 3 * 8 * 4);
}

TEST_F(ParameterStoreTest, DuplicateRequestIsAppliedOnce) {
  AddJob(Spec(ConsistencySpec::ASYNC, 1));
  const PushRequest request = MakePush(0, 1, 0, {{{1, 0}, {1, 1}}});
  EXPECT_FALSE(PushOk(request).duplicate());
  EXPECT_TRUE(PushOk(request).duplicate());
  Pulled pulled = PullOne({1, 0});
  EXPECT_EQ(pulled.version, 1);
  ExpectNear(pulled.values, {0.9f, 0.9f});
}

TEST_F(ParameterStoreTest, ReorderedSequencesAreEachAppliedOnce) {
  AddJob(Spec(ConsistencySpec::ASYNC, 1));
  for (int64_t seq : {3, 1, 2}) {
    EXPECT_FALSE(PushOk(MakePush(0, seq, 0, {{{1, 0}, {1, 1}}})).duplicate()) << seq;
  }
  for (int64_t seq : {1, 2, 3}) {
    EXPECT_TRUE(PushOk(MakePush(0, seq, 0, {{{1, 0}, {1, 1}}})).duplicate()) << seq;
  }
  EXPECT_EQ(PullOne({1, 0}).version, 3);

  // A restarted worker (new incarnation) starts its sequences over; its old
  // incarnation is refused.
  EXPECT_FALSE(PushOk(MakePush(0, 1, 0, {{{1, 0}, {1, 1}}}, "w0", 2)).duplicate());
  EXPECT_EQ(store_.Push(MakePush(0, 4, 0, {{{1, 0}, {1, 1}}}, "w0", 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PullOne({1, 0}).version, 4);
}

TEST_F(ParameterStoreTest, DedupMemoryIsBoundedAndOldSequencesStayDuplicates) {
  AddJob(Spec(ConsistencySpec::ASYNC, 1));
  const int total = RequestDedup::kWindow + 100;
  for (int64_t seq = 1; seq <= total; ++seq) {
    ASSERT_FALSE(PushOk(MakePush(0, seq, 0, {{{1, 0}, {0, 0}}})).duplicate());
  }
  EXPECT_TRUE(PushOk(MakePush(0, 1, 0, {{{1, 0}, {0, 0}}})).duplicate());
  EXPECT_TRUE(PushOk(MakePush(0, total, 0, {{{1, 0}, {0, 0}}})).duplicate());
  EXPECT_EQ(PullOne({1, 0}).version, total);
  EXPECT_LE(store_.RememberedRequests("job-1"), RequestDedup::kWindow);
  EXPECT_GT(store_.RememberedRequests("job-1"), 0);
}

TEST_F(ParameterStoreTest, RefusedJobFailsPushesAndPullsWithTheReason) {
  store_.RefuseJob("other", absl::ResourceExhaustedError("out of memory for 9 GiB"));
  PullRequest pull;
  pull.set_job_id("other");
  auto pulled = store_.Pull(pull, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pulled.status().message().find("out of memory for 9 GiB"), std::string::npos);
  store_.DropJob("other");
  EXPECT_EQ(store_.Pull(pull, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ParameterStoreTest, MinWorkerStepsWaitsForTheSlowestWorker) {
  AddJob(Spec(ConsistencySpec::SSP, 2));
  PushOk(MakePush(0, 1, 0, {{{1, 0}, {0, 0}}}));
  PushOk(MakePush(0, 2, 1, {{{1, 0}, {0, 0}}}));

  absl::StatusOr<PullResponse> timed_out =
      store_.Pull(MakePull({{1, 0}}, 0, 1), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.status().message(), HasSubstr("worker 1 has pushed 0 steps < 1"));

  absl::Notification done;
  std::thread waiter = PullInBackground(MakePull({{1, 0}}, 0, 1), &done);
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  PushOk(MakePush(1, 1, 0, {{{1, 0}, {0, 0}}}));
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
}

// A pull waits for the other workers' steps, never for its caller's own
// (its pushes are in before it pulls; a shard restored from a checkpoint
// counts them from there, and a rank taken over at its last step has
// nothing left to push).
TEST_F(ParameterStoreTest, MinWorkerStepsNeverWaitsForTheCallersOwnSteps) {
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  PushOk(MakePush(1, 1, 0, {{{1, 0}, {0, 0}}}));
  PullRequest own = MakePull({{1, 0}}, 0, 1);
  own.set_worker_rank(0);
  EXPECT_TRUE(store_.Pull(own, absl::Now() + absl::Seconds(10)).ok());
  PullRequest other = MakePull({{1, 0}}, 0, 1);
  other.set_worker_rank(1);
  absl::StatusOr<PullResponse> timed_out = store_.Pull(other, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.status().message(), HasSubstr("worker 0 has pushed 0 steps < 1"));
}

// A rank whose last push is in and which then finishes (absent from then
// on) does not complete the step alone: it waits for the rank that still
// counts and takes the mean of both.
TEST_F(ParameterStoreTest, ARankThatFinishesAfterItsLastPushWaitsForTheOthers) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  const Key key = {0, 0};
  PushOk(MakePush(1, 1, 0, {{key, {1, 1, 1}}}));
  store_.SetWorkers(kJob, {1}, /*rank_nodes=*/{});
  EXPECT_EQ(PullOne(key).version, 0);
  PushOk(MakePush(0, 1, 0, {{key, {3, 3, 3}}}));
  const Pulled after = PullOne(key, 1);
  std::vector<float> expected = Initial(0, 0, 3);
  for (float& v : expected) v -= 0.1f * 2;  // The mean of both.
  ExpectNear(after.values, expected);
}

TEST_F(ParameterStoreTest, SyncStepsGoOnWithoutALostRankWhichCountsAgainFromItsFirstPush) {
  AddJob(Spec(ConsistencySpec::SYNC, 3));
  const Key key = {0, 0};
  // Ranks 0 and 1 have pushed step 0; rank 2's worker is lost: the step
  // completes as soon as the store hears so.
  PushOk(MakePush(0, 1, 0, {{key, {3, 3, 3}}}));
  PushOk(MakePush(1, 1, 0, {{key, {1, 1, 1}}}));
  EXPECT_EQ(PullOne(key).version, 0);
  store_.SetWorkers(kJob, {2}, /*rank_nodes=*/{});
  Pulled after = PullOne(key, 1);
  std::vector<float> expected = Initial(0, 0, 3);
  for (float& v : expected) v -= 0.1f * 2;  // The mean of the two present.
  ExpectNear(after.values, expected);

  // A push from the lost rank (its old worker, still running) brings nothing.
  PushOk(MakePush(2, 1, 1, {{key, {100, 100, 100}}}, "zombie"));
  PushOk(MakePush(0, 2, 1, {{key, {1, 1, 1}}}));
  PushOk(MakePush(1, 2, 1, {{key, {1, 1, 1}}}));
  after = PullOne(key, 2);
  for (float& v : expected) v -= 0.1f;
  ExpectNear(after.values, expected);

  // Taken over: the rank counts again only from its first push (step 3).
  store_.SetWorkers(kJob, {}, /*rank_nodes=*/{});
  PushOk(MakePush(0, 3, 2, {{key, {1, 1, 1}}}));
  PushOk(MakePush(1, 3, 2, {{key, {1, 1, 1}}}));
  EXPECT_EQ(PullOne(key, 3).version, 3);
  PushOk(MakePush(2, 1, 3, {{key, {4, 4, 4}}}, "replacement"));
  PushOk(MakePush(0, 4, 3, {{key, {1, 1, 1}}}));
  PushOk(MakePush(1, 4, 3, {{key, {1, 1, 1}}}));
  after = PullOne(key, 4);
  EXPECT_EQ(after.version, 4);
  for (float& v : expected) v -= 0.1f * (1 + 2);  // Step 2: 1; step 3: (4+1+1)/3.
  ExpectNear(after.values, expected, 1e-5);
  // Step 4 waits for all three again.
  PushOk(MakePush(0, 5, 4, {{key, {1, 1, 1}}}));
  PushOk(MakePush(1, 5, 4, {{key, {1, 1, 1}}}));
  EXPECT_EQ(PullOne(key).version, 4);
  PushOk(MakePush(2, 2, 4, {{key, {1, 1, 1}}}, "replacement"));
  EXPECT_EQ(PullOne(key, 5).version, 5);
}

TEST_F(ParameterStoreTest, OnlyTheNodeHoldingARankPushesForIt) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  const Key key = {0, 0};
  // Not told who holds the ranks yet: any node's push is taken.
  PushOk(MakePush(0, 1, 0, {{key, {1, 1, 1}}}, "w0"));
  store_.SetWorkers(kJob, {}, {"w0", "w1"});
  PushOk(MakePush(1, 1, 0, {{key, {1, 1, 1}}}, "w1#sparse"));  // Another stream of w1.
  EXPECT_EQ(PullOne(key, 1).version, 1);

  // Rank 0 is lost ("" while no one holds it), then taken over by w2: its
  // old worker, back from a partition with a push of step 1 computed before
  // the hand-over, is refused; so is the taker until the shard hears of it,
  // and neither refusal burns the request id.
  store_.SetWorkers(kJob, {0}, {"", "w1"});
  const PushRequest old_push = MakePush(0, 2, 1, {{key, {100, 100, 100}}}, "w0");
  const PushRequest taker_push = MakePush(0, 1, 1, {{key, {3, 3, 3}}}, "w2");
  for (const PushRequest& push : {old_push, taker_push}) {
    absl::StatusOr<PushResponse> refused = store_.Push(push);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(refused.status().message(),
                HasSubstr(absl::StrCat("node ", push.request_id().worker_id(),
                                       " is not worker rank 0 of job job-1")));
  }
  store_.SetWorkers(kJob, {}, {"w2", "w1"});
  EXPECT_EQ(store_.Push(old_push).status().code(), absl::StatusCode::kPermissionDenied);
  // Node w22 is not w2 (only "w2" and "w2#<stream>" are).
  EXPECT_EQ(store_.Push(MakePush(0, 3, 1, {{key, {100, 100, 100}}}, "w22")).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(PushOk(taker_push).duplicate());
  PushOk(MakePush(1, 2, 1, {{key, {1, 1, 1}}}, "w1"));
  std::vector<float> expected = Initial(0, 0, 3);
  for (float& v : expected) v -= 0.1f * 1 + 0.1f * (3 + 1) / 2;
  ExpectNear(PullOne(key, 2).values, expected, 1e-5);

  EXPECT_TRUE(store_.CheckWorkerNode(kJob, 0, "w2").ok());
  // A certificate's node id is compared exactly: "w2#sparse" is another node.
  EXPECT_EQ(store_.CheckWorkerNode(kJob, 0, "w2#sparse").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store_.CheckWorkerNode(kJob, 0, "w0").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store_.CheckWorkerNode(kJob, 7, "w2").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(store_.CheckWorkerNode("other-job", 0, "anyone").ok());
}

TEST_F(ParameterStoreTest, SspBoundIgnoresALostRank) {
  AddJob(Spec(ConsistencySpec::SSP, 2));
  PushOk(MakePush(0, 1, 0, {{{1, 0}, {0, 0}}}));
  absl::Notification done;
  std::thread waiter = PullInBackground(MakePull({{1, 0}}, 0, 1), &done);
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  store_.SetWorkers(kJob, {1}, /*rank_nodes=*/{});
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
}

TEST_F(ParameterStoreTest, ANonFiniteGradientFailsTheJobNamingTheStepAndPartition) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  const Key key = {0, 1};
  PushOk(MakePush(0, 1, 0, {{key, {1, std::nanf(""), 1}}}));
  PushOk(MakePush(1, 1, 0, {{key, {1, 1, 1}}}));
  absl::StatusOr<PullResponse> pulled = store_.Pull(MakePull({key}, 1), Soon());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pulled.status().message(),
              HasSubstr("training diverged at step 0: the workers' gradient for partition 0/1 is "
                        "not finite (found by shard 0)"));
  EXPECT_TRUE(IsDiverged(pulled.status()));
  absl::StatusOr<PushResponse> pushed = store_.Push(MakePush(0, 2, 1, {{key, {1, 1, 1}}}));
  EXPECT_THAT(pushed.status().message(), HasSubstr("training diverged"));
  EXPECT_TRUE(IsDiverged(pushed.status()));

  // ASYNC: the error names the worker whose push brought it.
  store_.DropJob(kJob);
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  const float inf = std::numeric_limits<float>::infinity();
  PushOk(MakePush(1, 1, 4, {{key, {0, 0, inf}}}));
  pulled = store_.Pull(MakePull({key}), Soon());
  EXPECT_THAT(pulled.status().message(),
              HasSubstr("training diverged at step 4: worker rank 1's gradient for partition 0/1"));
  EXPECT_TRUE(IsDiverged(pulled.status()));
}

TEST_F(ParameterStoreTest, PushesOfAnotherStartOfTheJobAreRefused) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2), 0, Placements(), 2).ok());
  PushRequest stale = MakePush(0, 1, 0, {{{0, 0}, {1, 1, 1}}});
  stale.set_attempt(1);
  absl::StatusOr<PushResponse> refused = store_.Push(stale);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("from its start 1"));
  stale.set_attempt(2);
  PushOk(stale);
}

TEST_F(ParameterStoreTest, DropJobWakesWaitersAndForgetsTheJob) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  absl::Status status;
  absl::Notification done;
  std::thread waiter([&] {
    status = store_.Pull(MakePull({{0, 0}}, 5), absl::Now() + absl::Seconds(30)).status();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  store_.DropJob(kJob);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("job job-1 was dropped"));

  absl::StatusOr<PullResponse> gone = store_.Pull(MakePull({}), Soon());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("job job-1 is not hosted on this shard"));
  store_.DropJob(kJob);  // No-op.
}

TEST_F(ParameterStoreTest, RejectsMalformedPushes) {
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  auto code_and_message = [&](const PushRequest& request) {
    absl::StatusOr<PushResponse> r = store_.Push(request);
    EXPECT_FALSE(r.ok());
    return std::make_pair(r.status().code(), std::string(r.status().message()));
  };

  PushRequest short_payload = MakePush(0, 1, 0, {{{0, 0}, {1, 2, 3}}});
  short_payload.mutable_payload()->resize(8);
  auto [code, message] = code_and_message(short_payload);
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("job-1"));

  PushRequest long_payload = MakePush(0, 2, 0, {{{0, 0}, {1, 2, 3}}});
  long_payload.mutable_payload()->append("xxxx");
  std::tie(code, message) = code_and_message(long_payload);
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("16 bytes, the headers describe 12"));

  std::tie(code, message) = code_and_message(MakePush(0, 3, 0, {{{0, 0}, {1, 2}}}));
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("partition 0/0 has 3 elements, the header says 2"));

  std::tie(code, message) = code_and_message(MakePush(0, 4, 0, {{{1, 1}, {1, 2}}}));
  EXPECT_EQ(code, absl::StatusCode::kNotFound);
  EXPECT_THAT(message, HasSubstr("no partition 1/1"));

  std::tie(code, message) = code_and_message(MakePush(5, 5, 0, {{{1, 0}, {1, 2}}}));
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("worker_rank 5"));

  PushRequest other_job = MakePush(0, 6, 0, {{{1, 0}, {1, 2}}});
  other_job.set_job_id("nope");
  std::tie(code, message) = code_and_message(other_job);
  EXPECT_EQ(code, absl::StatusCode::kNotFound);
  EXPECT_THAT(message, HasSubstr("job nope is not hosted on this shard"));

  // Found by fuzz/push_fuzzer: the worker's step count, step + 1, overflowed.
  std::tie(code, message) =
      code_and_message(MakePush(0, 7, std::numeric_limits<int64_t>::max(), {{{1, 0}, {1, 2}}}));
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("step 9223372036854775807 is out of range"));

  // Nothing was applied, and the rejected ids were not remembered.
  EXPECT_EQ(PullOne({0, 0}).version, 0);
  EXPECT_FALSE(PushOk(MakePush(0, 1, 0, {{{0, 0}, {1, 2, 3}}})).duplicate());
}

// spec/limits.h at the shard's door: the strings a push or pull carries,
// and lists no longer than the job's partitions here, each once (a pull of
// one key listed a million times would make the shard allocate a million
// copies).
TEST_F(ParameterStoreTest, BoundsTheStringsAndListsOfPushesAndPulls) {
  AddJob(Spec(ConsistencySpec::ASYNC, 2));  // Shard 0 holds 0/0, 0/1 and 1/0.
  auto refusal = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    return std::string(status.message());
  };
  EXPECT_EQ(refusal(store_.Pull(MakePull({{0, 0}, {0, 0}}), Soon()).status()),
            "pull from job job-1: partition 0/0 is listed twice");
  EXPECT_EQ(refusal(store_.Pull(MakePull(std::vector<Key>(4, {0, 0})), Soon()).status()),
            "pull from job job-1: keys has 4 entries; this shard holds 3 of the job");
  PullRequest fp32_reduced = MakePull({{0, 0}});
  fp32_reduced.add_reduced_tensor_ids(0);
  fp32_reduced.set_reduced_dtype(FLOAT32);
  EXPECT_EQ(refusal(store_.Pull(fp32_reduced, Soon()).status()),
            "pull from job job-1: reduced_dtype FLOAT32 is not BFLOAT16 or FLOAT16");
  PullRequest many_reduced = MakePull({{0, 0}});
  many_reduced.set_reduced_dtype(BFLOAT16);
  for (int i = 0; i < 4; ++i) many_reduced.add_reduced_tensor_ids(i);
  EXPECT_EQ(refusal(store_.Pull(many_reduced, Soon()).status()),
            "pull from job job-1: reduced_tensor_ids has 4 entries; this shard holds 3 "
            "partitions of the job");
  PullRequest long_job = MakePull({{0, 0}});
  long_job.set_job_id(std::string(1 << 20, 'j'));
  EXPECT_EQ(refusal(store_.Pull(long_job, Soon()).status()),
            "pull job_id is 1048576 bytes; the limit is 64 bytes");

  const std::vector<Grad> four = {
      {{0, 0}, {1, 2, 3}}, {{0, 0}, {1, 2, 3}}, {{0, 1}, {1, 2, 3}}, {{1, 0}, {1, 2}}};
  EXPECT_EQ(refusal(store_.Push(MakePush(0, 1, 0, four)).status()),
            "push to job job-1: partitions has 4 entries; this shard holds 3 of the job");
  const std::vector<Grad> one = {{{0, 0}, {1, 2, 3}}};
  EXPECT_EQ(refusal(store_.Push(MakePush(0, 2, 0, one, std::string(513, 'w'))).status()),
            "push request_id.worker_id is 513 bytes; the limit is 512 bytes");
  EXPECT_EQ(refusal(store_.Push(MakePush(0, 3, 0, one, "w\n0")).status()),
            "push request_id.worker_id \"w\\n0\" holds a control character");
  PushRequest long_push_job = MakePush(0, 4, 0, one);
  long_push_job.set_job_id(std::string(65, 'j'));
  EXPECT_EQ(refusal(store_.Push(long_push_job).status()),
            "push job_id is 65 bytes; the limit is 64 bytes");
  // Nothing was applied.
  EXPECT_EQ(PullOne({0, 0}).version, 0);
}

TEST_F(ParameterStoreTest, ConcurrentAsyncPushesAreAllApplied) {
  AddJob(Spec(ConsistencySpec::ASYNC, 4));
  std::vector<std::thread> workers;
  constexpr int kPushes = 200;
  for (int rank = 0; rank < 4; ++rank) {
    workers.emplace_back([&, rank] {
      for (int seq = 1; seq <= kPushes; ++seq) {
        PushOk(MakePush(rank, seq, seq - 1,
                        {{{0, 0}, {0.f, 0.f, 0.f}}, {{0, 1}, {0.f, 0.f, 0.f}}, {{1, 0}, {1, 1}}}));
      }
    });
  }
  for (std::thread& t : workers) t.join();
  Pulled bias = PullOne({1, 0}, 4 * kPushes);
  EXPECT_EQ(bias.version, 4 * kPushes);
  // 800 float subtractions of 0.1: rounding adds up.
  ExpectNear(bias.values, {1.f - 0.1f * 4 * kPushes, 1.f - 0.1f * 4 * kPushes}, 1e-2);
  // Every worker has pushed kPushes steps.
  EXPECT_TRUE(store_.Pull(MakePull({}, 0, kPushes), Soon()).ok());
}

TEST_F(ParameterStoreTest, ConcurrentRetriesOfOneRequestApplyItOnce) {
  AddJob(Spec(ConsistencySpec::ASYNC, 1));
  const PushRequest request = MakePush(0, 1, 0, {{{1, 0}, {1, 1}}});
  std::atomic<int> applied{0};
  std::vector<std::thread> retries;
  for (int i = 0; i < 8; ++i) {
    retries.emplace_back([&] {
      if (!PushOk(request).duplicate()) ++applied;
    });
  }
  for (std::thread& t : retries) t.join();
  EXPECT_EQ(applied.load(), 1);
  EXPECT_EQ(PullOne({1, 0}).version, 1);
}

// A push of `step` that FP16 loss scaling skipped: the partitions, no bytes.
PushRequest MakeSkipped(int rank, int64_t sequence, int64_t step, const std::vector<Grad>& grads) {
  PushRequest request = MakePush(rank, sequence, step, grads);
  request.set_skipped(true);
  request.clear_payload();
  return request;
}

TEST_F(ParameterStoreTest, SyncSkippedStepIsNoContributor) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  const std::vector<float> g = {1.f, 2.f, 3.f};
  PushOk(MakePush(0, 1, 0, {{{0, 0}, g}}));
  PushOk(MakeSkipped(1, 1, 0, {{{0, 0}, {0, 0, 0}}}));
  // The step completes with both workers present, and its update is the
  // gradient of the one that brought one, not half of it.
  Pulled pulled = PullOne({0, 0}, 1);
  EXPECT_EQ(pulled.version, 1);
  std::vector<float> expected = Initial(0, 0, 3);
  for (int i = 0; i < 3; ++i) expected[i] -= 0.1f * g[i];
  ExpectNear(pulled.values, expected);
  // Both count as having pushed step 0.
  EXPECT_TRUE(store_.Pull(MakePull({{0, 0}}, 0, 1), Soon()).ok());
}

TEST_F(ParameterStoreTest, SyncStepEveryWorkerSkippedAdvancesWithoutAnUpdate) {
  JobSpec spec = Spec(ConsistencySpec::SYNC, 2, 0, OptimizerSpec::ADAM);
  // The rate halves every step, so the update below tells progress 1 (lr
  // 0.05) from a progress that counted updates (0: lr 0.1).
  spec.mutable_optimizer()->mutable_schedule()->set_kind(LearningRateSchedule::STEP);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_steps(1);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_rate(0.5f);
  AddJob(spec);
  PushOk(MakeSkipped(0, 1, 0, {{{0, 0}, {0, 0, 0}}}));
  PushOk(MakeSkipped(1, 1, 0, {{{0, 0}, {0, 0, 0}}}));
  Pulled skipped = PullOne({0, 0}, 1);
  EXPECT_EQ(skipped.version, 1);
  ExpectNear(skipped.values, Initial(0, 0, 3), 0);

  // The next step is the partition's first update: Adam's t is 1, while the
  // schedule is at step 1 (lr 0.05).
  const std::vector<float> g = {0.5f, -1.f, 2.f};
  PushOk(MakePush(0, 2, 1, {{{0, 0}, g}}));
  PushOk(MakePush(1, 2, 1, {{{0, 0}, g}}));
  std::vector<float> expected = Initial(0, 0, 3);
  std::vector<float> m(3, 0.f), v(3, 0.f);
  float* slots[2] = {m.data(), v.data()};
  kernels::cpu::ApplyOptimizer(OptimizerKind::kAdam,
                               HyperparamsAt(spec.optimizer(), /*progress=*/1, /*update=*/1),
                               g.data(), 3, expected.data(), slots);
  Pulled updated = PullOne({0, 0}, 2);
  EXPECT_EQ(updated.version, 2);
  ExpectNear(updated.values, expected);
  // Adam's first step moves each parameter by about the learning rate.
  EXPECT_NEAR(std::fabs(updated.values[0] - Initial(0, 0, 3)[0]), 0.05, 1e-3);
}

TEST_F(ParameterStoreTest, AsyncSkippedPushCountsTheWorkersStepAndAppliesNothing) {
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  PushOk(MakePush(0, 1, 0, {{{1, 0}, {0, 0}}}));
  // Worker 1's only step was skipped: the final pull (every worker has
  // pushed 1 step) must not wait for a push that never comes.
  PushOk(MakeSkipped(1, 1, 0, {{{1, 0}, {0, 0}}}));
  absl::StatusOr<PullResponse> final_pull =
      store_.Pull(MakePull({{1, 0}}, 0, 1), absl::Now() + absl::Milliseconds(200));
  ASSERT_TRUE(final_pull.ok()) << final_pull.status();
  ExpectNear(Decode(*final_pull)[{1, 0}].values, {1.f, 1.f}, 0);

  PushRequest with_bytes = MakeSkipped(0, 2, 1, {{{1, 0}, {1, 1}}});
  with_bytes.set_payload("12345678");
  absl::StatusOr<PushResponse> rejected = store_.Push(with_bytes);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("the headers describe 0"));
}

// ASYNC: the schedule follows the job's progress (pushes / num_workers), not
// the pushes, so with 2 workers a step decay every step halves the rate
// after both workers' first push, as in SYNC.
TEST_F(ParameterStoreTest, AsyncScheduleFollowsTheJobsProgress) {
  JobSpec spec = Spec(ConsistencySpec::ASYNC, 2);
  spec.mutable_optimizer()->mutable_schedule()->set_kind(LearningRateSchedule::STEP);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_steps(1);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_rate(0.5f);
  AddJob(spec);
  PushOk(MakePush(0, 1, 0, {{{1, 0}, {1, 1}}}));  // Progress 0: lr 0.1.
  PushOk(MakePush(1, 1, 0, {{{1, 0}, {1, 1}}}));  // Still progress 0: lr 0.1.
  PushOk(MakePush(0, 2, 1, {{{1, 0}, {1, 1}}}));  // Progress 1: lr 0.05.
  PushOk(MakePush(1, 2, 1, {{{1, 0}, {1, 1}}}));  // Progress 1: lr 0.05.
  PushOk(MakePush(0, 3, 2, {{{1, 0}, {1, 1}}}));  // Progress 2: lr 0.025.
  const float expected = 1.f - 0.1f - 0.1f - 0.05f - 0.05f - 0.025f;
  Pulled pulled = PullOne({1, 0});
  EXPECT_EQ(pulled.version, 5);
  ExpectNear(pulled.values, {expected, expected});
}

// With push_every a push stands for that many of the worker's steps: one
// push of each of 2 workers pushing every 2 steps is 2 steps of progress.
TEST_F(ParameterStoreTest, AsyncProgressCountsTheStepsEachPushStandsFor) {
  JobSpec spec = Spec(ConsistencySpec::ASYNC, 2);
  spec.mutable_consistency()->set_push_every(2);
  spec.mutable_optimizer()->mutable_schedule()->set_kind(LearningRateSchedule::STEP);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_steps(1);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_rate(0.5f);
  AddJob(spec);
  PushOk(MakePush(0, 1, 1, {{{1, 0}, {1, 1}}}));  // Progress 0: lr 0.1.
  PushOk(MakePush(1, 1, 1, {{{1, 0}, {1, 1}}}));  // Progress 1: lr 0.05.
  PushOk(MakePush(0, 2, 3, {{{1, 0}, {1, 1}}}));  // Progress 2: lr 0.025.
  const float expected = 1.f - 0.1f - 0.05f - 0.025f;
  Pulled pulled = PullOne({1, 0});
  EXPECT_EQ(pulled.version, 3);
  ExpectNear(pulled.values, {expected, expected});
}

class ParameterStoreOptimizerTest : public ::testing::TestWithParam<OptimizerSpec::Kind> {};

TEST_P(ParameterStoreOptimizerTest, MatchesKernelAppliedByHand) {
  JobSpec spec = Spec(ConsistencySpec::SYNC, 2, 0, GetParam());
  spec.mutable_optimizer()->set_weight_decay(0.01f);
  spec.mutable_optimizer()->mutable_schedule()->set_kind(LearningRateSchedule::STEP);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_steps(1);
  spec.mutable_optimizer()->mutable_schedule()->set_decay_rate(0.5f);
  ParameterStore store;
  ASSERT_TRUE(store.AddJob(kJob, spec, 0, Placements()).ok());

  const OptimizerKind kind = OptimizerKindOf(spec.optimizer()).value();
  std::vector<float> param = Initial(0, 3, 3);
  std::vector<std::vector<float>> slots(NumOptimizerSlots(kind), std::vector<float>(3, 0.f));
  std::vector<float*> slot_ptrs;
  for (auto& s : slots) slot_ptrs.push_back(s.data());

  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g0 = {0.5f * step + 1, -1.f, 0.25f};
    const std::vector<float> g1 = {-0.5f, 2.f * step, 0.75f};
    ASSERT_TRUE(store.Push(MakePush(0, step + 1, step, {{{0, 1}, g0}})).ok());
    ASSERT_TRUE(store.Push(MakePush(1, step + 1, step, {{{0, 1}, g1}})).ok());
    std::vector<float> mean(3);
    for (int i = 0; i < 3; ++i) mean[i] = (g0[i] + g1[i]) / 2;
    kernels::cpu::ApplyOptimizer(kind, HyperparamsAt(spec.optimizer(), step, step + 1), mean.data(),
                                 3, param.data(), slot_ptrs.data());
  }
  absl::StatusOr<PullResponse> response = store.Pull(MakePull({{0, 1}}, 3), Soon());
  ASSERT_TRUE(response.ok()) << response.status();
  Pulled pulled = Decode(*response)[{0, 1}];
  EXPECT_EQ(pulled.version, 3);
  ExpectNear(pulled.values, param);
  // And the update really moved the parameters.
  EXPECT_GT(std::fabs(pulled.values[0] - Initial(0, 3, 3)[0]), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, ParameterStoreOptimizerTest,
                         ::testing::Values(OptimizerSpec::SGD, OptimizerSpec::MOMENTUM,
                                           OptimizerSpec::ADAGRAD, OptimizerSpec::ADAM));

}  // namespace
}  // namespace store_test
}  // namespace downpour
