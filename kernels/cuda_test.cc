// Every CUDA kernel against its CPU twin on random inputs: fp32 results agree
// within 1e-4, relative for values above 1 and absolute below
// (|cpu - gpu| <= 1e-4 * (1 + |cpu|)). Skips, with the reason, where there is
// no CUDA device.
#include "kernels/cuda.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu.h"
#include "kernels/optimizer.h"

namespace downpour {
namespace kernels {
namespace {

constexpr double kTolerance = 1e-4;

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu,
                 const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::abs(cpu[i] - gpu[i]) > kTolerance * (1.0 + std::abs(cpu[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: cpu " << cpu[i] << " gpu " << gpu[i];
      if (++reported == 5) return;
    }
  }
}

TEST(CudaDeviceTest, AbsenceIsReportedWithoutCrashing) {
  const int count = cuda::CudaDeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda::CudaAvailable(), count > 0);
  if (count == 0) {
    EXPECT_EQ(cuda::CudaUnavailableReason().rfind("no CUDA device", 0), 0u)
        << cuda::CudaUnavailableReason();
    const auto ctx = cuda::CudaContext::Create(0);
    EXPECT_EQ(ctx.status().code(), absl::StatusCode::kFailedPrecondition) << ctx.status();
  } else {
    EXPECT_EQ(cuda::CudaUnavailableReason(), "");
    EXPECT_FALSE(cuda::CudaDeviceName(0).empty());
    EXPECT_EQ(cuda::CudaContext::Create(count).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

class CudaKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::CudaAvailable()) GTEST_SKIP() << cuda::CudaUnavailableReason();
    auto ctx = cuda::CudaContext::Create(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = std::move(ctx).value();
  }

  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_TRUE(ctx_->Synchronize().ok());
    }
    for (void* p : allocations_) cudaFree(p);
  }

  template <typename T>
  T* Alloc(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* p = Alloc<T>(host.size());
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return p;
  }

  template <typename T>
  std::vector<T> Download(const T* p, size_t n) {
    EXPECT_TRUE(ctx_->Synchronize().ok());
    std::vector<T> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

  const cuda::CudaContext& ctx() const { return *ctx_; }
  // Forgets the convolution plans and runs the next ones in `layout`.
  void UseConvLayout(cuda::ConvLayout layout) {
    ctx_->ForgetConvPlans();
    ctx_->conv_layout = layout;
  }

  cpu::CpuContext cpu_;
  std::unique_ptr<cuda::CudaContext> ctx_;
  std::vector<void*> allocations_;
};

TEST_F(CudaKernelTest, GemmAllTransposes) {
  const int64_t m = 37, n = 29, k = 53;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      const auto a = Random(m * k, 1), b = Random(k * n, 2);
      auto c = Random(m * n, 3);
      float* da = Upload(a);
      float* db = Upload(b);
      float* dc = Upload(c);
      ASSERT_TRUE(cuda::Gemm(ctx(), ta, tb, m, n, k, 0.5f, da, db, 2.f, dc).ok());
      cpu::Gemm(cpu_, ta, tb, m, n, k, 0.5f, a.data(), b.data(), 2.f, c.data());
      ExpectClose(c, Download(dc, c.size()), "gemm");
    }
  }
}

TEST_F(CudaKernelTest, DenseForwardAndBackward) {
  const int64_t batch = 33, in = 70, out = 19;
  const auto x = Random(batch * in, 1), w = Random(in * out, 2), bias = Random(out, 3);
  const auto dy = Random(batch * out, 4);
  std::vector<float> y(batch * out);
  float* dx_ = Upload(x);
  float* dw_ = Upload(w);
  float* db_ = Upload(bias);
  float* dy_ = Upload(dy);
  float* y_ = Alloc<float>(y.size());
  ASSERT_TRUE(cuda::DenseForward(ctx(), batch, in, out, dx_, dw_, db_, y_).ok());
  cpu::DenseForward(cpu_, batch, in, out, x.data(), w.data(), bias.data(), y.data());
  ExpectClose(y, Download(y_, y.size()), "y");

  for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
    auto gx = Random(batch * in, 5), gw = Random(in * out, 6), gb = Random(out, 7);
    float* gx_ = Upload(gx);
    float* gw_ = Upload(gw);
    float* gb_ = Upload(gb);
    ASSERT_TRUE(
        cuda::DenseBackward(ctx(), batch, in, out, dx_, dw_, dy_, gx_, write, gw_, gb_, write)
            .ok());
    cpu::DenseBackward(cpu_, batch, in, out, x.data(), w.data(), dy.data(), gx.data(), write,
                       gw.data(), gb.data(), write);
    ExpectClose(gx, Download(gx_, gx.size()), "dx");
    ExpectClose(gw, Download(gw_, gw.size()), "dw");
    ExpectClose(gb, Download(gb_, gb.size()), "dbias");
  }
}

