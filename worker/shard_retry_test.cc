#include "worker/shard_retry.h"

#include <algorithm>
#include <vector>

#include "absl/time/clock.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

const auto kNever = [] { return false; };

// An attempt that answers `answers` in turn (the last one from then on)
// and records the deadlines it was given.
struct Scripted {
  std::vector<absl::Status> answers;
  std::vector<absl::Time> deadlines;
  absl::Status operator()(absl::Time deadline) {
    deadlines.push_back(deadline);
    return answers[std::min(deadlines.size(), answers.size()) - 1];
  }
};

TEST(ShardRetryTest, ErrorsThatPassAreRetriedUntilAnswered) {
  Scripted shard{{absl::UnavailableError("connection refused"), absl::NotFoundError("no job j"),
                  absl::PermissionDeniedError("rank 0 is another node's"),
                  absl::DeadlineExceededError("waiting for worker 1"), absl::OkStatus()}};
  const absl::Status status = CallShardWithRetries(
      "pulling from shard 0", absl::Now() + absl::Seconds(30), absl::Seconds(2), kNever,
      [&](absl::Time deadline) { return shard(deadline); });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(shard.deadlines.size(), 5u);
}

TEST(ShardRetryTest, AnyOtherErrorFailsAtOnceNamingTheCallAndKeepingItsMarks) {
  Scripted shard{{MarkDiverged(absl::FailedPreconditionError("training diverged at step 3"))}};
  const absl::Status status =
      CallShardWithRetries("pushing to shard 1", absl::Now() + absl::Seconds(30), absl::Seconds(2),
                           kNever, [&](absl::Time deadline) { return shard(deadline); });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "pushing to shard 1: training diverged at step 3");
  EXPECT_TRUE(IsDiverged(status));
  EXPECT_EQ(shard.deadlines.size(), 1u);
}

// Each attempt is given a slice, never past the give-up time; the last
// error is the call's once that time has passed.
TEST(ShardRetryTest, AttemptsGetASliceAndTheCallGivesUpInTime) {
  const absl::Time start = absl::Now();
  const absl::Time give_up = start + absl::Milliseconds(300);
  Scripted shard{{absl::DeadlineExceededError("still at version 0")}};
  const absl::Status status = CallShardWithRetries(
      "pulling from shard 0", give_up, absl::Milliseconds(100), kNever, [&](absl::Time deadline) {
        const absl::Status answer = shard(deadline);
        absl::SleepFor(deadline - absl::Now());  // Waits its slice out, as a pull does.
        return answer;
      });
  EXPECT_EQ(status, absl::DeadlineExceededError("pulling from shard 0: still at version 0"));
  ASSERT_GE(shard.deadlines.size(), 3u);
  EXPECT_LE(shard.deadlines[0], start + absl::Milliseconds(150));
  for (absl::Time deadline : shard.deadlines) EXPECT_LE(deadline, give_up);
  EXPECT_EQ(shard.deadlines.back(), give_up);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// A shard that refuses at once is asked again after a pause that grows
// (20, 40, 80 ms ...), not in a busy loop.
TEST(ShardRetryTest, ImmediateRefusalsArePaced) {
  Scripted shard{{absl::UnavailableError("connection refused"),
                  absl::UnavailableError("connection refused"),
                  absl::UnavailableError("connection refused"), absl::OkStatus()}};
  const absl::Time start = absl::Now();
  ASSERT_TRUE(CallShardWithRetries("pushing to shard 0", start + absl::Seconds(30),
                                   absl::Seconds(2), kNever,
                                   [&](absl::Time deadline) { return shard(deadline); })
                  .ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20 + 40 + 80));
  EXPECT_EQ(shard.deadlines.size(), 4u);
}

// Out of time on an error that passes (the connection ended by keepalive):
// the call ended at its deadline, which the error says, with the last answer.
TEST(ShardRetryTest, OutOfTimeOnAPassingErrorIsTheDeadlines) {
  const absl::Status status = CallShardWithRetries(
      "pushing to shard 1", absl::Now() + absl::Milliseconds(100), absl::Seconds(2), kNever,
      [&](absl::Time) { return absl::UnavailableError("recvmsg:Connection timed out"); });
  EXPECT_EQ(status,
            absl::DeadlineExceededError("pushing to shard 1: no answer before the "
                                        "deadline; the last: recvmsg:Connection timed out"));
}

TEST(ShardRetryTest, CancellationEndsTheCallBeforeTheNextAttempt) {
  int attempts = 0;
  const absl::Status status = CallShardWithRetries(
      "pulling from shard 0", absl::Now() + absl::Seconds(30), absl::Seconds(2),
      [&] { return attempts >= 2; },
      [&](absl::Time) {
        ++attempts;
        return absl::UnavailableError("connection refused");
      });
  EXPECT_EQ(status, absl::CancelledError("job ended"));
  EXPECT_EQ(attempts, 2);
}

}  // namespace
}  // namespace downpour
