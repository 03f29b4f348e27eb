#include "kernels/cuda/test_util.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {

std::vector<float> Random(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu,
                 const std::string& what, double tolerance, double scale) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!(std::abs(double{cpu[i]} - gpu[i]) <= tolerance * (scale + std::abs(cpu[i])))) {
      ADD_FAILURE() << what << "[" << i << "]: cpu " << cpu[i] << " gpu " << gpu[i];
      if (++reported == 5) return;
    }
  }
}

void CudaKernelTest::SetUp() {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << CudaUnavailableReason();
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ctx_ = std::move(ctx).value();
  ctx_->tf32 = Tf32Policy::kOff;
}

void CudaKernelTest::TearDown() {
  if (ctx_ != nullptr) {
    EXPECT_TRUE(ctx_->Synchronize().ok());
  }
  for (void* p : allocations_) cudaFree(p);
}

void CudaKernelTest::UseConvLayout(ConvLayout layout) {
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ctx_ = std::move(ctx).value();
  ctx_->tf32 = Tf32Policy::kOff;
  ctx_->conv_layout = layout;
}

CudaKernelTest::ConvOperands CudaKernelTest::RandomConvOperands(const WindowShape& s,
                                                                uint32_t* seed) {
  ConvOperands o;
  o.x = Random(s.batch * s.in_elements(), ++*seed);
  o.w = Random(s.out_c * s.patch_elements(), ++*seed);
  o.bias = Random(s.out_c, ++*seed);
  o.dy = Random(s.batch * s.out_elements(), ++*seed);
  o.x_ = Upload(o.x);
  o.w_ = Upload(o.w);
  o.bias_ = Upload(o.bias);
  o.dy_ = Upload(o.dy);
  return o;
}

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

std::vector<std::pair<int64_t, int64_t>> BatchNormShapes() {
  return {{8 * 14 * 14, 32}, {64, 128}, {5, 3}, {64 * 32 * 32, 64}, {256 * 4 * 4, 512}, {1000, 70}};
}

double ProductScale(int64_t k) { return 1.0 + std::sqrt(static_cast<double>(k)) / 3.0; }

double Fp32SumTolerance(int64_t k) {
  return std::max(kTolerance, 16.0 * std::sqrt(static_cast<double>(k)) / (1 << 24));
}

}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
