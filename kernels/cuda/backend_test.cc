// CudaBackend through the ComputeBackend interface, against the CPU backend
// where both compute: memory, the upload beside the compute stream, ops, the
// loss and non-finite counters, the fused optimizer, profiling marks and
// reduced precision. Skips, with the reason, where there is no CUDA device
// (except the test of a missing device, which runs everywhere).
#include "kernels/cuda/backend.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/layers.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/test_util.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

TEST(CudaBackendCreateTest, AMissingDeviceIsFailedPrecondition) {
  BackendOptions options;
  options.device = CudaDeviceCount();  // One past the last (0 without a GPU).
  const auto backend = CreateCudaBackend(options);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << CudaUnavailableReason();
    Create(ComputePrecision::kFp32);
    cpu_ = cpu::CreateCpuBackend();
  }

  void Create(ComputePrecision precision) {
    BackendOptions options;
    options.device = 0;
    options.precision = precision;
    // Compared with the CPU backend at fp32's tolerance: no TF32.
    options.tf32 = Tf32Policy::kOff;
    auto backend = CudaBackend::Create(options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    gpu_ = std::move(backend).value();
  }

  // `host` copied into memory `backend` allocated (kept until the test ends).
  template <typename T>
  T* Upload(ComputeBackend& backend, const std::vector<T>& host) {
    auto memory = backend.Allocate(sizeof(T) * host.size());
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return nullptr;
    T* p = memory->template as<T>();
    EXPECT_OK(backend.ToDevice(p, host.data(), sizeof(T) * host.size()));
    memory_.push_back(std::move(memory).value());
    return p;
  }

  template <typename T>
  T* Alloc(ComputeBackend& backend, size_t n) {
    auto memory = backend.Allocate(sizeof(T) * n);
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return nullptr;
    T* p = memory->template as<T>();
    memory_.push_back(std::move(memory).value());
    return p;
  }

  template <typename T>
  std::vector<T> Download(ComputeBackend& backend, const T* p, size_t n) {
    std::vector<T> host(n);
    EXPECT_OK(backend.ToHost(host.data(), p, sizeof(T) * n));
    EXPECT_OK(backend.Synchronize());
    return host;
  }

  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<ComputeBackend> cpu_;
  // Freed before the backends that allocated them (declared after them).
  std::vector<DeviceMemory> memory_;
};

TEST_F(CudaBackendTest, DescribesItsDevice) {
  EXPECT_TRUE(gpu_->gpu());
  EXPECT_EQ(gpu_->device(), 0);
  EXPECT_EQ(gpu_->activation_bytes(), sizeof(float));
  EXPECT_EQ(gpu_->context().device, 0);
  EXPECT_NE(gpu_->context().stream, nullptr);
  EXPECT_EQ(gpu_->weight_copy_bytes(), 0);
  EXPECT_EQ(gpu_->workspace_bytes(), int64_t{16} << 20);
}

TEST_F(CudaBackendTest, AllocatesDeviceAndPageLockedHostMemory) {
  auto device = gpu_->Allocate(1000);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(device->bytes(), 1000u);
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, device->as<void>()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);

  auto host = gpu_->AllocateHost(1000);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->bytes(), 1000u);
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, host->as<void>()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  std::memset(host->as<void>(), 0, 1000);  // Host memory the CPU can write.

  auto empty = gpu_->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->as<void>(), nullptr);
}

TEST_F(CudaBackendTest, TooLargeAnAllocationIsResourceExhausted) {
  const size_t bytes = size_t{1} << 50;  // A petabyte.
  const auto memory = gpu_->Allocate(bytes);
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kResourceExhausted) << memory.status();
  EXPECT_EQ(memory.status().message(),
            absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory"));
  // The failure leaves no error behind for the next call.
  EXPECT_TRUE(gpu_->Allocate(1000).ok());
}

TEST_F(CudaBackendTest, OpsAfterJoinUploadsSeeTheUploads) {
  const int64_t n = 1 << 20;
  const std::vector<float> values = Random(n, 1);
  auto staging = gpu_->AllocateHost(sizeof(float) * n);
  ASSERT_TRUE(staging.ok()) << staging.status();
  std::memcpy(staging->as<void>(), values.data(), sizeof(float) * n);
  float* uploaded = Alloc<float>(*gpu_, n);
  float* relu = Alloc<float>(*gpu_, n);
  ASSERT_NE(relu, nullptr);
  ASSERT_OK(gpu_->UploadAside(uploaded, staging->as<void>(), sizeof(float) * n));
  ASSERT_OK(gpu_->JoinUploads());
  // Queued on the compute stream, after the join.
  ASSERT_OK(gpu_->ReluForward(n, Act(uploaded), Act(relu)));
  EXPECT_EQ(Download(*gpu_, uploaded, n), values);
  std::vector<float> expected(values);
  for (float& v : expected) v = v > 0.f ? v : 0.f;
  EXPECT_EQ(Download(*gpu_, relu, n), expected);
}