TEST_F(CudaKernelTest, ElementWise) {
  const int64_t n = 10007;
  const auto x = Random(n, 1), dy = Random(n, 2), other = Random(n, 3);
  float* x_ = Upload(x);
  float* dy_ = Upload(dy);
  float* other_ = Upload(other);
  float* y_ = Alloc<float>(n);
  std::vector<float> y(n);

  ASSERT_TRUE(cuda::ReluForward(ctx(), n, x_, y_).ok());
  cpu::ReluForward(cpu_, n, x.data(), y.data());
  ExpectClose(y, Download(y_, n), "relu");
  std::vector<float> dx = other;
  float* dx_ = Upload(dx);
  ASSERT_TRUE(cuda::ReluBackward(ctx(), n, x_, dy_, dx_, Write::kAccumulate).ok());
  cpu::ReluBackward(cpu_, n, x.data(), dy.data(), dx.data(), Write::kAccumulate);
  ExpectClose(dx, Download(dx_, n), "relu backward");

  std::vector<uint8_t> mask(n);
  uint8_t* mask_ = Alloc<uint8_t>(n);
  ASSERT_TRUE(cuda::DropoutForward(ctx(), n, 0.3f, 42, 7, x_, y_, mask_).ok());
  cpu::DropoutForward(cpu_, n, 0.3f, 42, 7, x.data(), y.data(), mask.data());
  EXPECT_EQ(mask, Download(mask_, n)) << "dropout masks differ";
  ExpectClose(y, Download(y_, n), "dropout");
  ASSERT_TRUE(cuda::DropoutBackward(ctx(), n, 0.3f, mask_, dy_, dx_, Write::kOverwrite).ok());
  cpu::DropoutBackward(cpu_, n, 0.3f, mask.data(), dy.data(), dx.data(), Write::kOverwrite);
  ExpectClose(dx, Download(dx_, n), "dropout backward");

  ASSERT_TRUE(cuda::Add(ctx(), n, x_, other_, y_).ok());
  cpu::Add(cpu_, n, x.data(), other.data(), y.data());
  ExpectClose(y, Download(y_, n), "add");
  ASSERT_TRUE(cuda::CopyOrAdd(ctx(), n, x_, y_, Write::kAccumulate).ok());
  cpu::CopyOrAdd(cpu_, n, x.data(), y.data(), Write::kAccumulate);
  ExpectClose(y, Download(y_, n), "copy or add");
  ASSERT_TRUE(cuda::Zero(ctx(), n, y_).ok());
  ExpectClose(std::vector<float>(n, 0.f), Download(y_, n), "zero");
}

TEST_F(CudaKernelTest, SoftmaxCrossEntropy) {
  const int64_t batch = 300, classes = 10;
  const auto logits = Random(batch * classes, 1, -8.f, 8.f);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7) % classes);
  std::vector<float> dlogits(batch * classes);
  float* logits_ = Upload(logits);
  int32_t* labels_ = Upload(labels);
  float* dlogits_ = Alloc<float>(dlogits.size());
  LossStats gpu, host;
  ASSERT_TRUE(
      cuda::SoftmaxCrossEntropy(ctx(), batch, classes, logits_, labels_, dlogits_, &gpu).ok());
  cpu::SoftmaxCrossEntropy(cpu_, batch, classes, logits.data(), labels.data(), dlogits.data(),
                           &host);
  EXPECT_NEAR(gpu.loss_sum, host.loss_sum, 1e-6 * host.loss_sum);
  EXPECT_EQ(gpu.correct, host.correct);
  ExpectClose(dlogits, Download(dlogits_, dlogits.size()), "dlogits");
}

