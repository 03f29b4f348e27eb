#include "rpc/grpc_status.h"

#include "absl/strings/cord.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

// A shard's divergence reaches the worker as what it was: the mark survives
// the conversion to gRPC's status and back, with its code and message.
TEST(GrpcStatusTest, ADivergedStatusSurvivesTheEdgeBothWays) {
  const absl::Status diverged =
      MarkDiverged(absl::FailedPreconditionError("training diverged at step 4 (found by shard 1)"));
  const grpc::Status wire = ToGrpcStatus(diverged);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(wire.error_message(), diverged.message());
  EXPECT_FALSE(wire.error_details().empty());

  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), diverged.message());
  EXPECT_TRUE(IsDiverged(back));
  EXPECT_EQ(back, diverged);
}

// Every payload travels, not only the marks this project knows.
TEST(GrpcStatusTest, PayloadsTravelWithTheirValues) {
  absl::Status status = absl::UnavailableError("shard restarting");
  status.SetPayload("type.example/retry-after", absl::Cord("2s"));
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(status));
  EXPECT_EQ(back, status);
  EXPECT_FALSE(IsDiverged(back));
}

// An error without payloads sends no details; details from a peer that
// fills them otherwise are dropped, keeping the code and message.
TEST(GrpcStatusTest, PlainErrorsAndForeignDetails) {
  const grpc::Status plain = ToGrpcStatus(absl::NotFoundError("no job j"));
  EXPECT_TRUE(plain.error_details().empty());
  EXPECT_EQ(FromGrpcStatus(plain), absl::NotFoundError("no job j"));

  const grpc::Status foreign(grpc::StatusCode::INTERNAL, "boom", "\xff\xff not a proto");
  EXPECT_EQ(FromGrpcStatus(foreign), absl::InternalError("boom"));
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace downpour
