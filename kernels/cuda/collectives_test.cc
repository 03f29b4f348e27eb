// The NCCL device group over two CUDA backends: Broadcast and WeightedSum,
// of one share and of a share per rank, through CreateNcclGroup, with their
// argument checks.
// Skips, with the reason, where this process sees fewer than two GPUs
// (except the argument checks of NcclCommunicators::Create, which fail
// before any device is touched and run everywhere).
#include "kernels/cuda/collectives.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/test_util.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

TEST(NcclCommunicatorsTest, FewerThanTwoOrRepeatedDevicesAreInvalidArgument) {
  EXPECT_EQ(NcclCommunicators::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicators::Create({0}).status().code(), absl::StatusCode::kInvalidArgument);
  const auto repeated = NcclCommunicators::Create({0, 1, 0});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(repeated.status().message(),
            "NCCL communicators need distinct CUDA devices, got [0,1,0]");
}

class NcclGroupTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  static constexpr int64_t kCount = 100000;

  void SetUp() override {
    const int count = CudaDeviceCount();
    if (count < kRanks) {
      GTEST_SKIP() << "needs " << kRanks << " CUDA devices; "
                   << (count == 0 ? CudaUnavailableReason()
                                  : absl::StrCat("this process sees ", count));
    }
    std::vector<ComputeBackend*> ranks;
    for (int r = 0; r < kRanks; ++r) {
      BackendOptions options;
      options.device = r;
      auto backend = CudaBackend::Create(options);
      ASSERT_TRUE(backend.ok()) << backend.status();
      backends_.push_back(std::move(backend).value());
      ranks.push_back(backends_.back().get());
    }
    auto group = CreateNcclGroup(ranks);
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = std::move(group).value();
    EXPECT_EQ(group_->size(), kRanks);
  }

  // kCount floats of `values` in rank r's memory.
  float* Upload(int r, const std::vector<float>& values) {
    CudaBackend& backend = *backends_[r];
    EXPECT_OK(backend.MakeCurrent());
    auto memory = backend.Allocate(sizeof(float) * values.size());
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return nullptr;
    float* p = memory->as<float>();
    EXPECT_OK(backend.ToDevice(p, values.data(), sizeof(float) * values.size()));
    memory_.push_back(std::move(memory).value());
    return p;
  }

  std::vector<float> Download(int r, const float* p) {
    CudaBackend& backend = *backends_[r];
    EXPECT_OK(backend.MakeCurrent());
    std::vector<float> host(kCount);
    EXPECT_OK(backend.ToHost(host.data(), p, sizeof(float) * kCount));
    EXPECT_OK(backend.Synchronize());
    return host;
  }

  std::vector<std::unique_ptr<CudaBackend>> backends_;
  std::unique_ptr<DeviceGroup> group_;  // Destroyed before the backends.
  std::vector<DeviceMemory> memory_;    // Freed before the backends.
};

// The whole buffer as one share of rank 0.
std::vector<DeviceShare> Whole(int64_t count) { return {DeviceShare{0, count, 0}}; }

// kCount floats split in two uneven shares, the first rank 1's.
std::vector<DeviceShare> TwoShares(int64_t count) {
  const int64_t split = count / 3;
  return {DeviceShare{0, split, 1}, DeviceShare{split, count - split, 0}};
}

TEST_F(NcclGroupTest, BroadcastCopiesRankZerosBufferToEveryRank) {
  const std::vector<float> values = Random(kCount, 1);
  std::vector<float*> buffers = {Upload(0, values), Upload(1, std::vector<float>(kCount, 0.f))};
  ASSERT_OK(group_->Broadcast(buffers, Whole(kCount)));
  EXPECT_EQ(Download(0, buffers[0]), values);
  EXPECT_EQ(Download(1, buffers[1]), values);
}

