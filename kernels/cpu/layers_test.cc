#include "kernels/cpu/layers.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace kernels {
namespace cpu {
namespace {

std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void ExpectNear(const std::vector<double>& want, const float* got, double tol) {
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(want[i], got[i], tol * (1.0 + std::abs(want[i]))) << "at " << i;
  }
}

// Naive double-precision reference: c = alpha * op(a) op(b) + beta * c.
std::vector<double> NaiveGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                              const std::vector<float>& a, const std::vector<float>& b, double beta,
                              const std::vector<float>& c) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      out[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  }
  return out;
}

TEST(GemmTest, MatchesNaiveForEveryTransposeCombination) {
  const CpuContext ctx;
  const int64_t m = 7, n = 5, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = RandomVector(m * k, 1);
      const auto b = RandomVector(k * n, 2);
      auto c = RandomVector(m * n, 3);
      const auto want = NaiveGemm(ta, tb, m, n, k, 0.5, a, b, 2.0, c);
      Gemm(ctx, ta ? Transpose::kYes : Transpose::kNo, tb ? Transpose::kYes : Transpose::kNo, m, n,
           k, 0.5f, a.data(), b.data(), 2.f, c.data());
      ExpectNear(want, c.data(), 1e-5);
    }
  }
}

TEST(GemmTest, BetaZeroIgnoresGarbageInOutput) {
  const CpuContext ctx;
  const auto a = RandomVector(6, 1);
  const auto b = RandomVector(6, 2);
  std::vector<float> c(4, std::nanf(""));
  Gemm(ctx, Transpose::kNo, Transpose::kNo, 2, 2, 3, 1.f, a.data(), b.data(), 0.f, c.data());
  for (float v : c) EXPECT_TRUE(std::isfinite(v));
}

struct DenseCase {
  int64_t batch = 6, in = 11, out = 4;
  std::vector<float> x = RandomVector(batch * in, 10);
  std::vector<float> w = RandomVector(in * out, 11);
  std::vector<float> b = RandomVector(out, 12);
  std::vector<float> dy = RandomVector(batch * out, 13);
};

TEST(DenseTest, ForwardMatchesNaive) {
  const CpuContext ctx;
  DenseCase d;
  std::vector<double> want(d.batch * d.out);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t j = 0; j < d.out; ++j) {
      double s = d.b[j];
      for (int64_t i = 0; i < d.in; ++i) s += double{d.x[r * d.in + i]} * d.w[i * d.out + j];
      want[r * d.out + j] = s;
    }
  }
  std::vector<float> y(d.batch * d.out, std::nanf(""));
  DenseForward(ctx, d.batch, d.in, d.out, d.x.data(), d.w.data(), d.b.data(), y.data());
  ExpectNear(want, y.data(), 1e-5);

  // Without a bias.
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t j = 0; j < d.out; ++j) want[r * d.out + j] -= d.b[j];
  }
  std::fill(y.begin(), y.end(), std::nanf(""));
  DenseForward(ctx, d.batch, d.in, d.out, d.x.data(), d.w.data(), nullptr, y.data());
  ExpectNear(want, y.data(), 1e-5);
}

TEST(DenseTest, BackwardMatchesNaiveOverwriteAndAccumulate) {
  const CpuContext ctx;
  DenseCase d;
  std::vector<double> dx(d.batch * d.in), dw(d.in * d.out), db(d.out);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t j = 0; j < d.out; ++j) {
      const double g = d.dy[r * d.out + j];
      db[j] += g;
      for (int64_t i = 0; i < d.in; ++i) {
        dx[r * d.in + i] += g * d.w[i * d.out + j];
        dw[i * d.out + j] += g * d.x[r * d.in + i];
      }
    }
  }
  std::vector<float> gx(dx.size(), std::nanf("")), gw(dw.size(), std::nanf("")),
      gb(db.size(), std::nanf(""));
  DenseBackward(ctx, d.batch, d.in, d.out, d.x.data(), d.w.data(), d.dy.data(), gx.data(),
                Write::kOverwrite, gw.data(), gb.data(), Write::kOverwrite);
  ExpectNear(dx, gx.data(), 1e-5);
  ExpectNear(dw, gw.data(), 1e-5);
  ExpectNear(db, gb.data(), 1e-5);

  // A second call that accumulates doubles everything.
  DenseBackward(ctx, d.batch, d.in, d.out, d.x.data(), d.w.data(), d.dy.data(), gx.data(),
                Write::kAccumulate, gw.data(), gb.data(), Write::kAccumulate);
  for (auto* v : {&dx, &dw, &db}) {
    for (double& e : *v) e *= 2;
  }
  ExpectNear(dx, gx.data(), 1e-5);
  ExpectNear(dw, gw.data(), 1e-5);
  ExpectNear(db, gb.data(), 1e-5);

  // dx and dbias are optional.
  DenseBackward(ctx, d.batch, d.in, d.out, d.x.data(), d.w.data(), d.dy.data(), nullptr,
                Write::kOverwrite, gw.data(), nullptr, Write::kOverwrite);
  for (double& e : dw) e /= 2;
  ExpectNear(dw, gw.data(), 1e-5);
}

