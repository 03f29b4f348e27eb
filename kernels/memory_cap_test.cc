#include "kernels/memory_cap.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/factory.h"

namespace downpour {
namespace kernels {
namespace {

using ::testing::HasSubstr;

TEST(MemoryCapTest, CountsTakesAndGivesAndRefusesPastTheLimit) {
  MemoryCap cap(1000, "cuda:3");
  EXPECT_TRUE(cap.Take(600, 0).ok());
  EXPECT_EQ(cap.held(), 600);
  const absl::Status refused = cap.Take(300, 200);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("cuda:3: allocating 300 bytes"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("over the limit of 1000 bytes"));
  EXPECT_EQ(cap.held(), 600);  // Nothing counted for a refusal.
  cap.Give(600);
  EXPECT_TRUE(cap.Take(1000, 0).ok());
}

TEST(MemoryCapTest, NoLimitCountsOnly) {
  MemoryCap cap(0, "cpu");
  EXPECT_TRUE(cap.Take(size_t{1} << 40, 0).ok());
  EXPECT_EQ(cap.held(), int64_t{1} << 40);
}

TEST(MemoryCapTest, DescribesBytes) {
  EXPECT_EQ(DescribeBytes(100), "100 bytes");
  EXPECT_EQ(DescribeBytes(1536), "1.5 KiB");
  EXPECT_EQ(DescribeBytes(int64_t{3} << 29), "1.5 GiB");
}

TEST(MemoryCapTest, BackendRefusesAllocationsPastItsLimitAndFreesGiveBack) {
  BackendOptions options;
  options.memory_limit = 1 << 20;
  auto backend = CreateBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto first = (*backend)->Allocate(700 << 10);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = (*backend)->Allocate(400 << 10);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("cpu: allocating 400.0 KiB would hold 1.1 MiB of compute memory, over the "
                        "limit of 1.0 MiB (--device_memory_limit)"));
  // Staging memory is not compute memory.
  EXPECT_TRUE((*backend)->AllocateHost(800 << 10).ok());
  *first = DeviceMemory();
  EXPECT_TRUE((*backend)->Allocate(1 << 20).ok());
}

// Backends made with the same caps (a worker's replicas of two ranks) hold
// the limit together; one made without them has its own.
TEST(MemoryCapTest, BackendsOfSharedCapsHoldTheLimitTogether) {
  BackendOptions options;
  options.memory_limit = 1 << 30;  // Unused with shared caps.
  options.shared_caps = std::make_shared<MemoryCaps>(1 << 20);
  auto first = CreateBackend(options);
  auto second = CreateBackend(options);
  ASSERT_TRUE(first.ok() && second.ok());
  auto held = (*first)->Allocate(700 << 10);
  ASSERT_TRUE(held.ok()) << held.status();
  auto refused = (*second)->Allocate(400 << 10);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("would hold 1.1 MiB of compute memory, over the limit of 1.0 MiB"));
  EXPECT_EQ(options.shared_caps->For("cpu")->held(), 700 << 10);
  BackendOptions own;
  own.memory_limit = 1 << 20;
  auto alone = CreateBackend(own);
  ASSERT_TRUE(alone.ok());
  EXPECT_TRUE((*alone)->Allocate(700 << 10).ok());
  // The first's block freed gives back.
  *held = DeviceMemory();
  EXPECT_TRUE((*second)->Allocate(1 << 20).ok());
}

}  // namespace
}  // namespace kernels
}  // namespace downpour
