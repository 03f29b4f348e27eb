// The layer ops of layers.h (all but the convolutions, conv_test.cc) with
// bf16 and fp16 activations against their CPU twins, within the tolerances
// test_util.h states. Skips, with the reason, where there is no CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/layers.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/test_util.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

TYPED_TEST_SUITE(ReducedKernelTest, ReducedTypes, ReducedNames);

TYPED_TEST(ReducedKernelTest, ConvertRoundTrips) {
  using T = TypeParam;
  using Other = typename Reduced<T>::Other;
  const auto to_other = [](std::vector<float> v) {
    for (float& x : v) x = Reduced<Other>::To(Reduced<Other>::From(x));
    return v;
  };
  for (int64_t n : {8192, 8191}) {  // The packed kernel, and the one element a thread.
    SCOPED_TRACE(n);
    // Magnitudes from 2^-16 to 2^15: fp16 subnormals up to near its largest.
    std::vector<float> x = Random(n, 1);
    for (int64_t i = 0; i < n; ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 32) - 16);
    const std::vector<float> rounded = TestFixture::Rounded(x);
    const CudaContext& ctx = this->ctx();
    float* x_ = this->Upload(x);
    T* t_ = this->AllocT(n);
    ASSERT_OK((cuda::Convert<float, T>(ctx, n, x_, t_)));
    ExpectClose(rounded, this->DownloadT(t_, n), "float -> T", kExact);
    float* back_ = this->AllocF(n);
    ASSERT_OK((cuda::Convert<T, float>(ctx, n, t_, back_)));
    ExpectClose(rounded, this->Download(back_, n), "T -> float", kExact);
    T* copy_ = this->AllocT(n);
    ASSERT_OK((cuda::Convert<T, T>(ctx, n, t_, copy_)));
    ExpectClose(rounded, this->DownloadT(copy_, n), "T -> T", kExact);
    Other* other_ = this->template Alloc<Other>(n);
    ASSERT_OK((cuda::Convert<T, Other>(ctx, n, t_, other_)));
    const std::vector<float> other = to_other(rounded);
    ExpectClose(other, this->DownloadT(other_, n), "T -> other", kExact);
    ASSERT_OK((cuda::Convert<Other, T>(ctx, n, other_, copy_)));
    ExpectClose(TestFixture::Rounded(other), this->DownloadT(copy_, n), "other -> T", kExact);
  }
}

TYPED_TEST(ReducedKernelTest, DenseForwardAndBackward) {
  using T = TypeParam;
  const int64_t batch = 33, in = 70, out = 19;
  const auto x = TestFixture::RandomT(batch * in, 1), w = TestFixture::RandomT(in * out, 2);
  const auto bias = TestFixture::RandomT(out, 3), dy = TestFixture::RandomT(batch * out, 4);
  const CudaContext& ctx = this->ctx();
  T* x_ = this->UploadT(x);
  float* w_ = this->Upload(w);
  float* bias_ = this->Upload(bias);
  T* dy_ = this->UploadT(dy);
  T* y_ = this->AllocT(batch * out);
  for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
    std::vector<float> y(batch * out);
    ASSERT_OK(cuda::DenseForward(ctx, batch, in, out, x_, w_, b ? bias_ : nullptr, y_));
    cpu::DenseForward(this->cpu_, batch, in, out, x.data(), w.data(), b, y.data());
    this->Expect(y, y_, b ? "y" : "y without bias", kProductUlps, ProductScale(in));
  }
  for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
    auto dx = TestFixture::RandomT(batch * in, 5);
    auto dw = Random(in * out, 6), db = Random(out, 7);
    T* dx_ = this->UploadT(dx);
    float* dw_ = this->Upload(dw);
    float* db_ = this->Upload(db);
    ASSERT_OK(cuda::DenseBackward(ctx, batch, in, out, x_, w_, dy_, dx_, write, dw_, db_, write));
    cpu::DenseBackward(this->cpu_, batch, in, out, x.data(), w.data(), dy.data(), dx.data(), write,
                       dw.data(), db.data(), write);
    this->Expect(dx, dx_, "dx", kProductUlps, ProductScale(out));
    ExpectClose(dw, this->Download(dw_, dw.size()), "dw");
    ExpectClose(db, this->Download(db_, db.size()), "dbias");
  }
  // No input gradient, no bias.
  auto dw = Random(in * out, 8);
  float* dw_ = this->Upload(dw);
  ASSERT_OK(cuda::DenseBackward<T>(ctx, batch, in, out, x_, w_, dy_, nullptr, Write::kOverwrite,
                                   dw_, nullptr, Write::kAccumulate));
  cpu::DenseBackward(this->cpu_, batch, in, out, x.data(), w.data(), dy.data(), nullptr,
                     Write::kOverwrite, dw.data(), nullptr, Write::kAccumulate);
  ExpectClose(dw, this->Download(dw_, dw.size()), "dw without dx");
}

