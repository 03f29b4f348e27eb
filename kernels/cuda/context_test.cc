// The device queries and CudaContext::Create: they report a missing device
// or driver as a status (and a reason), never a crash, so this test runs
// with or without a GPU.
#include "kernels/cuda/context.h"

#include "gtest/gtest.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

TEST(CudaDeviceTest, AbsenceIsReportedWithoutCrashing) {
  const int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(CudaDeviceName(-1), "");
  if (count == 0) {
    EXPECT_EQ(CudaUnavailableReason().rfind("no CUDA device", 0), 0u) << CudaUnavailableReason();
    const auto ctx = CudaContext::Create(0);
    EXPECT_EQ(ctx.status().code(), absl::StatusCode::kFailedPrecondition) << ctx.status();
  } else {
    EXPECT_EQ(CudaUnavailableReason(), "");
    EXPECT_FALSE(CudaDeviceName(0).empty());
    EXPECT_EQ(CudaContext::Create(count).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