// Convolution shapes: symmetric SAME, SAME with the odd padding at the
// bottom/right (stride 2), VALID leaving rows unused, explicit asymmetric.
std::vector<WindowShape> ConvShapes() {
  auto make = [](int64_t in_h, int64_t in_w, int64_t in_c, int64_t out_c, int64_t kh, int64_t kw,
                 int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t oh, int64_t ow) {
    WindowShape s;
    s.batch = 3;
    s.in_h = in_h, s.in_w = in_w, s.in_c = in_c, s.out_c = out_c;
    s.kernel_h = kh, s.kernel_w = kw, s.stride_h = sh, s.stride_w = sw;
    s.pad_top = pt, s.pad_left = pl, s.out_h = oh, s.out_w = ow;
    return s;
  };
  return {
      make(28, 28, 1, 32, 3, 3, 1, 1, 1, 1, 28, 28),   // Fashion-MNIST conv1.
      make(14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 14, 14),  // conv2.
      make(9, 8, 3, 5, 3, 3, 2, 2, 1, 0, 5, 4),        // SAME, stride 2: bottom/right odd.
      make(8, 7, 4, 6, 3, 2, 2, 2, 0, 0, 3, 3),        // VALID, last row/col unused.
      make(6, 6, 2, 3, 3, 3, 1, 1, 2, 0, 6, 5),        // Explicit [2, 0, 0, 1].
  };
}

TEST_F(CudaKernelTest, Conv2dForwardAndBackward) {
  uint32_t seed = 10;
  for (cuda::ConvLayout layout :
       {cuda::ConvLayout::kNhwc, cuda::ConvLayout::kNchw, cuda::ConvLayout::kAuto}) {
    UseConvLayout(layout);
    for (const WindowShape& s : ConvShapes()) {
      SCOPED_TRACE(testing::Message()
                   << "layout " << static_cast<int>(layout) << " in " << s.in_h << "x" << s.in_w
                   << "x" << s.in_c << " kernel " << s.kernel_h << "x" << s.kernel_w << " stride "
                   << s.stride_h << " out " << s.out_h << "x" << s.out_w);
      const auto x = Random(s.batch * s.in_elements(), ++seed);
      const auto w = Random(s.out_c * s.patch_elements(), ++seed);
      const auto bias = Random(s.out_c, ++seed);
      const auto dy = Random(s.batch * s.out_elements(), ++seed);
      std::vector<float> workspace(cpu::Conv2dWorkspaceElements(s));
      std::vector<float> y(s.batch * s.out_elements());
      float* x_ = Upload(x);
      float* w_ = Upload(w);
      float* bias_ = Upload(bias);
      float* dy_ = Upload(dy);
      float* y_ = Alloc<float>(y.size());
      const absl::Status forward = cuda::Conv2dForward(ctx(), s, x_, w_, bias_, y_);
      ASSERT_TRUE(forward.ok()) << forward;
      cpu::Conv2dForward(cpu_, s, x.data(), w.data(), bias.data(), y.data(), workspace.data());
      ExpectClose(y, Download(y_, y.size()), "y");

      for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
        auto dx = Random(x.size(), ++seed), dw = Random(w.size(), ++seed),
             db = Random(bias.size(), ++seed);
        float* dx_ = Upload(dx);
        float* dw_ = Upload(dw);
        float* db_ = Upload(db);
        const absl::Status backward =
            cuda::Conv2dBackward(ctx(), s, x_, w_, dy_, dx_, write, dw_, db_, write);
        ASSERT_TRUE(backward.ok()) << backward;
        cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), dx.data(), write, dw.data(),
                            db.data(), write, workspace.data());
        ExpectClose(dx, Download(dx_, dx.size()), "dx");
        ExpectClose(dw, Download(dw_, dw.size()), "dw");
        ExpectClose(db, Download(db_, db.size()), "dbias");
      }
      // No input gradient (first layer), no bias.
      auto dw = Random(w.size(), ++seed);
      float* dw_ = Upload(dw);
      ASSERT_TRUE(cuda::Conv2dBackward(ctx(), s, x_, w_, dy_, nullptr, Write::kOverwrite, dw_,
                                       nullptr, Write::kOverwrite)
                      .ok());
      cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), nullptr, Write::kOverwrite,
                          dw.data(), nullptr, Write::kOverwrite, workspace.data());
      ExpectClose(dw, Download(dw_, dw.size()), "dw without dx");
    }
  }
}