TEST_F(CudaBackendTest, DownloadAsideLandsWhatTheOpsBeforeItWroteAndAnotherThreadWaits) {
  const int64_t n = 1 << 20;
  const std::vector<float> values = Random(n, 4);
  float* x = Upload(*gpu_, values);
  std::vector<float> expected(values);
  for (float& v : expected) v = v > 0.f ? v : 0.f;
  // More downloads than the ring holds, each after its own op: every ticket
  // still lands what its op wrote.
  std::vector<float*> relus;
  std::vector<DeviceMemory> hosts;
  std::vector<int64_t> tickets;
  for (int i = 0; i < 300; ++i) {
    float* relu = Alloc<float>(*gpu_, i % 100 == 0 ? n : 1024);
    ASSERT_NE(relu, nullptr);
    const int64_t count = i % 100 == 0 ? n : 1024;
    auto host = gpu_->AllocateHost(sizeof(float) * count);
    ASSERT_TRUE(host.ok()) << host.status();
    ASSERT_OK(gpu_->ReluForward(count, Act(x), Act(relu)));
    auto ticket = gpu_->DownloadAside(host->as<void>(), relu, sizeof(float) * count);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
    relus.push_back(relu);
    hosts.push_back(std::move(*host));
  }
  // The last big one, waited for on another thread.
  absl::Status waited;
  std::thread([&] { waited = gpu_->WaitDownload(tickets[200]); }).join();
  ASSERT_OK(waited);
  const float* last = hosts[200].as<float>();
  EXPECT_EQ(std::vector<float>(last, last + n), expected);
  ASSERT_OK(gpu_->WaitDownload(tickets.back()));
  const float* small = hosts.back().as<float>();
  EXPECT_EQ(std::vector<float>(small, small + 1024),
            std::vector<float>(expected.begin(), expected.begin() + 1024));
  EXPECT_EQ(gpu_->WaitDownload(tickets.back() + 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, DenseForwardMatchesTheCpuBackend) {
  const int64_t batch = 33, in = 70, out = 19;
  const auto x = Random(batch * in, 1), w = Random(in * out, 2), bias = Random(out, 3);
  std::vector<std::vector<float>> y;
  for (ComputeBackend* backend : {static_cast<ComputeBackend*>(gpu_.get()), cpu_.get()}) {
    float* y_ = Alloc<float>(*backend, batch * out);
    ASSERT_OK(backend->DenseForward(batch, in, out, Act(Upload(*backend, x)), Upload(*backend, w),
                                    Upload(*backend, bias), Act(y_)));
    y.push_back(Download(*backend, y_, batch * out));
  }
  ExpectClose(y[1], y[0], "y");
}

TEST_F(CudaBackendTest, LossCountersAddUpOverBatchesAsOnTheCpu) {
  const int64_t batch = 300, classes = 10;
  const auto logits = Random(batch * classes, 1, -8.f, 8.f);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7) % classes);
  std::vector<LossStats> stats;
  std::vector<std::vector<float>> dlogits;
  for (ComputeBackend* backend : {static_cast<ComputeBackend*>(gpu_.get()), cpu_.get()}) {
    const float* logits_ = Upload(*backend, logits);
    const int32_t* labels_ = Upload(*backend, labels);
    float* dlogits_ = Alloc<float>(*backend, logits.size());
    ASSERT_OK(backend->ResetLoss());
    ASSERT_OK(
        backend->SoftmaxCrossEntropy(batch, classes, Act(logits_), labels_, Act(dlogits_), 1024.f));
    ASSERT_OK(backend->SoftmaxCrossEntropy(batch, classes, Act(logits_), labels_, nullptr, 1.f));
    auto loss = backend->ReadLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    stats.push_back(*loss);
    dlogits.push_back(Download(*backend, dlogits_, logits.size()));
  }
  EXPECT_NEAR(stats[0].loss_sum, stats[1].loss_sum, 1e-6 * stats[1].loss_sum);
  EXPECT_EQ(stats[0].correct, stats[1].correct);
  ExpectClose(dlogits[1], dlogits[0], "dlogits * 1024");
  // A reset starts the sums again.
  ASSERT_OK(gpu_->ResetLoss());
  auto loss = gpu_->ReadLoss();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->loss_sum, 0.0);
  EXPECT_EQ(loss->correct, 0);
}