TEST(ReluTest, ForwardAndBackwardMatchNaive) {
  const CpuContext ctx;
  const auto x = RandomVector(100, 5);
  const auto dy = RandomVector(100, 6);
  std::vector<float> y(100), dx(100, 1.f);
  ReluForward(ctx, 100, x.data(), y.data());
  ReluBackward(ctx, 100, x.data(), dy.data(), dx.data(), Write::kAccumulate);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(y[i], x[i] > 0 ? x[i] : 0.f);
    EXPECT_FLOAT_EQ(dx[i], 1.f + (x[i] > 0 ? dy[i] : 0.f));
  }
  ReluBackward(ctx, 100, x.data(), dy.data(), dx.data(), Write::kOverwrite);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(dx[i], x[i] > 0 ? dy[i] : 0.f);
}

TEST(DropoutTest, KeepsAboutOneMinusRateAndScales) {
  const CpuContext ctx;
  const int64_t n = 100000;
  const std::vector<float> x(n, 1.f);
  std::vector<float> y(n);
  std::vector<uint8_t> mask(n);
  DropoutForward(ctx, n, 0.25f, 42, 7, x.data(), y.data(), mask.data());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(mask[i] == 0 || mask[i] == 1);
    EXPECT_FLOAT_EQ(y[i], mask[i] ? 1.f / 0.75f : 0.f);
    kept += mask[i];
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.75, 0.01);
}

TEST(DropoutTest, MaskDependsOnlyOnSeedAndStep) {
  const CpuContext ctx;
  const int64_t n = 1000;
  const auto x = RandomVector(n, 1);
  std::vector<float> y1(n), y2(n), y3(n), y4(n);
  std::vector<uint8_t> m1(n), m2(n), m3(n), m4(n);
  DropoutForward(ctx, n, 0.5f, 1, 3, x.data(), y1.data(), m1.data());
  DropoutForward(ctx, n, 0.5f, 1, 3, x.data(), y2.data(), m2.data());
  DropoutForward(ctx, n, 0.5f, 1, 4, x.data(), y3.data(), m3.data());
  DropoutForward(ctx, n, 0.5f, 2, 3, x.data(), y4.data(), m4.data());
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(y1, y2);
  EXPECT_NE(m1, m3);
  EXPECT_NE(m1, m4);
}

TEST(DropoutTest, BackwardUsesTheMask) {
  const CpuContext ctx;
  const int64_t n = 1000;
  const auto x = RandomVector(n, 1);
  const auto dy = RandomVector(n, 2);
  std::vector<float> y(n), dx(n, 0.5f);
  std::vector<uint8_t> mask(n);
  DropoutForward(ctx, n, 0.3f, 9, 0, x.data(), y.data(), mask.data());
  DropoutBackward(ctx, n, 0.3f, mask.data(), dy.data(), dx.data(), Write::kAccumulate);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(dx[i], 0.5f + (mask[i] ? dy[i] / 0.7f : 0.f), 1e-6);
  }
}

TEST(DropoutTest, RateZeroIsIdentity) {
  const CpuContext ctx;
  const auto x = RandomVector(50, 1);
  std::vector<float> y(50);
  std::vector<uint8_t> mask(50);
  DropoutForward(ctx, 50, 0.f, 1, 1, x.data(), y.data(), mask.data());
  EXPECT_EQ(x, y);
}

// Double-precision softmax cross-entropy reference.
void NaiveSoftmaxCe(int64_t batch, int64_t classes, const std::vector<float>& logits,
                    const std::vector<int32_t>& labels, double* loss_sum, int64_t* correct,
                    std::vector<double>* dlogits) {
  *loss_sum = 0;
  *correct = 0;
  dlogits->assign(batch * classes, 0);
  for (int64_t r = 0; r < batch; ++r) {
    double sum = 0;
    int64_t argmax = 0;
    for (int64_t j = 0; j < classes; ++j) {
      sum += std::exp(double{logits[r * classes + j]});
      if (logits[r * classes + j] > logits[r * classes + argmax]) argmax = j;
    }
    *loss_sum -= std::log(std::exp(double{logits[r * classes + labels[r]]}) / sum);
    if (argmax == labels[r]) ++*correct;
    for (int64_t j = 0; j < classes; ++j) {
      (*dlogits)[r * classes + j] =
          (std::exp(double{logits[r * classes + j]}) / sum - (j == labels[r])) / batch;
    }
  }
}

TEST(SoftmaxCrossEntropyTest, MatchesNaive) {
  const CpuContext ctx;
  const int64_t batch = 16, classes = 10;
  const auto logits = RandomVector(batch * classes, 3, -4.f, 4.f);
  std::vector<int32_t> labels(batch);
  for (int64_t r = 0; r < batch; ++r) labels[r] = static_cast<int32_t>((r * 7) % classes);
  double want_loss;
  int64_t want_correct;
  std::vector<double> want_grad;
  NaiveSoftmaxCe(batch, classes, logits, labels, &want_loss, &want_correct, &want_grad);

  std::vector<float> grad(batch * classes);
  LossStats stats;
  SoftmaxCrossEntropy(ctx, batch, classes, logits.data(), labels.data(), grad.data(), &stats);
  EXPECT_NEAR(stats.loss_sum, want_loss, 1e-5 * want_loss);
  EXPECT_EQ(stats.correct, want_correct);
  ExpectNear(want_grad, grad.data(), 1e-5);

  // Without dlogits, the stats are the same.
  LossStats only;
  SoftmaxCrossEntropy(ctx, batch, classes, logits.data(), labels.data(), nullptr, &only);
  EXPECT_EQ(only.loss_sum, stats.loss_sum);
  EXPECT_EQ(only.correct, stats.correct);
}

TEST(SoftmaxCrossEntropyTest, HugeLogitsStayFinite) {
  const CpuContext ctx;
  // Row 0: label wins by far. Row 1: label loses by 2e4. Row 2: all equal, huge.
  const std::vector<float> logits = {1e4f, -1e4f, 0.f,  //
                                     1e4f, -1e4f, 0.f,  //
                                     1e4f, 1e4f,  1e4f};
  const std::vector<int32_t> labels = {0, 1, 2};
  std::vector<float> grad(9);
  LossStats stats;
  SoftmaxCrossEntropy(ctx, 3, 3, logits.data(), labels.data(), grad.data(), &stats);
  ASSERT_TRUE(std::isfinite(stats.loss_sum));
  // 0 + 2e4 + log(3).
  EXPECT_NEAR(stats.loss_sum, 2e4 + std::log(3.0), 1e-3);
  EXPECT_EQ(stats.correct, 1);  // Row 2's argmax is the first max, class 0.
  for (int64_t r = 0; r < 3; ++r) {
    float row_sum = 0;
    for (int64_t j = 0; j < 3; ++j) {
      ASSERT_TRUE(std::isfinite(grad[r * 3 + j]));
      row_sum += grad[r * 3 + j];
    }
    EXPECT_NEAR(row_sum, 0.f, 1e-6);
  }
  EXPECT_NEAR(grad[0], 0.f, 1e-7);
  EXPECT_NEAR(grad[3], 1.f / 3, 1e-6);
  EXPECT_NEAR(grad[4], -1.f / 3, 1e-6);
  EXPECT_NEAR(grad[8], (1.f / 3 - 1.f) / 3, 1e-6);
}

TEST(CopyOrAddTest, OverwritesOrAdds) {
  const CpuContext ctx;
  const std::vector<float> x = {1, 2, 3};
  std::vector<float> y = {10, 20, 30};
  CopyOrAdd(ctx, 3, x.data(), y.data(), Write::kAccumulate);
  EXPECT_EQ(y, (std::vector<float>{11, 22, 33}));
  CopyOrAdd(ctx, 3, x.data(), y.data(), Write::kOverwrite);
  EXPECT_EQ(y, x);
  Zero(ctx, 3, y.data());
  EXPECT_EQ(y, (std::vector<float>{0, 0, 0}));
}

TEST(SetCpuThreadsTest, GemmStillCorrectWithOneThread) {
  SetCpuThreads(1);
  const CpuContext ctx;
  const auto a = RandomVector(64 * 64, 1);
  const auto b = RandomVector(64 * 64, 2);
  std::vector<float> c(64 * 64);
  Gemm(ctx, Transpose::kNo, Transpose::kNo, 64, 64, 64, 1.f, a.data(), b.data(), 0.f, c.data());
  ExpectNear(NaiveGemm(false, false, 64, 64, 64, 1, a, b, 0, c), c.data(), 1e-4);
  SetCpuThreads(2);
}

// Direct double-precision convolution, the definition in layers.h.
std::vector<double> NaiveConv(const WindowShape& s, const std::vector<float>& x,
                              const std::vector<float>& w, const std::vector<float>& bias) {
  std::vector<double> y(s.batch * s.out_elements());
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t oh = 0; oh < s.out_h; ++oh)
      for (int64_t ow = 0; ow < s.out_w; ++ow)
        for (int64_t f = 0; f < s.out_c; ++f) {
          double sum = bias[f];
          for (int64_t i = 0; i < s.kernel_h; ++i)
            for (int64_t j = 0; j < s.kernel_w; ++j)
              for (int64_t c = 0; c < s.in_c; ++c) {
                const int64_t ih = oh * s.stride_h - s.pad_top + i;
                const int64_t iw = ow * s.stride_w - s.pad_left + j;
                if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
                sum +=
                    static_cast<double>(w[((f * s.kernel_h + i) * s.kernel_w + j) * s.in_c + c]) *
                    x[((n * s.in_h + ih) * s.in_w + iw) * s.in_c + c];
              }
          y[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + f] = sum;
        }
  return y;
}

TEST(Conv2dTest, ForwardMatchesDirectConvolutionWithStrideAndAsymmetricPadding) {
  WindowShape s;
  s.batch = 2;
  s.in_h = 7, s.in_w = 6, s.in_c = 3;
  s.kernel_h = 3, s.kernel_w = 2;
  s.stride_h = 2, s.stride_w = 1;
  s.pad_top = 1, s.pad_left = 0;
  s.out_h = 4, s.out_w = 6, s.out_c = 5;  // Bottom padding 1, right padding 1.
  ASSERT_EQ(s.pad_bottom(), 1);
  ASSERT_EQ(s.pad_right(), 1);
  const auto x = RandomVector(s.batch * s.in_elements(), 1);
  const auto w = RandomVector(s.out_c * s.patch_elements(), 2);
  const auto bias = RandomVector(s.out_c, 3);
  std::vector<float> y(s.batch * s.out_elements());
  std::vector<float> workspace(Conv2dWorkspaceElements(s));
  Conv2dForward(CpuContext{}, s, x.data(), w.data(), bias.data(), y.data(), workspace.data());
  ExpectNear(NaiveConv(s, x, w, bias), y.data(), 1e-5);
}

TEST(PoolTest, MaxAndAverageOfAPaddedWindow) {
  // One 3x3 single-channel image, window 2, stride 2, SAME: output 2x2, the
  // last row and column of windows half in the padding.
  WindowShape s;
  s.batch = 1;
  s.in_h = s.in_w = 3;
  s.in_c = s.out_c = 1;
  s.kernel_h = s.kernel_w = 2;
  s.stride_h = s.stride_w = 2;
  s.out_h = s.out_w = 2;
  const std::vector<float> x = {1, -2, 3, 4, 5, -6, 7, 8, -9};
  std::vector<float> y(4);
  MaxPoolForward(CpuContext{}, s, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{5, 3, 8, -9}));
  AvgPoolForward(CpuContext{}, s, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{2, -1.5f, 7.5f, -9}));
  std::vector<float> dx(9, 1.f);
  const std::vector<float> dy = {1, 2, 3, 4};
  MaxPoolBackward(CpuContext{}, s, x.data(), dy.data(), dx.data(), Write::kAccumulate);
  EXPECT_EQ(dx, (std::vector<float>{1, 1, 3, 1, 2, 1, 1, 4, 5}));
  AvgPoolBackward(CpuContext{}, s, dy.data(), dx.data(), Write::kOverwrite);
  EXPECT_EQ(dx, (std::vector<float>{0.25f, 0.25f, 1, 0.25f, 0.25f, 1, 1.5f, 1.5f, 4}));
}

