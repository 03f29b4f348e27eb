// What the tests of kernels/cuda share: random inputs, the comparison with
// the CPU twin, the fixture that gives each test a context on device 0 (and
// skips, with the reason, where there is no CUDA device), the shapes the
// layer tests run, and the bf16/fp16 fixture with its tolerances.
//
// The fixture's contexts compute fp32 strictly (Tf32Policy::kOff, not the
// context's default): fp32 results agree with the CPU twin within 1e-4,
// relative for values above 1 and absolute below (|cpu - gpu| <= 1e-4 *
// (1 + |cpu|)); bf16 and fp16 activations within the tolerances stated at
// ReducedKernelTest. A test of TF32 sets ctx_->tf32 itself, and checks
// within kTf32Ulps.
//
// Test-only; a fixture is used by its test's thread.
#ifndef DOWNPOUR_KERNELS_CUDA_TEST_UTIL_H_
#define DOWNPOUR_KERNELS_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/layers.h"
#include "kernels/cuda/context.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {

inline constexpr double kTolerance = 1e-4;

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f);

// |cpu - gpu| <= tolerance * (scale + |cpu|) element by element (tolerance 0:
// equal), reporting the first five that are not.
void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu,
                 const std::string& what, double tolerance = kTolerance, double scale = 1.0);

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (false)
#define EXPECT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    EXPECT_TRUE(status_.ok()) << status_; \
  } while (false)

// TF32 products (Tf32Policy): each input rounded to 11 significant bits
// (unit roundoff 2^-11), summed in fp32, so a result of K products of
// values in [-1, 1] is off by about 2^-11 of ProductScale(K) (ProductScale
// below); allowed: 8 such units relative to |cpu| + ProductScale(K), where
// a wrong kernel is off by O(1).
inline constexpr double kTf32UnitRoundoff = 1.0 / (1 << 11);
inline constexpr double kTf32Ulps = 8;

// Strict fp32 products of values in [-1, 1] summed in another order than
// the CPU's (cuDNN's engines split and block a K-term sum differently per
// kernel): K roundings of 2^-24 of partial sums up to ProductScale(K), a
// random walk of about sqrt(K) such units; allowed: 16 of them relative to
// |cpu| + ProductScale(K), and never less than kTolerance. A kernel in TF32
// is off by about 2^-11 of ProductScale(K), some 30x more for K = 4096.
double Fp32SumTolerance(int64_t k);

// A strict-fp32 context on device 0 and device memory freed after the test.
class CudaKernelTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

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

  // A convolution's operands of shape s: input, filter, bias and output
  // gradient drawn from seeds ++*seed in that order, on the host and
  // uploaded (the names with a trailing underscore).
  struct ConvOperands {
    std::vector<float> x, w, bias, dy;
    float* x_ = nullptr;
    float* w_ = nullptr;
    float* bias_ = nullptr;
    float* dy_ = nullptr;
  };
  ConvOperands RandomConvOperands(const WindowShape& s, uint32_t* seed);

  const CudaContext& ctx() const { return *ctx_; }
  // A fresh strict-fp32 context (no convolution plans yet) whose
  // convolutions run in `layout`.
  void UseConvLayout(ConvLayout layout);

  cpu::CpuContext cpu_;
  std::unique_ptr<CudaContext> ctx_;
  std::vector<void*> allocations_;
};

// Convolution shapes: symmetric SAME, SAME with the odd padding at the
// bottom/right (stride 2), VALID leaving rows unused, explicit asymmetric.
std::vector<WindowShape> ConvShapes();

std::string Describe(const WindowShape& s);

// The convolution shapes with out_c = in_c, and three 2x2 ones.
std::vector<WindowShape> PoolShapes();

// Batch norm's [rows, channels]: rows of an image batch (batch * H * W) and of
// a dense layer.
std::vector<std::pair<int64_t, int64_t>> BatchNormShapes();

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
  static constexpr ComputePrecision kCompute = ComputePrecision::kBf16;
  static constexpr double kUnitRoundoff = 1.0 / (1 << 8);
  static __nv_bfloat16 From(float v) { return __float2bfloat16_rn(v); }
  static float To(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <>
struct Reduced<__half> {
  using Other = __nv_bfloat16;
  static constexpr ComputePrecision kCompute = ComputePrecision::kFp16;
  static constexpr double kUnitRoundoff = 1.0 / (1 << 11);
  static __half From(float v) { return __float2half_rn(v); }
  static float To(__half v) { return __half2float(v); }
};

// Element-wise ops, pooling, softmax's dlogits, embedding lookups: T loaded,
// fp32 arithmetic, one rounding on store, so |error| <= u |cpu| plus fp32
// noise (a different order of additions, an FMA). Allowed: 2u, with a floor
// of 1% of the O(1) scale for results near zero (that noise; fp16
// subnormals).
inline constexpr double kElementUlps = 2, kElementFloor = 1e-2;
// Results that need no rounding (ReLU, max pooling, zero): equal.
inline constexpr double kExact = 0;
// Batch norm's y and dx: as element-wise, but they cancel O(1) terms computed
// from statistics that differ from the CPU's by fp32 noise; floor 1 (as the
// fp32 check's).
inline constexpr double kNormFloor = 1;
// Dense and convolution results in T: exact products summed in fp32, then one
// rounding, or two where a rounded sum is added to the bias (conv) or to the
// old value (accumulate through a padded copy): each <= u (|cpu| + 1). cuDNN
// and cuBLAS may also round partial sums, of the size of the sum's standard
// deviation sqrt(K) / 3 for K products of values in [-1, 1]. Allowed: 4u
// relative to |cpu| + ProductScale(K). Also the filter gradient, which cuDNN
// returns in T before it is added to the fp32 dw.
inline constexpr double kProductUlps = 4;
double ProductScale(int64_t k);
// fp32 results computed in fp32 from the same values as the CPU's (bias,
// dense-weight, gamma/beta and embedding gradients; batch norm statistics):
// kTolerance, as in the fp32 tests.

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

}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_TEST_UTIL_H_