TEST_F(CudaKernelTest, Pooling) {
  std::vector<WindowShape> shapes;
  for (const WindowShape& conv : ConvShapes()) {
    WindowShape s = conv;
    s.out_c = s.in_c;
    shapes.push_back(s);
  }
  WindowShape pool2;  // 2x2 stride 2 SAME on 7x7: the last window half padding.
  pool2.batch = 4, pool2.in_h = pool2.in_w = 7, pool2.in_c = pool2.out_c = 5;
  pool2.kernel_h = pool2.kernel_w = pool2.stride_h = pool2.stride_w = 2;
  pool2.out_h = pool2.out_w = 4;
  shapes.push_back(pool2);
  WindowShape exact = pool2;  // 2x2 stride 2 tiling 8x6 exactly (VGG's, the CNN's).
  exact.in_h = 8, exact.in_w = 6, exact.out_h = 4, exact.out_w = 3;
  shapes.push_back(exact);
  WindowShape gaps = exact;  // 2x2 stride 3: rows and columns in no window.
  gaps.stride_h = gaps.stride_w = 3;
  gaps.out_h = 3, gaps.out_w = 2;
  shapes.push_back(gaps);
  uint32_t seed = 100;
  for (const WindowShape& s : shapes) {
    const auto x = Random(s.batch * s.in_elements(), ++seed);
    const auto dy = Random(s.batch * s.out_elements(), ++seed);
    float* x_ = Upload(x);
    float* dy_ = Upload(dy);
    std::vector<float> y(dy.size());
    float* y_ = Alloc<float>(y.size());
    ASSERT_TRUE(cuda::MaxPoolForward(ctx(), s, x_, y_).ok());
    cpu::MaxPoolForward(cpu_, s, x.data(), y.data());
    ExpectClose(y, Download(y_, y.size()), "max pool");
    ASSERT_TRUE(cuda::AvgPoolForward(ctx(), s, x_, y_).ok());
    cpu::AvgPoolForward(cpu_, s, x.data(), y.data());
    ExpectClose(y, Download(y_, y.size()), "avg pool");
    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      auto dx = Random(x.size(), ++seed);
      float* dx_ = Upload(dx);
      ASSERT_TRUE(cuda::MaxPoolBackward(ctx(), s, x_, dy_, dx_, write).ok());
      cpu::MaxPoolBackward(cpu_, s, x.data(), dy.data(), dx.data(), write);
      ExpectClose(dx, Download(dx_, dx.size()), "max pool backward");
      ASSERT_TRUE(cuda::AvgPoolBackward(ctx(), s, dy_, dx_, write).ok());
      cpu::AvgPoolBackward(cpu_, s, dy.data(), dx.data(), write);
      ExpectClose(dx, Download(dx_, dx.size()), "avg pool backward");
    }
  }
  const int64_t batch = 6, spatial = 49, channels = 64;
  const auto x = Random(batch * spatial * channels, 1), dy = Random(batch * channels, 2);
  std::vector<float> y(batch * channels), dx = Random(x.size(), 3);
  float* x_ = Upload(x);
  float* dy_ = Upload(dy);
  float* y_ = Alloc<float>(y.size());
  float* dx_ = Upload(dx);
  ASSERT_TRUE(cuda::GlobalAvgPoolForward(ctx(), batch, spatial, channels, x_, y_).ok());
  cpu::GlobalAvgPoolForward(cpu_, batch, spatial, channels, x.data(), y.data());
  ExpectClose(y, Download(y_, y.size()), "global avg pool");
  ASSERT_TRUE(
      cuda::GlobalAvgPoolBackward(ctx(), batch, spatial, channels, dy_, dx_, Write::kAccumulate)
          .ok());
  cpu::GlobalAvgPoolBackward(cpu_, batch, spatial, channels, dy.data(), dx.data(),
                             Write::kAccumulate);
  ExpectClose(dx, Download(dx_, dx.size()), "global avg pool backward");
}

