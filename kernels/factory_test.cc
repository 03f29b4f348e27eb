#include "kernels/factory.h"

#include "gtest/gtest.h"

namespace downpour {
namespace kernels {
namespace {

TEST(GpuMemoryInfoTest, ReportsUsedWithinTotalOrWhyNot) {
  EXPECT_EQ(GpuMemoryInfo(GpuCount()).status().code(), absl::StatusCode::kFailedPrecondition);
  if (GpuCount() == 0) GTEST_SKIP() << GpuUnavailableReason();
  for (int d = 0; d < GpuCount(); ++d) {
    absl::StatusOr<GpuMemory> memory = GpuMemoryInfo(d);
    ASSERT_TRUE(memory.ok()) << memory.status();
    EXPECT_GT(memory->total_bytes, 0);
    // This process's own context counts.
    EXPECT_GT(memory->used_bytes, 0);
    EXPECT_LE(memory->used_bytes, memory->total_bytes);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace downpour