TYPED_TEST(ReducedKernelTest, ElementWise) {
  using T = TypeParam;
  const CudaContext& ctx = this->ctx();
  const cpu::CpuContext& host = this->cpu_;
  for (int64_t n : {10007, 8192}) {  // One element a thread; 16-byte packs.
    SCOPED_TRACE(n);
    const auto x = TestFixture::RandomT(n, 1), dy = TestFixture::RandomT(n, 2);
    const auto other = TestFixture::RandomT(n, 3);
    T* x_ = this->UploadT(x);
    T* dy_ = this->UploadT(dy);
    T* other_ = this->UploadT(other);
    T* y_ = this->AllocT(n);
    std::vector<float> y(n);

    ASSERT_OK(cuda::ReluForward(ctx, n, x_, y_));
    cpu::ReluForward(host, n, x.data(), y.data());
    this->Expect(y, y_, "relu", kExact, 0);
    std::vector<float> dx = other;
    T* dx_ = this->UploadT(dx);
    ASSERT_OK(cuda::ReluBackward(ctx, n, x_, dy_, dx_, Write::kAccumulate));
    cpu::ReluBackward(host, n, x.data(), dy.data(), dx.data(), Write::kAccumulate);
    this->ExpectElement(dx, dx_, "relu backward");
    this->Resync(dx, dx_);

    std::vector<uint8_t> mask(n);
    uint8_t* mask_ = this->template Alloc<uint8_t>(n);
    ASSERT_OK(cuda::DropoutForward(ctx, n, 0.3f, 42, 7, x_, y_, mask_));
    cpu::DropoutForward(host, n, 0.3f, 42, 7, x.data(), y.data(), mask.data());
    EXPECT_TRUE(mask == this->Download(mask_, n)) << "dropout masks differ";
    this->ExpectElement(y, y_, "dropout");
    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      ASSERT_OK(cuda::DropoutBackward(ctx, n, 0.3f, mask_, dy_, dx_, write));
      cpu::DropoutBackward(host, n, 0.3f, mask.data(), dy.data(), dx.data(), write);
      this->ExpectElement(dx, dx_, "dropout backward");
      this->Resync(dx, dx_);
    }

    ASSERT_OK(cuda::Add(ctx, n, x_, other_, y_));
    cpu::Add(host, n, x.data(), other.data(), y.data());
    this->ExpectElement(y, y_, "add");
    this->Resync(y, y_);
    ASSERT_OK(cuda::CopyOrAdd(ctx, n, x_, y_, Write::kAccumulate));
    cpu::CopyOrAdd(host, n, x.data(), y.data(), Write::kAccumulate);
    this->ExpectElement(y, y_, "copy or add (accumulate)");
    ASSERT_OK(cuda::CopyOrAdd(ctx, n, other_, y_, Write::kOverwrite));
    this->Expect(other, y_, "copy or add (overwrite)", kExact, 0);
    ASSERT_OK(cuda::Zero(ctx, n, y_));
    this->Expect(std::vector<float>(n, 0.f), y_, "zero", kExact, 0);
  }
}

TYPED_TEST(ReducedKernelTest, SoftmaxCrossEntropyAsync) {
  using T = TypeParam;
  const CudaContext& ctx = this->ctx();
  constexpr float kLossScale = 1024;
  for (const auto& [batch, classes] :
       std::vector<std::pair<int64_t, int64_t>>{{300, 10}, {64, 1000}}) {
    SCOPED_TRACE(testing::Message() << batch << " x " << classes);
    const auto logits = TestFixture::RandomT(batch * classes, 1, -8.f, 8.f);
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7) % classes);
    std::vector<float> dlogits(batch * classes);
    LossStats host;
    cpu::SoftmaxCrossEntropy(this->cpu_, batch, classes, logits.data(), labels.data(),
                             dlogits.data(), &host);
    for (float& g : dlogits) g *= kLossScale;
    T* logits_ = this->UploadT(logits);
    int32_t* labels_ = this->Upload(labels);
    T* dlogits_ = this->AllocT(dlogits.size());
    auto* loss_ = this->template Alloc<double>(1);
    auto* correct_ = this->template Alloc<unsigned long long>(1);
    ASSERT_EQ(cudaMemsetAsync(loss_, 0, sizeof(double), ctx.stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(correct_, 0, sizeof(unsigned long long), ctx.stream), cudaSuccess);
    ASSERT_OK(cuda::SoftmaxCrossEntropyAsync(ctx, batch, classes, logits_, labels_, dlogits_,
                                             kLossScale, loss_, correct_));
    // Again without dlogits: the counters add the batch a second time.
    ASSERT_OK(cuda::SoftmaxCrossEntropyAsync<T>(ctx, batch, classes, logits_, labels_, nullptr, 1.f,
                                                loss_, correct_));
    // The same logits and double sums as the CPU's: the loss agrees as in fp32.
    EXPECT_NEAR(this->Download(loss_, 1)[0], 2 * host.loss_sum, 2e-6 * host.loss_sum);
    EXPECT_EQ(this->Download(correct_, 1)[0], 2 * static_cast<unsigned long long>(host.correct));
    this->ExpectElement(dlogits, dlogits_, "dlogits * 1024");
  }
}

// Values k / 64 for integers |k| <= 252 (exact in bf16 and fp16) with k = 3 *
// (h % 3) + w % 3 modulo 9: distinct within any window of at most 3x3, so no
// maximum ties after rounding and the gradient goes where the CPU's does.
std::vector<float> DistinctInWindows(const WindowShape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> r(-28, 27);
  std::vector<float> x(s.batch * s.in_elements());
  size_t i = 0;
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t h = 0; h < s.in_h; ++h) {
      for (int64_t w = 0; w < s.in_w; ++w) {
        for (int64_t c = 0; c < s.in_c; ++c) {
          x[i++] = static_cast<float>(9 * r(gen) + 3 * (h % 3) + w % 3) / 64.f;
        }
      }
    }
  }
  return x;
}

