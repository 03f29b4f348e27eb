#include "kernels/cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace downpour {
namespace kernels {
namespace cpu {
namespace {

CBLAS_TRANSPOSE ToCblas(Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; }

// SplitMix64 finaliser: the counter-based hash behind dropout masks.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 bits, from (key, i) alone.
float UniformAt(uint64_t key, int64_t i) {
  return static_cast<float>(Mix(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / (1 << 24));
}

}  // namespace

void SetCpuThreads(int num_threads) {
  if (num_threads > 0) openblas_set_num_threads(num_threads);
}

void Gemm(const CpuContext& /*ctx*/, Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS would still scale c by beta; do the same without reading c at 0.
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.f ? 0.f : beta * c[i];
    return;
  }
  const int lda = static_cast<int>(trans_a == Transpose::kYes ? m : k);
  const int ldb = static_cast<int>(trans_b == Transpose::kYes ? k : n);
  cblas_sgemm(CblasRowMajor, ToCblas(trans_a), ToCblas(trans_b), static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, lda, b, ldb, beta, c,
              static_cast<int>(n));
}

void DenseForward(const CpuContext& ctx, int64_t batch, int64_t in, int64_t out, const float* x,
                  const float* w, const float* bias, float* y) {
  if (bias != nullptr) {
    for (int64_t r = 0; r < batch; ++r) std::memcpy(y + r * out, bias, out * sizeof(float));
  }
  Gemm(ctx, Transpose::kNo, Transpose::kNo, batch, out, in, 1.f, x, w, bias != nullptr ? 1.f : 0.f,
       y);
}

void DenseBackward(const CpuContext& ctx, int64_t batch, int64_t in, int64_t out, const float* x,
                   const float* w, const float* dy, float* dx, Write dx_write, float* dw,
                   float* dbias, Write param_write) {
  const float param_beta = param_write == Write::kAccumulate ? 1.f : 0.f;
  Gemm(ctx, Transpose::kYes, Transpose::kNo, in, out, batch, 1.f, x, dy, param_beta, dw);
  if (dbias != nullptr) {
    if (param_write == Write::kOverwrite) std::fill(dbias, dbias + out, 0.f);
    for (int64_t r = 0; r < batch; ++r) {
      const float* row = dy + r * out;
      for (int64_t j = 0; j < out; ++j) dbias[j] += row[j];
    }
  }
  if (dx != nullptr) {
    Gemm(ctx, Transpose::kNo, Transpose::kYes, batch, in, out, 1.f, dy, w,
         dx_write == Write::kAccumulate ? 1.f : 0.f, dx);
  }
}

void ReluForward(const CpuContext& /*ctx*/, int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

void ReluBackward(const CpuContext& /*ctx*/, int64_t n, const float* x, const float* dy, float* dx,
                  Write dx_write) {
  if (dx_write == Write::kAccumulate) {
    for (int64_t i = 0; i < n; ++i) dx[i] += x[i] > 0.f ? dy[i] : 0.f;
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.f ? dy[i] : 0.f;
  }
}

void DropoutForward(const CpuContext& /*ctx*/, int64_t n, float rate, uint64_t seed, uint64_t step,
                    const float* x, float* y, uint8_t* mask) {
  if (rate <= 0.f) {
    std::memmove(y, x, n * sizeof(float));
    std::memset(mask, 1, n);
    return;
  }
  const float scale = 1.f / (1.f - rate);
  const uint64_t key = Mix(seed ^ Mix(step));
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = UniformAt(key, i) >= rate;
    mask[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * scale : 0.f;
  }
}

void DropoutBackward(const CpuContext& /*ctx*/, int64_t n, float rate, const uint8_t* mask,
                     const float* dy, float* dx, Write dx_write) {
  const float scale = 1.f / (1.f - rate);
  if (dx_write == Write::kAccumulate) {
    for (int64_t i = 0; i < n; ++i) dx[i] += mask[i] ? dy[i] * scale : 0.f;
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] * scale : 0.f;
  }
}

void SoftmaxCrossEntropy(const CpuContext& /*ctx*/, int64_t batch, int64_t classes,
                         const float* logits, const int32_t* labels, float* dlogits,
                         LossStats* stats) {
  double loss_sum = 0.0;
  int64_t correct = 0;
  const float inv_batch = 1.f / static_cast<float>(batch);
  for (int64_t r = 0; r < batch; ++r) {
    const float* row = logits + r * classes;
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
    }
    const float max = row[argmax];
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(row[j] - max));
    const int32_t label = labels[r];
    // -log softmax[label] = log(sum exp(l - max)) - (l[label] - max) >= 0.
    loss_sum += std::log(sum) - static_cast<double>(row[label] - max);
    if (argmax == label) ++correct;
    if (dlogits != nullptr) {
      float* grad = dlogits + r * classes;
      const double inv_sum = 1.0 / sum;
      for (int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(row[j] - max)) * inv_sum;
        grad[j] = static_cast<float>(p) * inv_batch;
      }
      grad[label] -= inv_batch;
    }
  }
  stats->loss_sum = loss_sum;
  stats->correct = correct;
}

void CopyOrAdd(const CpuContext& /*ctx*/, int64_t n, const float* x, float* y, Write write) {
  if (write == Write::kAccumulate) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  } else if (x != y) {
    std::memcpy(y, x, n * sizeof(float));
  }
}

void Zero(const CpuContext& /*ctx*/, int64_t n, float* x) { std::fill(x, x + n, 0.f); }

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour
