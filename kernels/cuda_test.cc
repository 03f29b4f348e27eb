// Every CUDA kernel against its CPU twin on random inputs: fp32 results agree
// within 1e-4, relative for values above 1 and absolute below
// (|cpu - gpu| <= 1e-4 * (1 + |cpu|)); bf16 and fp16 activations (the
// ReducedKernelTest suite at the end) within the tolerances stated there.
// Skips, with the reason, where there is no CUDA device.
#include "kernels/cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

// |cpu - gpu| <= tolerance * (scale + |cpu|) element by element (tolerance 0:
// equal), reporting the first five that are not.
void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu,
                 const std::string& what, double tolerance = kTolerance, double scale = 1.0) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!(std::abs(double{cpu[i]} - gpu[i]) <= tolerance * (scale + std::abs(cpu[i])))) {
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
    // From pageable memory the copy may still be in flight when cudaMemcpy
    // returns, and the kernels run on a stream that does not wait for it.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
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

std::string Describe(const WindowShape& s) {
  return absl::StrCat(s.in_h, "x", s.in_w, "x", s.in_c, " kernel ", s.kernel_h, "x", s.kernel_w,
                      " stride ", s.stride_h, "x", s.stride_w, " out ", s.out_h, "x", s.out_w, "x",
                      s.out_c);
}

// The convolution shapes with out_c = in_c, and three 2x2 ones.
std::vector<WindowShape> PoolShapes() {
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
  return shapes;
}

// Batch norm's [rows, channels]: rows of an image batch (batch * H * W) and of
// a dense layer.
std::vector<std::pair<int64_t, int64_t>> BatchNormShapes() {
  return {{8 * 14 * 14, 32}, {64, 128}, {5, 3}, {64 * 32 * 32, 64}, {256 * 4 * 4, 512}, {1000, 70}};
}

TEST_F(CudaKernelTest, Conv2dForwardAndBackward) {
  uint32_t seed = 10;
  for (cuda::ConvLayout layout :
       {cuda::ConvLayout::kNhwc, cuda::ConvLayout::kNchw, cuda::ConvLayout::kAuto}) {
    UseConvLayout(layout);
    for (const WindowShape& s : ConvShapes()) {
      SCOPED_TRACE(testing::Message()
                   << "layout " << static_cast<int>(layout) << " in " << Describe(s));
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
      ASSERT_TRUE(cuda::Conv2dBackward<float>(ctx(), s, x_, w_, dy_, nullptr, Write::kOverwrite,
                                              dw_, nullptr, Write::kOverwrite)
                      .ok());
      cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), nullptr, Write::kOverwrite,
                          dw.data(), nullptr, Write::kOverwrite, workspace.data());
      ExpectClose(dw, Download(dw_, dw.size()), "dw without dx");
    }
  }
}

TEST_F(CudaKernelTest, Pooling) {
  uint32_t seed = 100;
  for (const WindowShape& s : PoolShapes()) {
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
  for (const auto& [rows, channels] : BatchNormShapes()) {
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

// ------------------------------------------------------- bf16 and fp16
//
// Each op with T = __nv_bfloat16 in a kBf16 context and T = __half in a kFp16
// one (a context per test). Inputs are fp32 randoms rounded to T on the host;
// the GPU gets the T values and the CPU twin the same values back in fp32, so
// the two differ only by the GPU's own rounding of results to T. Weights and
// biases of dense layers and convolutions are T values too (the GPU
// multiplies with reduced copies of them), which makes every product exact in
// fp32.
//
// A check is |cpu - gpu| <= ulps * u * (scale + |cpu|), u being T's unit
// roundoff, the largest relative error of one rounding to nearest: 2^-8 for
// bf16 (8 significant bits), 2^-11 for fp16 (11). The results are O(1) (inputs
// in [-1, 1]; sums of K products ~ sqrt(K) / 3), so a wrong kernel (a missing
// bias or accumulate, a wrong index, a wrong scale) is off by O(1) or more:
// several (bf16 filter gradients) to hundreds of times these tolerances. On an
// H200 the worst errors seen were 1u for one rounding (half the allowance)
// and a third of the dense/conv allowance.

template <typename T>
struct Reduced;
template <>
struct Reduced<__nv_bfloat16> {
  using Other = __half;
  static constexpr cuda::ComputePrecision kCompute = cuda::ComputePrecision::kBf16;
  static constexpr double kUnitRoundoff = 1.0 / (1 << 8);
  static __nv_bfloat16 From(float v) { return __float2bfloat16_rn(v); }
  static float To(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <>
struct Reduced<__half> {
  using Other = __nv_bfloat16;
  static constexpr cuda::ComputePrecision kCompute = cuda::ComputePrecision::kFp16;
  static constexpr double kUnitRoundoff = 1.0 / (1 << 11);
  static __half From(float v) { return __float2half_rn(v); }
  static float To(__half v) { return __half2float(v); }
};

// Element-wise ops, pooling, softmax's dlogits, embedding lookups: T loaded,
// fp32 arithmetic, one rounding on store, so |error| <= u |cpu| plus fp32
// noise (a different order of additions, an FMA). Allowed: 2u, with a floor
// of 1% of the O(1) scale for results near zero (that noise; fp16
// subnormals).
constexpr double kElementUlps = 2, kElementFloor = 1e-2;
// Results that need no rounding (ReLU, max pooling, zero): equal.
constexpr double kExact = 0;
// Batch norm's y and dx: as element-wise, but they cancel O(1) terms computed
// from statistics that differ from the CPU's by fp32 noise; floor 1 (as the
// fp32 check's).
constexpr double kNormFloor = 1;
// Dense and convolution results in T: exact products summed in fp32, then one
// rounding, or two where a rounded sum is added to the bias (conv) or to the
// old value (accumulate through a padded copy): each <= u (|cpu| + 1). cuDNN
// and cuBLAS may also round partial sums, of the size of the sum's standard
// deviation sqrt(K) / 3 for K products of values in [-1, 1]. Allowed: 4u
// relative to |cpu| + ProductScale(K). Also the filter gradient, which cuDNN
// returns in T before it is added to the fp32 dw.
constexpr double kProductUlps = 4;
double ProductScale(int64_t k) { return 1.0 + std::sqrt(static_cast<double>(k)) / 3.0; }
// fp32 results computed in fp32 from the same values as the CPU's (bias,
// dense-weight, gamma/beta and embedding gradients; batch norm statistics):
// kTolerance, as in the fp32 tests.

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (false)

template <typename T>
class ReducedKernelTest : public CudaKernelTest {
 protected:
  using R = Reduced<T>;
  static constexpr double u = R::kUnitRoundoff;

  void SetUp() override {
    CudaKernelTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ctx_->compute = R::kCompute;  // Before any op.
  }

  // v rounded to T and back: what both the GPU and the CPU twin see.
  static std::vector<float> Rounded(std::vector<float> v) {
    for (float& x : v) x = R::To(R::From(x));
    return v;
  }
  static std::vector<float> RandomT(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
    return Rounded(Random(n, seed, lo, hi));
  }
  T* AllocT(size_t n) { return Alloc<T>(n); }
  float* AllocF(size_t n) { return Alloc<float>(n); }
  // Uploads v (T values) as T.
  T* UploadT(const std::vector<float>& v) {
    std::vector<T> t(v.size());
    for (size_t i = 0; i < v.size(); ++i) t[i] = R::From(v[i]);
    return Upload(t);
  }
  // n elements of type D (T or the other reduced type) at p, in fp32.
  template <typename D = T>
  std::vector<float> DownloadT(const D* p, size_t n) {
    const std::vector<D> t = Download(p, n);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = Reduced<D>::To(t[i]);
    return v;
  }
  void Expect(const std::vector<float>& cpu, const T* gpu, const std::string& what, double ulps,
              double scale) {
    ExpectClose(cpu, DownloadT(gpu, cpu.size()), what, ulps * u, scale);
  }
  void ExpectElement(const std::vector<float>& cpu, const T* gpu, const std::string& what) {
    Expect(cpu, gpu, what, kElementUlps, kElementFloor);
  }
  // The CPU twin goes on from the GPU's (checked, rounded) values, where an op
  // reads back what the previous one wrote.
  void Resync(std::vector<float>& cpu, const T* gpu) { cpu = DownloadT(gpu, cpu.size()); }
};

struct ReducedNames {
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, __half> ? "Fp16" : "Bf16";
  }
};
using ReducedTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(ReducedKernelTest, ReducedTypes, ReducedNames);

TEST_F(CudaKernelTest, ReducedActivationsNeedAReducedContext) {
  float* w = Alloc<float>(12);
  const auto code = [&](auto* x, auto* y) {
    return cuda::DenseForward(ctx(), 2, 3, 4, x, w, nullptr, y).code();
  };
  EXPECT_EQ(code(Alloc<__nv_bfloat16>(6), Alloc<__nv_bfloat16>(8)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Alloc<__half>(6), Alloc<__half>(8)), absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(ReducedKernelTest, ActivationsOfAnotherTypeAreInvalidArgument) {
  using T = TypeParam;
  using Other = typename Reduced<T>::Other;
  const WindowShape s = ConvShapes()[2];
  const size_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  const size_t w_n = s.out_c * s.patch_elements();
  float* x = this->AllocF(in_n);
  float* y = this->AllocF(out_n);
  float* w = this->AllocF(w_n);
  float* dw = this->AllocF(w_n);
  const cuda::CudaContext& ctx = this->ctx();
  ASSERT_EQ(cudaMemsetAsync(x, 0, in_n * sizeof(float), ctx.stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(w, 0, w_n * sizeof(float), ctx.stream), cudaSuccess);
  const auto invalid = absl::StatusCode::kInvalidArgument;
  // Dense [batch, 5] x [5, 4] in the same buffers.
  EXPECT_EQ(cuda::DenseForward<float>(ctx, s.batch, 5, 4, x, w, nullptr, y).code(), invalid);
  EXPECT_EQ(cuda::DenseBackward<float>(ctx, s.batch, 5, 4, x, w, y, x, Write::kOverwrite, dw,
                                       nullptr, Write::kOverwrite)
                .code(),
            invalid);
  EXPECT_EQ(cuda::Conv2dForward<float>(ctx, s, x, w, nullptr, y).code(), invalid);
  EXPECT_EQ(cuda::Conv2dBackward<float>(ctx, s, x, w, y, x, Write::kOverwrite, dw, nullptr,
                                        Write::kOverwrite)
                .code(),
            invalid);
  auto* xo = reinterpret_cast<Other*>(x);
  auto* yo = reinterpret_cast<Other*>(y);
  EXPECT_EQ(cuda::DenseForward<Other>(ctx, s.batch, 5, 4, xo, w, nullptr, yo).code(), invalid);
  EXPECT_EQ(cuda::Conv2dForward<Other>(ctx, s, xo, w, nullptr, yo).code(), invalid);
  // The context's own type, on the same (zeroed) buffers, is fine.
  auto* xt = reinterpret_cast<T*>(x);
  auto* yt = reinterpret_cast<T*>(y);
  ASSERT_OK(cuda::DenseForward<T>(ctx, s.batch, 5, 4, xt, w, nullptr, yt));
  ASSERT_OK(cuda::Conv2dForward<T>(ctx, s, xt, w, nullptr, yt));
}

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
    const cuda::CudaContext& ctx = this->ctx();
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
  const cuda::CudaContext& ctx = this->ctx();
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

TYPED_TEST(ReducedKernelTest, Conv2dForwardAndBackward) {
  using T = TypeParam;
  const cuda::CudaContext& ctx = this->ctx();
  uint32_t seed = 10;
  for (const WindowShape& s : ConvShapes()) {
    SCOPED_TRACE(Describe(s));
    const auto x = TestFixture::RandomT(s.batch * s.in_elements(), ++seed);
    const auto w = TestFixture::RandomT(s.out_c * s.patch_elements(), ++seed);
    const auto bias = TestFixture::RandomT(s.out_c, ++seed);
    const auto dy = TestFixture::RandomT(s.batch * s.out_elements(), ++seed);
    std::vector<float> workspace(cpu::Conv2dWorkspaceElements(s));
    T* x_ = this->UploadT(x);
    float* w_ = this->Upload(w);
    float* bias_ = this->Upload(bias);
    T* dy_ = this->UploadT(dy);
    T* y_ = this->AllocT(dy.size());
    const double forward_scale = ProductScale(s.patch_elements());
    for (const auto& [with_bias, relu] :
         std::vector<std::pair<bool, bool>>{{true, false}, {true, true}, {false, false}}) {
      std::vector<float> y(dy.size());
      ASSERT_OK(cuda::Conv2dForward(ctx, s, x_, w_, with_bias ? bias_ : nullptr, y_, relu));
      cpu::Conv2dForward(this->cpu_, s, x.data(), w.data(), with_bias ? bias.data() : nullptr,
                         y.data(), workspace.data());
      if (relu) cpu::ReluForward(this->cpu_, y.size(), y.data(), y.data());
      const char* what = relu ? "y (relu)" : with_bias ? "y" : "y without bias";
      this->Expect(y, y_, what, kProductUlps, forward_scale);
    }
    // Each input gradient sums at most out_c * kernel_h * kernel_w products,
    // each filter gradient batch * out_h * out_w.
    const double dx_scale = ProductScale(s.out_c * s.kernel_h * s.kernel_w);
    const double dw_scale = ProductScale(s.batch * s.out_h * s.out_w);
    const double dw_tolerance = kProductUlps * TestFixture::u;
    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      auto dx = TestFixture::RandomT(x.size(), ++seed);
      auto dw = Random(w.size(), ++seed), db = Random(bias.size(), ++seed);
      T* dx_ = this->UploadT(dx);
      float* dw_ = this->Upload(dw);
      float* db_ = this->Upload(db);
      ASSERT_OK(cuda::Conv2dBackward(ctx, s, x_, w_, dy_, dx_, write, dw_, db_, write));
      cpu::Conv2dBackward(this->cpu_, s, x.data(), w.data(), dy.data(), dx.data(), write, dw.data(),
                          db.data(), write, workspace.data());
      this->Expect(dx, dx_, "dx", kProductUlps, dx_scale);
      ExpectClose(dw, this->Download(dw_, dw.size()), "dw", dw_tolerance, dw_scale);
      ExpectClose(db, this->Download(db_, db.size()), "dbias");
    }
    // No input gradient (first layer), no bias.
    auto dw = Random(w.size(), ++seed);
    float* dw_ = this->Upload(dw);
    ASSERT_OK(cuda::Conv2dBackward<T>(ctx, s, x_, w_, dy_, nullptr, Write::kOverwrite, dw_, nullptr,
                                      Write::kOverwrite));
    cpu::Conv2dBackward(this->cpu_, s, x.data(), w.data(), dy.data(), nullptr, Write::kOverwrite,
                        dw.data(), nullptr, Write::kOverwrite, workspace.data());
    ExpectClose(dw, this->Download(dw_, dw.size()), "dw without dx", dw_tolerance, dw_scale);
  }
}

TYPED_TEST(ReducedKernelTest, ElementWise) {
  using T = TypeParam;
  const cuda::CudaContext& ctx = this->ctx();
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
  const cuda::CudaContext& ctx = this->ctx();
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
  const cuda::CudaContext& ctx = this->ctx();
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
  const cuda::CudaContext& ctx = this->ctx();
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
  const cuda::CudaContext& ctx = this->ctx();
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
}  // namespace kernels
}  // namespace downpour