TYPED_TEST(ReducedKernelTest, Pooling) {
  using T = TypeParam;
  const CudaContext& ctx = this->ctx();
  const cpu::CpuContext& host = this->cpu_;
  uint32_t seed = 100;
  for (const WindowShape& s : PoolShapes()) {
    SCOPED_TRACE(Describe(s));
    ASSERT_LE(std::max(s.kernel_h, s.kernel_w), 3) << "DistinctInWindows needs windows <= 3x3";
    const auto x = DistinctInWindows(s, ++seed);
    const auto dy = TestFixture::RandomT(s.batch * s.out_elements(), ++seed);
    T* x_ = this->UploadT(x);
    T* dy_ = this->UploadT(dy);
    std::vector<float> y(dy.size());
    T* y_ = this->AllocT(y.size());
    ASSERT_OK(cuda::MaxPoolForward(ctx, s, x_, y_));
    cpu::MaxPoolForward(host, s, x.data(), y.data());
    this->Expect(y, y_, "max pool", kExact, 0);
    ASSERT_OK(cuda::AvgPoolForward(ctx, s, x_, y_));
    cpu::AvgPoolForward(host, s, x.data(), y.data());
    this->ExpectElement(y, y_, "avg pool");
    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      auto dx = TestFixture::RandomT(x.size(), ++seed);
      T* dx_ = this->UploadT(dx);
      ASSERT_OK(cuda::MaxPoolBackward(ctx, s, x_, dy_, dx_, write));
      cpu::MaxPoolBackward(host, s, x.data(), dy.data(), dx.data(), write);
      this->ExpectElement(dx, dx_, "max pool backward");
      this->Resync(dx, dx_);
      ASSERT_OK(cuda::AvgPoolBackward(ctx, s, dy_, dx_, write));
      cpu::AvgPoolBackward(host, s, dy.data(), dx.data(), write);
      this->ExpectElement(dx, dx_, "avg pool backward");
    }
  }
  const int64_t batch = 6, spatial = 49, channels = 64;
  const auto x = TestFixture::RandomT(batch * spatial * channels, 1);
  const auto dy = TestFixture::RandomT(batch * channels, 2);
  auto dx = TestFixture::RandomT(x.size(), 3);
  std::vector<float> y(batch * channels);
  T* x_ = this->UploadT(x);
  T* dy_ = this->UploadT(dy);
  T* y_ = this->AllocT(y.size());
  T* dx_ = this->UploadT(dx);
  ASSERT_OK(cuda::GlobalAvgPoolForward(ctx, batch, spatial, channels, x_, y_));
  cpu::GlobalAvgPoolForward(host, batch, spatial, channels, x.data(), y.data());
  this->ExpectElement(y, y_, "global avg pool");
  for (Write write : {Write::kAccumulate, Write::kOverwrite}) {
    ASSERT_OK(cuda::GlobalAvgPoolBackward(ctx, batch, spatial, channels, dy_, dx_, write));
    cpu::GlobalAvgPoolBackward(host, batch, spatial, channels, dy.data(), dx.data(), write);
    this->ExpectElement(dx, dx_, "global avg pool backward");
    this->Resync(dx, dx_);
  }
}

