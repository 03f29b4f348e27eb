// The fp32 layer ops of layers.h (all but the convolutions, conv_test.cc)
// against their CPU twins on random inputs, in strict fp32, and the GEMM
// under each Tf32Policy (see test_util.h for the tolerances). Skips, with
// the reason, where there is no CUDA device.
#include "kernels/cuda/layers.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/layers.h"
#include "kernels/cuda/test_util.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

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

// GEMMs follow the Tf32Policy: full fp32 unless it allows GEMMs (PyTorch's
// default runs only convolutions on TF32), then within TF32 rounding
// (test_util.h) of the CPU twin. With K = 512, TF32's error (~1e-3 here) is
// several times the strict tolerance, so a policy without GEMMs that used
// TF32 fails the strict check.
TEST_F(CudaKernelTest, GemmFollowsTheTf32Policy) {
  const int64_t m = 64, n = 48, k = 512;
  const auto a = Random(m * k, 11), b = Random(k * n, 12), c0 = Random(m * n, 13);
  float* da = Upload(a);
  float* db = Upload(b);
  std::vector<float> c = c0;
  cpu::Gemm(cpu_, Transpose::kNo, Transpose::kYes, m, n, k, 0.5f, a.data(), b.data(), 2.f,
            c.data());
  for (Tf32Policy policy :
       {Tf32Policy::kOff, Tf32Policy::kConvolutions, Tf32Policy::kConvolutionsAndGemms}) {
    SCOPED_TRACE(testing::Message() << "tf32 policy " << static_cast<int>(policy));
    ctx_->tf32 = policy;
    float* dc = Upload(c0);
    ASSERT_OK(cuda::Gemm(ctx(), Transpose::kNo, Transpose::kYes, m, n, k, 0.5f, da, db, 2.f, dc));
    if (Tf32Gemms(policy)) {
      ExpectClose(c, Download(dc, c.size()), "gemm (tf32)", kTf32Ulps * kTf32UnitRoundoff,
                  ProductScale(k));
    } else {
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

  // Columns [3, 3 + 17) of a [101, 29] matrix into columns [5, 22) of a
  // [101, 40] one, then added back.
  const int64_t rows = 101, width = 17;
  std::vector<float> block(rows * 40, 0.f);
  ASSERT_TRUE(cuda::Zero(ctx(), rows * 40, y_).ok());
  ASSERT_TRUE(cuda::CopyBlock(ctx(), rows, width, x_, 29, 3, y_, 40, 5, Write::kOverwrite).ok());
  cpu::CopyBlock(cpu_, rows, width, x.data(), 29, 3, block.data(), 40, 5, Write::kOverwrite);
  ExpectClose(block, Download(y_, rows * 40), "copy block");
  ASSERT_TRUE(cuda::CopyBlock(ctx(), rows, width, x_, 29, 3, y_, 40, 5, Write::kAccumulate).ok());
  cpu::CopyBlock(cpu_, rows, width, x.data(), 29, 3, block.data(), 40, 5, Write::kAccumulate);
  ExpectClose(block, Download(y_, rows * 40), "add block");
  EXPECT_EQ(block[5], 2.f * x[3]);

  // Pairwise dot products of 27 vectors of 16 per example, and back (within
  // the n elements of the buffers above).
  const int64_t examples = 13, vectors = 27, dim = 16, pairs = vectors * (vectors - 1) / 2;
  ASSERT_LE(examples * vectors * dim, n);
  ASSERT_LE(examples * pairs, n);
  std::vector<float> dots(examples * pairs), back(examples * vectors * dim);
  ASSERT_TRUE(cuda::PairwiseDotForward(ctx(), examples, vectors, dim, x_, y_).ok());
  cpu::PairwiseDotForward(cpu_, examples, vectors, dim, x.data(), dots.data());
  ExpectClose(dots, Download(y_, examples * pairs), "pairwise dot");
  ASSERT_TRUE(cuda::PairwiseDotBackward(ctx(), examples, vectors, dim, x_, dy_, other_).ok());
  cpu::PairwiseDotBackward(cpu_, examples, vectors, dim, x.data(), dy.data(), back.data());
  ExpectClose(back, Download(other_, examples * vectors * dim), "pairwise dot backward");
}

// Sparse pooling of 3 tables (dims 16, 3, 8; SUM and MEAN; examples of 0-9
// ids over up to 50 rows, and one row read by most examples: more reads
// than a warp has lanes) and the rows' gradients: the CPU twin's bits.
TEST_F(CudaKernelTest, PoolRowsAndTheirGradients) {
  const int64_t batch = 300, dims[] = {16, 3, 8}, input_size = 2 + 16 + 3 + 8;
  std::vector<PooledTable> on_cpu(3), on_gpu(3);
  std::vector<std::vector<float>> values(3), grads(3);
  std::vector<std::vector<int32_t>> offsets(3), index(3), row_reads(3), readers(3);
  uint32_t state = 17;
  const auto next = [&state](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return static_cast<int32_t>((state >> 8) % n);
  };
  int64_t slot = 2, most_pool = 0, most_grad = 0;
  for (int t = 0; t < 3; ++t) {
    const int64_t dim = dims[t];
    const int32_t rows = 50 - 10 * t;
    values[t] = Random(rows * dim, 31 + t, -1.f, 1.f);
    offsets[t] = {0};
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t n = next(10);
      for (int32_t k = 0; k < n; ++k) index[t].push_back(k == 0 ? 0 : next(rows));
      offsets[t].push_back(static_cast<int32_t>(index[t].size()));
    }
    row_reads[t].assign(rows + 1, 0);
    for (int32_t r : index[t]) ++row_reads[t][r + 1];
    for (int32_t r = 0; r < rows; ++r) row_reads[t][r + 1] += row_reads[t][r];
    std::vector<int32_t> at(row_reads[t].begin(), row_reads[t].end() - 1);
    readers[t].resize(index[t].size());
    for (int64_t b = 0; b < batch; ++b) {
      for (int32_t k = offsets[t][b]; k < offsets[t][b + 1]; ++k) readers[t][at[index[t][k]]++] = b;
    }
    grads[t].assign(rows * dim, 0.f);
    PooledTable& c = on_cpu[t];
    c.dim = dim;
    c.slot = batch * slot;
    c.mean = t == 1;
    c.rows = rows;
    c.values = values[t].data();
    c.offsets = offsets[t].data();
    c.index = index[t].data();
    c.row_reads = row_reads[t].data();
    c.readers = readers[t].data();
    c.grads = grads[t].data();
    PooledTable& g = on_gpu[t];
    g = c;
    g.values = Upload(values[t]);
    g.offsets = Upload(offsets[t]);
    g.index = Upload(index[t]);
    g.row_reads = Upload(row_reads[t]);
    g.readers = Upload(readers[t]);
    g.grads = Upload(grads[t]);
    slot += dim;
    most_pool = std::max(most_pool, batch * dim);
    most_grad = std::max<int64_t>(most_grad, rows);
  }
  std::vector<float> features(batch * input_size, 0.f);
  const auto features_grad = Random(batch * input_size, 5, -1.f, 1.f);
  float* features_ = Upload(features);
  const float* features_grad_ = Upload(features_grad);
  const PooledTable* tables_ = Upload(on_gpu);
  ASSERT_TRUE(cuda::PoolRows(ctx(), batch, 3, tables_, most_pool, features_).ok());
  ASSERT_TRUE(cuda::PoolRowsBackward(ctx(), 3, tables_, most_grad, features_grad_).ok());
  cpu::PoolRows(cpu_, batch, 3, on_cpu.data(), features.data());
  cpu::PoolRowsBackward(cpu_, 3, on_cpu.data(), features_grad.data());
  EXPECT_EQ(features, Download(features_, features.size()));
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(grads[t], Download(on_gpu[t].grads, grads[t].size())) << "table " << t;
  }
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
  auto* loss_ = Alloc<double>(1);
  auto* correct_ = Alloc<unsigned long long>(1);
  ASSERT_EQ(cudaMemsetAsync(loss_, 0, sizeof(double), ctx().stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(correct_, 0, sizeof(unsigned long long), ctx().stream), cudaSuccess);
  ASSERT_OK(cuda::SoftmaxCrossEntropyAsync(ctx(), batch, classes, logits_, labels_, dlogits_, 1.f,
                                           loss_, correct_));
  LossStats host;
  cpu::SoftmaxCrossEntropy(cpu_, batch, classes, logits.data(), labels.data(), dlogits.data(),
                           &host);
  EXPECT_NEAR(Download(loss_, 1)[0], host.loss_sum, 1e-6 * host.loss_sum);
  EXPECT_EQ(Download(correct_, 1)[0], static_cast<unsigned long long>(host.correct));
  ExpectClose(dlogits, Download(dlogits_, dlogits.size()), "dlogits");
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

TEST_F(CudaKernelTest, ReducedActivationsNeedAReducedContext) {
  float* w = Alloc<float>(12);
  const auto code = [&](auto* x, auto* y) {
    return cuda::DenseForward(ctx(), 2, 3, 4, x, w, nullptr, y).code();
  };
  EXPECT_EQ(code(Alloc<__nv_bfloat16>(6), Alloc<__nv_bfloat16>(8)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Alloc<__half>(6), Alloc<__half>(8)), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