TEST_F(CudaKernelTest, BatchNorm) {
  // Rows of an image batch (batch * H * W) and of a dense layer.
  for (const auto& [rows, channels] : std::vector<std::pair<int64_t, int64_t>>{{8 * 14 * 14, 32},
                                                                               {64, 128},
                                                                               {5, 3},
                                                                               {64 * 32 * 32, 64},
                                                                               {256 * 4 * 4, 512},
                                                                               {1000, 70}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << channels);
    const auto x = Random(rows * channels, 1, -2.f, 3.f);
    const auto gamma = Random(channels, 2, 0.5f, 1.5f), beta = Random(channels, 3);
    const auto dy = Random(rows * channels, 4);
    auto running_mean = Random(channels, 5), running_var = Random(channels, 6, 0.5f, 2.f);
    std::vector<float> y(x.size()), save_mean(channels), save_inv_std(channels);
    float* x_ = Upload(x);
    float* gamma_ = Upload(gamma);
    float* beta_ = Upload(beta);
    float* dy_ = Upload(dy);
    float* rm_ = Upload(running_mean);
    float* rv_ = Upload(running_var);
    float* y_ = Alloc<float>(y.size());
    float* sm_ = Alloc<float>(channels);
    float* si_ = Alloc<float>(channels);
    const absl::Status train = cuda::BatchNormForwardTraining(
        ctx(), rows, channels, x_, gamma_, beta_, 1e-3f, 0.9f, y_, rm_, rv_, sm_, si_);
    ASSERT_TRUE(train.ok()) << train;
    cpu::BatchNormForwardTraining(cpu_, rows, channels, x.data(), gamma.data(), beta.data(), 1e-3f,
                                  0.9f, y.data(), running_mean.data(), running_var.data(),
                                  save_mean.data(), save_inv_std.data());
    ExpectClose(y, Download(y_, y.size()), "y (training)");
    ExpectClose(running_mean, Download(rm_, channels), "running mean");
    ExpectClose(running_var, Download(rv_, channels), "running var");
    ExpectClose(save_mean, Download(sm_, channels), "saved mean");
    ExpectClose(save_inv_std, Download(si_, channels), "saved inverse std");

    ASSERT_TRUE(cuda::BatchNormForwardInference(ctx(), rows, channels, x_, gamma_, beta_, rm_, rv_,
                                                1e-3f, y_)
                    .ok());
    cpu::BatchNormForwardInference(cpu_, rows, channels, x.data(), gamma.data(), beta.data(),
                                   running_mean.data(), running_var.data(), 1e-3f, y.data());
    ExpectClose(y, Download(y_, y.size()), "y (inference)");

    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      auto dx = Random(x.size(), 7), dgamma = Random(channels, 8), dbeta = Random(channels, 9);
      float* dx_ = Upload(dx);
      float* dg_ = Upload(dgamma);
      float* dbt_ = Upload(dbeta);
      const absl::Status backward = cuda::BatchNormBackward(ctx(), rows, channels, x_, dy_, gamma_,
                                                            sm_, si_, dx_, write, dg_, dbt_, write);
      ASSERT_TRUE(backward.ok()) << backward;
      cpu::BatchNormBackward(cpu_, rows, channels, x.data(), dy.data(), gamma.data(),
                             save_mean.data(), save_inv_std.data(), dx.data(), write, dgamma.data(),
                             dbeta.data(), write);
      ExpectClose(dx, Download(dx_, dx.size()), "dx");
      ExpectClose(dgamma, Download(dg_, channels), "dgamma");
      ExpectClose(dbeta, Download(dbt_, channels), "dbeta");
    }
  }
}

