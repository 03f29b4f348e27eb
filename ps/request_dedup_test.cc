#include "ps/request_dedup.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using Verdict = RequestDedup::Verdict;

RequestKey Key(int64_t sequence, const std::string& worker = "w0", int64_t incarnation = 1) {
  return {worker, incarnation, sequence};
}

Verdict ReserveOk(RequestDedup& dedup, const RequestKey& key) {
  absl::StatusOr<Verdict> verdict = dedup.Reserve(key);
  EXPECT_TRUE(verdict.ok()) << verdict.status();
  return verdict.value_or(Verdict::kDuplicate);
}

TEST(RequestDedupTest, AppliedRequestIsADuplicateAfterwards) {
  RequestDedup dedup;
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kFresh);
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kInFlight);  // A retry overtook it.
  dedup.Settle(Key(1), /*applied=*/true);
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kDuplicate);
  EXPECT_EQ(dedup.Remembered(), 1);
}

TEST(RequestDedupTest, RequestNotAppliedCanBeRetried) {
  RequestDedup dedup;
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kFresh);
  dedup.Settle(Key(1), /*applied=*/false);
  EXPECT_EQ(dedup.Remembered(), 0);
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kFresh);
}

TEST(RequestDedupTest, ReorderedSequencesAreEachFreshOnce) {
  RequestDedup dedup;
  for (int64_t seq : {3, 1, 2}) {
    EXPECT_EQ(ReserveOk(dedup, Key(seq)), Verdict::kFresh) << seq;
    dedup.Settle(Key(seq), true);
  }
  for (int64_t seq : {1, 2, 3}) EXPECT_EQ(ReserveOk(dedup, Key(seq)), Verdict::kDuplicate) << seq;
}

TEST(RequestDedupTest, WorkersAreIndependent) {
  RequestDedup dedup;
  EXPECT_EQ(ReserveOk(dedup, Key(1, "a")), Verdict::kFresh);
  dedup.Settle(Key(1, "a"), true);
  EXPECT_EQ(ReserveOk(dedup, Key(1, "b")), Verdict::kFresh);
}

TEST(RequestDedupTest, NewIncarnationStartsOverAndSupersedesTheOld) {
  RequestDedup dedup;
  EXPECT_EQ(ReserveOk(dedup, Key(5, "w0", 1)), Verdict::kFresh);
  dedup.Settle(Key(5, "w0", 1), true);
  EXPECT_EQ(ReserveOk(dedup, Key(1, "w0", 2)), Verdict::kFresh);
  absl::StatusOr<Verdict> old = dedup.Reserve(Key(6, "w0", 1));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), ::testing::HasSubstr("superseded by incarnation 2"));
  // Settling the old incarnation's request changes nothing.
  dedup.Settle(Key(5, "w0", 1), false);
  dedup.Settle(Key(1, "w0", 2), true);
  EXPECT_EQ(ReserveOk(dedup, Key(1, "w0", 2)), Verdict::kDuplicate);
}

TEST(RequestDedupTest, WindowIsBoundedAndOlderSequencesStayDuplicates) {
  RequestDedup dedup;
  const int total = RequestDedup::kWindow + 100;
  for (int64_t seq = 1; seq <= total; ++seq) {
    ASSERT_EQ(ReserveOk(dedup, Key(seq)), Verdict::kFresh);
    dedup.Settle(Key(seq), true);
  }
  EXPECT_EQ(dedup.Remembered(), RequestDedup::kWindow);
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kDuplicate);  // Below the floor.
  EXPECT_EQ(ReserveOk(dedup, Key(total)), Verdict::kDuplicate);
}

TEST(RequestDedupTest, InFlightRequestsAreNotPruned) {
  RequestDedup dedup;
  ASSERT_EQ(ReserveOk(dedup, Key(1)), Verdict::kFresh);  // Never settled.
  for (int64_t seq = 2; seq <= RequestDedup::kWindow + 10; ++seq) {
    ASSERT_EQ(ReserveOk(dedup, Key(seq)), Verdict::kFresh);
    dedup.Settle(Key(seq), true);
  }
  // The oldest is still in flight, so nothing above it could be pruned
  // either: a retry of it is still told to wait, not that it is applied.
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kInFlight);
  dedup.Settle(Key(1), false);
  EXPECT_EQ(ReserveOk(dedup, Key(1)), Verdict::kFresh);
}

TEST(RequestDedupTest, ExportedWindowsKeepAppliedRequestsDuplicatesAfterImport) {
  RequestDedup dedup;
  for (int64_t seq = 1; seq <= RequestDedup::kWindow + 5; ++seq) {
    ASSERT_EQ(ReserveOk(dedup, Key(seq, "a")), Verdict::kFresh);
    dedup.Settle(Key(seq, "a"), true);
  }
  ASSERT_EQ(ReserveOk(dedup, Key(1, "b", 3)), Verdict::kFresh);  // In flight: not saved.
  RequestDedup restored;
  restored.Import(dedup.Export());
  EXPECT_EQ(ReserveOk(restored, Key(1, "a")), Verdict::kDuplicate);  // Below the floor.
  EXPECT_EQ(ReserveOk(restored, Key(RequestDedup::kWindow + 5, "a")), Verdict::kDuplicate);
  EXPECT_EQ(ReserveOk(restored, Key(RequestDedup::kWindow + 6, "a")), Verdict::kFresh);
  EXPECT_EQ(ReserveOk(restored, Key(1, "b", 3)), Verdict::kFresh);
  EXPECT_EQ(restored.Reserve(Key(1, "b", 2)).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Its incarnation was kept.
}

TEST(RequestDedupTest, EmptyWorkerIdIsRefused) {
  RequestDedup dedup;
  EXPECT_EQ(dedup.Reserve(Key(1, "")).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace downpour