TYPED_TEST(ReducedKernelTest, BatchNorm) {
  using T = TypeParam;
  const CudaContext& ctx = this->ctx();
  const cpu::CpuContext& host = this->cpu_;
  for (const auto& [rows, channels] : BatchNormShapes()) {
    SCOPED_TRACE(testing::Message() << rows << " x " << channels);
    const auto x = TestFixture::RandomT(rows * channels, 1, -2.f, 3.f);
    const auto dy = TestFixture::RandomT(rows * channels, 4);
    const auto gamma = Random(channels, 2, 0.5f, 1.5f), beta = Random(channels, 3);
    auto running_mean = Random(channels, 5), running_var = Random(channels, 6, 0.5f, 2.f);
    std::vector<float> y(x.size()), save_mean(channels), save_inv_std(channels);
    T* x_ = this->UploadT(x);
    T* dy_ = this->UploadT(dy);
    float* gamma_ = this->Upload(gamma);
    float* beta_ = this->Upload(beta);
    float* rm_ = this->Upload(running_mean);
    float* rv_ = this->Upload(running_var);
    T* y_ = this->AllocT(y.size());
    float* sm_ = this->AllocF(channels);
    float* si_ = this->AllocF(channels);
    ASSERT_OK(cuda::BatchNormForwardTraining(ctx, rows, channels, x_, gamma_, beta_, 1e-3f, 0.9f,
                                             y_, rm_, rv_, sm_, si_));
    cpu::BatchNormForwardTraining(host, rows, channels, x.data(), gamma.data(), beta.data(), 1e-3f,
                                  0.9f, y.data(), running_mean.data(), running_var.data(),
                                  save_mean.data(), save_inv_std.data());
    this->Expect(y, y_, "y (training)", kElementUlps, kNormFloor);
    ExpectClose(running_mean, this->Download(rm_, channels), "running mean");
    ExpectClose(running_var, this->Download(rv_, channels), "running var");
    ExpectClose(save_mean, this->Download(sm_, channels), "saved mean");
    ExpectClose(save_inv_std, this->Download(si_, channels), "saved inverse std");

    ASSERT_OK(cuda::BatchNormForwardInference(ctx, rows, channels, x_, gamma_, beta_, rm_, rv_,
                                              1e-3f, y_));
    cpu::BatchNormForwardInference(host, rows, channels, x.data(), gamma.data(), beta.data(),
                                   running_mean.data(), running_var.data(), 1e-3f, y.data());
    this->Expect(y, y_, "y (inference)", kElementUlps, kNormFloor);

    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      auto dx = TestFixture::RandomT(x.size(), 7);
      auto dgamma = Random(channels, 8), dbeta = Random(channels, 9);
      T* dx_ = this->UploadT(dx);
      float* dg_ = this->Upload(dgamma);
      float* db_ = this->Upload(dbeta);
      ASSERT_OK(cuda::BatchNormBackward(ctx, rows, channels, x_, dy_, gamma_, sm_, si_, dx_, write,
                                        dg_, db_, write));
      cpu::BatchNormBackward(host, rows, channels, x.data(), dy.data(), gamma.data(),
                             save_mean.data(), save_inv_std.data(), dx.data(), write, dgamma.data(),
                             dbeta.data(), write);
      this->Expect(dx, dx_, "dx", kElementUlps, kNormFloor);
      ExpectClose(dgamma, this->Download(dg_, channels), "dgamma");
      ExpectClose(dbeta, this->Download(db_, channels), "dbeta");
    }
  }
}

TYPED_TEST(ReducedKernelTest, Embedding) {
  using T = TypeParam;
  const int64_t vocab = 50, dim = 16, num_ids = 400;
  std::vector<float> ids(num_ids);
  for (int64_t i = 0; i < num_ids; ++i) ids[i] = static_cast<float>((i * 13) % (vocab + 3));
  ids[5] = 2.5f;  // Not an id: zeros, no gradient.
  // The table stays fp32 (it is a weight): the lookup rounds it.
  const auto table = Random(vocab * dim, 1), dy = TestFixture::RandomT(num_ids * dim, 2);
  std::vector<float> y(num_ids * dim);
  auto dtable = Random(vocab * dim, 3);
  const CudaContext& ctx = this->ctx();
  float* ids_ = this->Upload(ids);
  float* table_ = this->Upload(table);
  T* dy_ = this->UploadT(dy);
  T* y_ = this->AllocT(y.size());
  ASSERT_OK(cuda::EmbeddingForward(ctx, num_ids, vocab, dim, ids_, table_, y_));
  cpu::EmbeddingForward(this->cpu_, num_ids, vocab, dim, ids.data(), table.data(), y.data());
  this->ExpectElement(y, y_, "embedding");
  for (Write write : {Write::kAccumulate, Write::kOverwrite}) {
    float* dtable_ = this->Upload(dtable);
    ASSERT_OK(cuda::EmbeddingBackward(ctx, num_ids, vocab, dim, ids_, dy_, dtable_, write));
    cpu::EmbeddingBackward(this->cpu_, num_ids, vocab, dim, ids.data(), dy.data(), dtable.data(),
                           write);
    ExpectClose(dtable, this->Download(dtable_, dtable.size()), "dtable");
  }
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
