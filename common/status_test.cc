#include "common/status.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(StatusTest, AnnotateKeepsTheCodeAndTheMarks) {
  const absl::Status annotated =
      Annotate(MarkDiverged(absl::FailedPreconditionError("loss is nan")), "pushing to shard 1");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(annotated.message(), "pushing to shard 1: loss is nan");
  EXPECT_TRUE(IsDiverged(annotated));
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

// The mark, not the words, says a status is a divergence.
TEST(StatusTest, OnlyAMarkedStatusIsADivergence) {
  EXPECT_TRUE(IsDiverged(MarkDiverged(absl::InternalError("step 3: the loss is inf"))));
  EXPECT_FALSE(IsDiverged(absl::InternalError("training diverged at step 3")));
  EXPECT_FALSE(IsDiverged(absl::OkStatus()));
  // An OK status takes no payload: nothing failed.
  EXPECT_TRUE(MarkDiverged(absl::OkStatus()).ok());
  EXPECT_FALSE(IsDiverged(MarkDiverged(absl::OkStatus())));
}

}  // namespace
}  // namespace downpour
