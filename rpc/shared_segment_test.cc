#include "rpc/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSize = SharedSegment::kHeaderBytes + 8192;

TEST(SharedSegmentTest, TheShardMapsTheWorkersBytes) {
  absl::StatusOr<std::shared_ptr<SharedSegment>> worker = SharedSegment::Create(kSize);
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<std::shared_ptr<SharedSegment>> shard =
      SharedSegment::Open((*worker)->attach(), kSize);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->size(), kSize);
  std::strcpy((*worker)->data() + SharedSegment::kHeaderBytes, "gradients");
  EXPECT_STREQ((*shard)->data() + SharedSegment::kHeaderBytes, "gradients");
  std::strcpy((*shard)->data() + kSize - 16, "parameters");
  EXPECT_STREQ((*worker)->data() + kSize - 16, "parameters");
  // The worker's end gone, the shard's mapping stays valid.
  worker->reset();
  EXPECT_STREQ((*shard)->data() + SharedSegment::kHeaderBytes, "gradients");
}

TEST(SharedSegmentTest, AWrongTokenIsRefused) {
  absl::StatusOr<std::shared_ptr<SharedSegment>> worker = SharedSegment::Create(kSize);
  ASSERT_TRUE(worker.ok()) << worker.status();
  SharedSegmentAttach attach = (*worker)->attach();
  attach.mutable_token()->back() ^= 1;
  absl::StatusOr<std::shared_ptr<SharedSegment>> shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("attach.token"));
  attach.mutable_token()->pop_back();
  shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("attach.token has 31 bytes"));
}

TEST(SharedSegmentTest, AWrongOrTooLargeSizeIsRefused) {
  absl::StatusOr<std::shared_ptr<SharedSegment>> worker = SharedSegment::Create(kSize);
  ASSERT_TRUE(worker.ok()) << worker.status();
  SharedSegmentAttach attach = (*worker)->attach();
  attach.set_size(kSize + 4096);
  absl::StatusOr<std::shared_ptr<SharedSegment>> shard = SharedSegment::Open(attach, 1 << 20);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("not the segment's size"));
  shard = SharedSegment::Open((*worker)->attach(), kSize - 1);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("attach.size"));
}

// A memfd the way a careless (or hostile) worker would make it: without the
// seals, it could shrink under the shard's mapping.
TEST(SharedSegmentTest, AnUnsealedSegmentIsRefused) {
  const int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kSize), 0);
  std::string token(SharedSegment::kTokenBytes, 't');
  ASSERT_EQ(pwrite(fd, token.data(), token.size(), 0), static_cast<ssize_t>(token.size()));
  SharedSegmentAttach attach;
  attach.set_pid(getpid());
  attach.set_fd(fd);
  attach.set_token(token);
  attach.set_size(kSize);
  absl::StatusOr<std::shared_ptr<SharedSegment>> shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("not sealed against shrinking"));
  // Sealed against growing only: still refused.
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW), 0);
  shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kFailedPrecondition);
  // With every seal it is a segment.
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  shard = SharedSegment::Open(attach, kSize);
  EXPECT_TRUE(shard.ok()) << shard.status();
  close(fd);
}

TEST(SharedSegmentTest, OnlyAMemfdOfALiveProcessIsOpened) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  SharedSegmentAttach attach;
  attach.set_pid(getpid());
  attach.set_fd(pipe_fds[0]);
  attach.set_token(std::string(SharedSegment::kTokenBytes, 't'));
  attach.set_size(kSize);
  absl::StatusOr<std::shared_ptr<SharedSegment>> shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("is not a memfd"));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // A closed descriptor, a process that is not there.
  shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kFailedPrecondition);
  attach.set_pid(std::numeric_limits<int32_t>::max());
  shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("no process"));
  attach.set_pid(-1);
  shard = SharedSegment::Open(attach, kSize);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SharedSegmentTest, RangesOutsideTheSegmentAreRefusedNamingTheFields) {
  absl::StatusOr<std::shared_ptr<SharedSegment>> segment = SharedSegment::Create(kSize);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const SharedSegment& s = **segment;
  EXPECT_TRUE(s.Range(SharedSegment::kHeaderBytes, 8192, "off", "len").ok());
  EXPECT_TRUE(s.Range(kSize, 0, "off", "len").ok());
  const int64_t max = std::numeric_limits<int64_t>::max();
  for (auto [offset, length] :
       std::vector<std::pair<int64_t, int64_t>>{{SharedSegment::kHeaderBytes, 8193},
                                                {0, 16},  // The token.
                                                {-1, 1},
                                                {SharedSegment::kHeaderBytes, -1},
                                                {kSize + 1, 0},
                                                {SharedSegment::kHeaderBytes + 1, max},
                                                {max, max}}) {
    absl::StatusOr<char*> range =
        s.Range(offset, length, "segment.push_offset", "segment.push_bytes");
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument) << offset << " " << length;
    EXPECT_THAT(std::string(range.status().message()),
                HasSubstr("segment.push_offset " + std::to_string(offset) +
                          " and segment.push_bytes " + std::to_string(length)));
  }
}

TEST(SharedSegmentQuotaTest, BoundsSegmentsAndBytesPerProcess) {
  SharedSegmentQuota quota(/*max_segments=*/2, /*max_bytes=*/1000);
  auto a = quota.Reserve(1, 400);
  auto b = quota.Reserve(1, 400);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(quota.Reserve(1, 100).status().code(), absl::StatusCode::kResourceExhausted);
  auto other = quota.Reserve(2, 1000);  // Another process has its own.
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(quota.segments(), 3);
  EXPECT_EQ(quota.bytes(), 1800);
  a->reset();
  EXPECT_EQ(quota.Reserve(1, 601).status().code(), absl::StatusCode::kResourceExhausted);
  auto c = quota.Reserve(1, 600);
  EXPECT_TRUE(c.ok());
  b->reset();
  c->reset();
  other->reset();
  EXPECT_EQ(quota.segments(), 0);
  EXPECT_EQ(quota.bytes(), 0);
}

}  // namespace
}  // namespace downpour