TEST_F(CudaBackendTest, NonFiniteGradientsRaiseTheFlagUntilReset) {
  std::vector<float> g = {2.f, -4.f, 8.f};
  float* g_ = Upload(*gpu_, g);
  ASSERT_OK(gpu_->ResetNonFinite());
  ASSERT_OK(gpu_->UnscaleCheckFinite(3, 0.5f, g_));
  auto flag = gpu_->ReadNonFinite();
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_FALSE(*flag);
  EXPECT_EQ(Download(*gpu_, g_, 3), std::vector<float>({1.f, -2.f, 4.f}));

  float* bad = Upload(*gpu_, std::vector<float>{1.f, std::numeric_limits<float>::infinity()});
  ASSERT_OK(gpu_->UnscaleCheckFinite(2, 0.5f, bad));
  flag = gpu_->ReadNonFinite();
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_TRUE(*flag);
  ASSERT_OK(gpu_->UnscaleCheckFinite(3, 1.f, g_));  // Finite: the flag stays.
  flag = gpu_->ReadNonFinite();
  EXPECT_TRUE(flag.ok() && *flag);
  ASSERT_OK(gpu_->ResetNonFinite());
  flag = gpu_->ReadNonFinite();
  EXPECT_TRUE(flag.ok() && !*flag);
}

TEST_F(CudaBackendTest, ApplyOptimizerMatchesTheCpuBackend) {
  OptimizerHyperparams hp;
  hp.learning_rate = 0.01f;
  hp.weight_decay = 1e-4f;
  const std::vector<int64_t> sizes = {1000, 70000};
  std::vector<std::vector<float>> params;
  for (ComputeBackend* backend : {static_cast<ComputeBackend*>(gpu_.get()), cpu_.get()}) {
    std::vector<TensorUpdate> tensors;
    uint32_t seed = 1;
    for (int64_t n : sizes) {
      TensorUpdate t;
      t.n = n;
      t.param = Upload(*backend, Random(n, ++seed));
      t.grad = Upload(*backend, Random(n, ++seed));
      t.slots[0] = Upload(*backend, std::vector<float>(n, 0.f));
      t.slots[1] = Upload(*backend, std::vector<float>(n, 0.f));
      tensors.push_back(t);
    }
    // Twice with the same tensors (the second reuses the GPU's plan), then
    // once with the first alone (a new plan).
    for (int64_t step = 1; step <= 2; ++step) {
      hp.step = step;
      ASSERT_OK(backend->ApplyOptimizer(OptimizerKind::kAdam, hp, tensors));
    }
    hp.step = 3;
    ASSERT_OK(backend->ApplyOptimizer(OptimizerKind::kAdam, hp, {tensors[0]}));
    for (size_t i = 0; i < sizes.size(); ++i) {
      params.push_back(Download(*backend, tensors[i].param, sizes[i]));
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    ExpectClose(params[sizes.size() + i], params[i], "param");
  }
}

TEST_F(CudaBackendTest, MarksTimeTheWorkBetweenThem) {
  const int64_t n = 1 << 20;
  float* x = Upload(*gpu_, Random(n, 1));
  ASSERT_OK(gpu_->Mark(0));
  ASSERT_OK(gpu_->ReluForward(n, Act(x), Act(x)));
  ASSERT_OK(gpu_->Mark(2));  // Slots need not be consecutive.
  ASSERT_OK(gpu_->Synchronize());
  const auto ms = gpu_->MarkMs(0, 2);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0);
}

TEST_F(CudaBackendTest, Bf16DenseForwardReadsTheReducedWeights) {
  Create(ComputePrecision::kBf16);
  if (HasFatalFailure()) return;
  using R = Reduced<__nv_bfloat16>;
  const int64_t batch = 33, in = 70, out = 19;
  auto rounded = [](std::vector<float> v) {
    for (float& e : v) e = R::To(R::From(e));
    return v;
  };
  const auto x = rounded(Random(batch * in, 1)), w = rounded(Random(in * out, 2));
  const auto bias = rounded(Random(out, 3));
  EXPECT_EQ(gpu_->activation_bytes(), 2u);
  const float* w_ = Upload(*gpu_, w);
  ASSERT_OK(gpu_->RegisterReducedWeights({{w_, in * out}}));
  EXPECT_GE(gpu_->weight_copy_bytes(), static_cast<int64_t>(2 * in * out));
  ASSERT_OK(gpu_->CastReducedWeights());
  void* x16 = Alloc<__nv_bfloat16>(*gpu_, x.size());
  ASSERT_OK(gpu_->ToActivations(x.size(), Upload(*gpu_, x), Act(x16)));
  auto* y16 = Alloc<__nv_bfloat16>(*gpu_, batch * out);
  ASSERT_OK(gpu_->DenseForward(batch, in, out, Act(x16), w_, Upload(*gpu_, bias), Act(y16)));
  const std::vector<__nv_bfloat16> y_bf16 = Download(*gpu_, y16, batch * out);
  std::vector<float> y(y_bf16.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = R::To(y_bf16[i]);

  std::vector<float> expected(batch * out);
  cpu::CpuContext host;
  cpu::DenseForward(host, batch, in, out, x.data(), w.data(), bias.data(), expected.data());
  ExpectClose(expected, y, "y", kProductUlps * R::kUnitRoundoff, ProductScale(in));
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