TEST(EmbeddingTest, GatherAndScatterAdd) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};  // vocab 3, dim 2
  const std::vector<float> ids = {2, 0, 2, 3, 0.5f};        // The last two are not ids.
  std::vector<float> y(10, -1.f);
  EmbeddingForward(CpuContext{}, 5, 3, 2, ids.data(), table.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{20, 21, 0, 1, 20, 21, 0, 0, 0, 0}));
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> dtable(6, 100.f);
  EmbeddingBackward(CpuContext{}, 5, 3, 2, ids.data(), dy.data(), dtable.data(), Write::kOverwrite);
  EXPECT_EQ(dtable, (std::vector<float>{3, 4, 0, 0, 6, 8}));
}

// Two examples of one table of 2 rows (dim 2): example 0 reads rows 1, 0,
// 1; example 1 reads row 0. The table's slot follows a dense slot of
// width 1.
struct TwoExamples {
  const std::vector<int32_t> offsets = {0, 3, 4}, index = {1, 0, 1, 0};
  const std::vector<int32_t> row_reads = {0, 2, 4}, readers = {0, 1, 0, 0};
  std::vector<float> grads = std::vector<float>(4, -1.f);
  std::vector<float> features = std::vector<float>(2 * 3, 7.f);
  const std::vector<float> features_grad = {0, 0, 1, 2, 3, 4};

  PooledTable Table() {
    PooledTable table;
    table.dim = 2;
    table.slot = 2 * 1;
    table.rows = 2;
    table.offsets = offsets.data();
    table.index = index.data();
    table.row_reads = row_reads.data();
    table.readers = readers.data();
    table.grads = grads.data();
    return table;
  }
};

// SUM, then MEAN.
TEST(PoolRowsTest, SumsMeansAndRowGradients) {
  TwoExamples reads;
  const std::vector<float> values = {1, 2, 10, 20};
  PooledTable table = reads.Table();
  table.values = values.data();
  PoolRows(CpuContext{}, 2, 1, &table, reads.features.data());
  EXPECT_EQ(reads.features, (std::vector<float>{7, 7, 21, 42, 1, 2}));
  PoolRowsBackward(CpuContext{}, 1, &table, reads.features_grad.data());
  EXPECT_EQ(reads.grads, (std::vector<float>{1 + 3, 2 + 4, 2, 4}));
  table.mean = 1;
  PoolRows(CpuContext{}, 2, 1, &table, reads.features.data());
  EXPECT_EQ(reads.features, (std::vector<float>{7, 7, 7, 14, 1, 2}));
  PoolRowsBackward(CpuContext{}, 1, &table, reads.features_grad.data());
  EXPECT_EQ(reads.grads, (std::vector<float>{1.f / 3 + 3, 2.f / 3 + 4, 2.f / 3, 4.f / 3}));
}

// The same reads from a store: rows 0 and 1 at places 2 and 0 of a store
// of 3, row 1's values written there as fresh before pooling, row 0's
// already there (place 1 is another row's, not read).
TEST(PoolRowsTest, AStoredTableReadsItsRowsByPlaceAfterItsFreshOnesAreWritten) {
  TwoExamples reads;
  std::vector<float> store = {-1, -1, 50, 60, 1, 2};
  const std::vector<int32_t> places = {2, 0}, fresh_places = {0};
  const std::vector<float> fresh_values = {10, 20};
  PooledTable table = reads.Table();
  table.store = store.data();
  table.places = places.data();
  table.fresh = 1;
  table.fresh_places = fresh_places.data();
  table.fresh_values = fresh_values.data();
  PoolRows(CpuContext{}, 2, 1, &table, reads.features.data());
  EXPECT_EQ(reads.features, (std::vector<float>{7, 7, 21, 42, 1, 2}));
  EXPECT_EQ(store, (std::vector<float>{10, 20, 50, 60, 1, 2}));
  PoolRowsBackward(CpuContext{}, 1, &table, reads.features_grad.data());
  EXPECT_EQ(reads.grads, (std::vector<float>{1 + 3, 2 + 4, 2, 4}));
}

}  // namespace
}  // namespace cpu
}  // namespace kernels
}  // namespace downpour