TEST_F(CudaKernelTest, Embedding) {
  const int64_t vocab = 50, dim = 16, num_ids = 400;
  std::vector<float> ids(num_ids);
  for (int64_t i = 0; i < num_ids; ++i) ids[i] = static_cast<float>((i * 13) % (vocab + 3));
  ids[5] = 2.5f;  // Not an id: zeros, no gradient.
  const auto table = Random(vocab * dim, 1), dy = Random(num_ids * dim, 2);
  std::vector<float> y(num_ids * dim);
  auto dtable = Random(vocab * dim, 3);
  float* ids_ = Upload(ids);
  float* table_ = Upload(table);
  float* dy_ = Upload(dy);
  float* y_ = Alloc<float>(y.size());
  ASSERT_TRUE(cuda::EmbeddingForward(ctx(), num_ids, vocab, dim, ids_, table_, y_).ok());
  cpu::EmbeddingForward(cpu_, num_ids, vocab, dim, ids.data(), table.data(), y.data());
  ExpectClose(y, Download(y_, y.size()), "embedding");
  for (Write write : {Write::kAccumulate, Write::kOverwrite}) {
    float* dtable_ = Upload(dtable);
    ASSERT_TRUE(
        cuda::EmbeddingBackward(ctx(), num_ids, vocab, dim, ids_, dy_, dtable_, write).ok());
    cpu::EmbeddingBackward(cpu_, num_ids, vocab, dim, ids.data(), dy.data(), dtable.data(), write);
    ExpectClose(dtable, Download(dtable_, dtable.size()), "dtable");
  }
}

TEST_F(CudaKernelTest, OptimizersSingleAndFusedMultiTensor) {
  OptimizerHyperparams hp;
  hp.learning_rate = 0.01f;
  hp.weight_decay = 1e-4f;
  hp.step = 3;
  // Sizes straddle the fused kernel's chunk (65536).
  const std::vector<int64_t> sizes = {1, 1000, 70000, 131072 + 5};
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                             OptimizerKind::kAdam}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const int num_slots = NumOptimizerSlots(kind);
    std::vector<std::vector<float>> params, grads, slots0, slots1;
    std::vector<cuda::TensorUpdate> updates;
    uint32_t seed = 1;
    for (int64_t n : sizes) {
      params.push_back(Random(n, ++seed));
      grads.push_back(Random(n, ++seed));
      slots0.push_back(Random(n, ++seed, 0.f, 1.f));
      slots1.push_back(Random(n, ++seed, 0.f, 1.f));
      cuda::TensorUpdate u;
      u.n = n;
      u.param = Upload(params.back());
      u.grad = Upload(grads.back());
      u.slots[0] = Upload(slots0.back());
      u.slots[1] = Upload(slots1.back());
      updates.push_back(u);
    }
    // The first tensor alone, then all of them fused (the first twice).
    ASSERT_TRUE(cuda::ApplyOptimizer(ctx(), kind, hp, updates[0].grad, updates[0].n,
                                     updates[0].param, updates[0].slots)
                    .ok());
    ASSERT_TRUE(cuda::ApplyOptimizerMultiTensor(ctx(), kind, hp, updates).ok());
    for (size_t t = 0; t < sizes.size(); ++t) {
      float* slots[2] = {slots0[t].data(), slots1[t].data()};
      for (int repeat = 0; repeat < (t == 0 ? 2 : 1); ++repeat) {
        ApplyOptimizer(kind, hp, grads[t].data(), sizes[t], params[t].data(), slots);
      }
      ExpectClose(params[t], Download(updates[t].param, sizes[t]), "param");
      if (num_slots >= 1) ExpectClose(slots0[t], Download(updates[t].slots[0], sizes[t]), "slot0");
      if (num_slots >= 2) ExpectClose(slots1[t], Download(updates[t].slots[1], sizes[t]), "slot1");
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace downpour
