#include "kernels/factory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace kernels {
namespace {

using ::testing::HasSubstr;

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

// Every build has the CPU backend; a build without CUDA (no toolkit, or
// --config=cpu) refuses each GPU with one sentence saying so.
TEST(CreateBackendTest, CpuInEveryBuildGpuOnlyWithCuda) {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> cpu = CreateBackend(BackendOptions());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE((*cpu)->gpu());
  EXPECT_EQ(DescribeDevice(-1).value_or(""), "cpu");
  EXPECT_THAT(CreateDeviceGroup({cpu->get(), cpu->get()}).status().message(),
              HasSubstr("GPU backends only"));
  EXPECT_EQ(GpuCount() == 0, !GpuUnavailableReason().empty());
  if (BuiltWithCuda()) return;

  EXPECT_EQ(GpuCount(), 0);
  EXPECT_EQ(GpuUnavailableReason(),
            "no CUDA device: built without CUDA (no CUDA toolkit at build time, or --config=cpu)");
  BackendOptions gpu;
  gpu.device = 0;
  absl::StatusOr<std::unique_ptr<ComputeBackend>> refused = CreateBackend(gpu);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("CUDA device 0: built without CUDA"));
  EXPECT_THAT(DescribeDevice(1).status().message(), HasSubstr("CUDA device 1: built without CUDA"));
  EXPECT_THAT(GpuMemoryInfo(0).status().message(), HasSubstr("built without CUDA"));
}

}  // namespace
}  // namespace kernels
}  // namespace downpour