TEST_F(NcclGroupTest, BroadcastOfSharesGathersEachFromItsOwner) {
  const std::vector<float> a = Random(kCount, 1), b = Random(kCount, 2);
  std::vector<float*> buffers = {Upload(0, a), Upload(1, b)};
  const std::vector<DeviceShare> shares = TwoShares(kCount);
  ASSERT_OK(group_->Broadcast(buffers, shares));
  std::vector<float> expected = a;
  std::copy(b.begin(), b.begin() + shares[0].count, expected.begin());
  EXPECT_EQ(Download(0, buffers[0]), expected);
  EXPECT_EQ(Download(1, buffers[1]), expected);
}

TEST_F(NcclGroupTest, WeightedSumGoesToRankZeroOnly) {
  const std::vector<float> a = Random(kCount, 1), b = Random(kCount, 2);
  std::vector<float*> buffers = {Upload(0, a), Upload(1, b)};
  ASSERT_OK(group_->WeightedSum(buffers, {0.25f, 0.75f}, Whole(kCount)));
  std::vector<float> expected(kCount);
  for (int64_t i = 0; i < kCount; ++i) expected[i] = 0.25f * a[i] + 0.75f * b[i];
  ExpectClose(expected, Download(0, buffers[0]), "weighted sum", 1e-6);
  EXPECT_EQ(Download(1, buffers[1]), b);
}

TEST_F(NcclGroupTest, WeightedSumOfSharesLandsOnEachOwnerOnly) {
  const std::vector<float> a = Random(kCount, 1), b = Random(kCount, 2);
  std::vector<float*> buffers = {Upload(0, a), Upload(1, b)};
  const std::vector<DeviceShare> shares = TwoShares(kCount);
  ASSERT_OK(group_->WeightedSum(buffers, {0.25f, 0.75f}, shares));
  const std::vector<float> on0 = Download(0, buffers[0]), on1 = Download(1, buffers[1]);
  const int64_t split = shares[0].count;
  std::vector<float> sum(kCount);
  for (int64_t i = 0; i < kCount; ++i) sum[i] = 0.25f * a[i] + 0.75f * b[i];
  // Rank 1 owns [0, split): the sum there, its own floats after.
  ExpectClose(std::vector<float>(sum.begin(), sum.begin() + split),
              std::vector<float>(on1.begin(), on1.begin() + split), "rank 1's share", 1e-6);
  EXPECT_TRUE(std::equal(on1.begin() + split, on1.end(), b.begin() + split));
  // Rank 0 owns the rest.
  ExpectClose(std::vector<float>(sum.begin() + split, sum.end()),
              std::vector<float>(on0.begin() + split, on0.end()), "rank 0's share", 1e-6);
  EXPECT_TRUE(std::equal(on0.begin(), on0.begin() + split, a.begin()));
}

TEST_F(NcclGroupTest, LeavesTheCallersCurrentDevice) {
  std::vector<float*> buffers = {Upload(0, Random(kCount, 1)), Upload(1, Random(kCount, 2))};
  for (int current = 0; current < kRanks; ++current) {
    ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
    ASSERT_OK(group_->Broadcast(buffers, TwoShares(kCount)));
    ASSERT_OK(group_->WeightedSum(buffers, {1.f, 1.f}, TwoShares(kCount)));
    int device = -1;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, current);
  }
  for (auto& backend : backends_) {
    ASSERT_OK(backend->MakeCurrent());
    ASSERT_OK(backend->Synchronize());
  }
}

TEST_F(NcclGroupTest, WrongArgumentsAreInvalidArgumentAndLeaveTheGroupUsable) {
  const std::vector<float> values = Random(kCount, 1);
  std::vector<float*> buffers = {Upload(0, values), Upload(1, std::vector<float>(kCount, 0.f))};
  EXPECT_EQ(group_->Broadcast({buffers[0]}, Whole(kCount)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group_->WeightedSum(buffers, {1.f}, Whole(kCount)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group_->Broadcast(buffers, {DeviceShare{0, kCount, 2}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group_->Broadcast(buffers, {DeviceShare{-1, 1, 0}}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK(group_->Broadcast(buffers, Whole(0)));  // Nothing to move.
  ASSERT_OK(group_->Broadcast(buffers, {}));
  ASSERT_OK(group_->Broadcast(buffers, Whole(kCount)));
  EXPECT_EQ(Download(1, buffers[1]), values);
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
