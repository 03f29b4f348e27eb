#include "rpc/segment_doorbell.h"

#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/shared_segment.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSize = SharedSegment::kHeaderBytes + SegmentDoorbell::kBytes;

// The worker's and the shard's mappings of one segment.
struct Ends {
  std::shared_ptr<SharedSegment> worker, shard;
};
Ends Map() {
  absl::StatusOr<std::shared_ptr<SharedSegment>> worker = SharedSegment::Create(kSize);
  EXPECT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<std::shared_ptr<SharedSegment>> shard =
      SharedSegment::Open((*worker)->attach(), kSize);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return {*worker, *shard};
}

TEST(SegmentDoorbellTest, ExchangesTakeTurnsThroughTheSharedBytes) {
  Ends ends = Map();
  SegmentDoorbell worker(ends.worker->data() + SharedSegment::kHeaderBytes);
  SegmentDoorbell shard(ends.shard->data() + SharedSegment::kHeaderBytes);
  // The shard's end echoes each request, upper-cased, until told to stop.
  std::atomic<bool> stop{false};
  std::thread answering([&] {
    uint32_t seen = 0;
    while (!stop.load()) {
      const uint32_t sequence = shard.AwaitRequest(seen, absl::Milliseconds(100));
      if (sequence == seen) continue;
      seen = sequence;
      absl::StatusOr<std::string> request = shard.Request();
      ASSERT_TRUE(request.ok()) << request.status();
      for (char& c : *request) c = static_cast<char>(std::toupper(c));
      shard.Answer(sequence, *request);
    }
  });
  for (int i = 0; i < 200; ++i) {
    const std::string header = "exchange " + std::to_string(i);
    const uint32_t sequence = worker.Ring(header);
    while (!worker.AwaitAnswer(sequence, absl::Seconds(5))) {
    }
    absl::StatusOr<std::string> answer = worker.Answer();
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(*answer, "EXCHANGE " + std::to_string(i));
  }
  stop.store(true);
  shard.WakeRequestWaiter();
  answering.join();
}

TEST(SegmentDoorbellTest, WaitsEndAtTheirTimeoutWithNothingRung) {
  Ends ends = Map();
  SegmentDoorbell worker(ends.worker->data() + SharedSegment::kHeaderBytes);
  SegmentDoorbell shard(ends.shard->data() + SharedSegment::kHeaderBytes);
  EXPECT_EQ(shard.AwaitRequest(0, absl::Milliseconds(20)), 0u);
  const uint32_t sequence = worker.Ring("unanswered");
  EXPECT_FALSE(worker.AwaitAnswer(sequence, absl::Milliseconds(20)));
  EXPECT_EQ(shard.AwaitRequest(0, absl::Milliseconds(20)), sequence);
}

TEST(SegmentDoorbellTest, SizesPastTheAreasAreRefusedNotRead) {
  Ends ends = Map();
  char* at = ends.shard->data() + SharedSegment::kHeaderBytes;
  SegmentDoorbell shard(at);
  SegmentDoorbell worker(ends.worker->data() + SharedSegment::kHeaderBytes);
  // A worker that names a size past the request area (its bytes are not
  // trusted); likewise a shard past the answer area.
  reinterpret_cast<std::atomic<uint32_t>*>(at)[2].store(SegmentDoorbell::kRequestBytes + 1);
  absl::StatusOr<std::string> request = shard.Request();
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(request.status().message(), HasSubstr("area holds"));
  reinterpret_cast<std::atomic<uint32_t>*>(at)[3].store(0xffffffffu);
  absl::StatusOr<std::string> answer = worker.Answer();
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace downpour
