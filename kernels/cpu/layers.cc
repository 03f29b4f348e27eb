#include "kernels/cpu/layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace downpour {
namespace kernels {
namespace cpu {
namespace {

CBLAS_TRANSPOSE ToCblas(Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; }

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
  const uint64_t key = DropoutKey(seed, step);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = DropoutUniform(key, i) >= rate;
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

void CopyBlock(const CpuContext& ctx, int64_t rows, int64_t width, const float* x, int64_t x_stride,
               int64_t x_offset, float* y, int64_t y_stride, int64_t y_offset, Write write) {
  for (int64_t r = 0; r < rows; ++r) {
    CopyOrAdd(ctx, width, x + r * x_stride + x_offset, y + r * y_stride + y_offset, write);
  }
}

void Zero(const CpuContext& /*ctx*/, int64_t n, float* x) { std::fill(x, x + n, 0.f); }

void Add(const CpuContext& /*ctx*/, int64_t n, const float* a, const float* b, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

namespace {

// cols[oh * out_w + ow, (i * kernel_w + j) * in_c + c] = x[ih, iw, c] of one
// image, zero in the padding.
void Im2Col(const WindowShape& s, const float* x, float* cols) {
  const int64_t patch = s.patch_elements();
  for (int64_t oh = 0; oh < s.out_h; ++oh) {
    for (int64_t ow = 0; ow < s.out_w; ++ow) {
      float* row = cols + (oh * s.out_w + ow) * patch;
      for (int64_t i = 0; i < s.kernel_h; ++i) {
        const int64_t ih = oh * s.stride_h - s.pad_top + i;
        for (int64_t j = 0; j < s.kernel_w; ++j) {
          const int64_t iw = ow * s.stride_w - s.pad_left + j;
          float* dst = row + (i * s.kernel_w + j) * s.in_c;
          if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) {
            std::fill(dst, dst + s.in_c, 0.f);
          } else {
            std::memcpy(dst, x + (ih * s.in_w + iw) * s.in_c, s.in_c * sizeof(float));
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds each patch entry back into the image dx.
void Col2ImAdd(const WindowShape& s, const float* cols, float* dx) {
  const int64_t patch = s.patch_elements();
  for (int64_t oh = 0; oh < s.out_h; ++oh) {
    for (int64_t ow = 0; ow < s.out_w; ++ow) {
      const float* row = cols + (oh * s.out_w + ow) * patch;
      for (int64_t i = 0; i < s.kernel_h; ++i) {
        const int64_t ih = oh * s.stride_h - s.pad_top + i;
        if (ih < 0 || ih >= s.in_h) continue;
        for (int64_t j = 0; j < s.kernel_w; ++j) {
          const int64_t iw = ow * s.stride_w - s.pad_left + j;
          if (iw < 0 || iw >= s.in_w) continue;
          const float* src = row + (i * s.kernel_w + j) * s.in_c;
          float* dst = dx + (ih * s.in_w + iw) * s.in_c;
          for (int64_t c = 0; c < s.in_c; ++c) dst[c] += src[c];
        }
      }
    }
  }
}

// The input rows [h0, h1) and columns [w0, w1) window (oh, ow) covers.
struct WindowRange {
  int64_t h0, h1, w0, w1;
};

WindowRange RangeOf(const WindowShape& s, int64_t oh, int64_t ow) {
  const int64_t h = oh * s.stride_h - s.pad_top;
  const int64_t w = ow * s.stride_w - s.pad_left;
  return {std::max<int64_t>(h, 0), std::min(h + s.kernel_h, s.in_h), std::max<int64_t>(w, 0),
          std::min(w + s.kernel_w, s.in_w)};
}

}  // namespace

int64_t Conv2dWorkspaceElements(const WindowShape& s) {
  return s.out_h * s.out_w * s.patch_elements();
}

void Conv2dForward(const CpuContext& ctx, const WindowShape& s, const float* x, const float* w,
                   const float* bias, float* y, float* workspace) {
  const int64_t pixels = s.out_h * s.out_w;
  for (int64_t n = 0; n < s.batch; ++n) {
    float* yn = y + n * s.out_elements();
    if (bias != nullptr) {
      for (int64_t p = 0; p < pixels; ++p)
        std::memcpy(yn + p * s.out_c, bias, s.out_c * sizeof(float));
    }
    Im2Col(s, x + n * s.in_elements(), workspace);
    Gemm(ctx, Transpose::kNo, Transpose::kYes, pixels, s.out_c, s.patch_elements(), 1.f, workspace,
         w, bias != nullptr ? 1.f : 0.f, yn);
  }
}

void Conv2dBackward(const CpuContext& ctx, const WindowShape& s, const float* x, const float* w,
                    const float* dy, float* dx, Write dx_write, float* dw, float* dbias,
                    Write param_write, float* workspace) {
  const int64_t pixels = s.out_h * s.out_w;
  const int64_t patch = s.patch_elements();
  if (param_write == Write::kOverwrite) {
    std::fill(dw, dw + s.out_c * patch, 0.f);
    if (dbias != nullptr) std::fill(dbias, dbias + s.out_c, 0.f);
  }
  if (dx != nullptr && dx_write == Write::kOverwrite) {
    std::fill(dx, dx + s.batch * s.in_elements(), 0.f);
  }
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* dyn = dy + n * s.out_elements();
    if (dbias != nullptr) {
      for (int64_t p = 0; p < pixels; ++p) {
        for (int64_t f = 0; f < s.out_c; ++f) dbias[f] += dyn[p * s.out_c + f];
      }
    }
    // dw[out_c, patch] += dy_n^T * cols, then the same scratch holds dcols.
    Im2Col(s, x + n * s.in_elements(), workspace);
    Gemm(ctx, Transpose::kYes, Transpose::kNo, s.out_c, patch, pixels, 1.f, dyn, workspace, 1.f,
         dw);
    if (dx != nullptr) {
      Gemm(ctx, Transpose::kNo, Transpose::kNo, pixels, patch, s.out_c, 1.f, dyn, w, 0.f,
           workspace);
      Col2ImAdd(s, workspace, dx + n * s.in_elements());
    }
  }
}

void MaxPoolForward(const CpuContext& /*ctx*/, const WindowShape& s, const float* x, float* y) {
  const int64_t c_n = s.in_c;
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* xn = x + n * s.in_elements();
    for (int64_t oh = 0; oh < s.out_h; ++oh) {
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        const WindowRange r = RangeOf(s, oh, ow);
        float* out = y + ((n * s.out_h + oh) * s.out_w + ow) * c_n;
        std::copy(xn + (r.h0 * s.in_w + r.w0) * c_n, xn + (r.h0 * s.in_w + r.w0 + 1) * c_n, out);
        for (int64_t h = r.h0; h < r.h1; ++h) {
          for (int64_t w = r.w0; w < r.w1; ++w) {
            const float* in = xn + (h * s.in_w + w) * c_n;
            for (int64_t c = 0; c < c_n; ++c) out[c] = in[c] > out[c] ? in[c] : out[c];
          }
        }
      }
    }
  }
}

void MaxPoolBackward(const CpuContext& /*ctx*/, const WindowShape& s, const float* x,
                     const float* dy, float* dx, Write dx_write) {
  const int64_t c_n = s.in_c;
  if (dx_write == Write::kOverwrite) std::fill(dx, dx + s.batch * s.in_elements(), 0.f);
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* xn = x + n * s.in_elements();
    float* dxn = dx + n * s.in_elements();
    for (int64_t oh = 0; oh < s.out_h; ++oh) {
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        const WindowRange r = RangeOf(s, oh, ow);
        const float* g = dy + ((n * s.out_h + oh) * s.out_w + ow) * c_n;
        for (int64_t c = 0; c < c_n; ++c) {
          int64_t best = r.h0 * s.in_w + r.w0;
          for (int64_t h = r.h0; h < r.h1; ++h) {
            for (int64_t w = r.w0; w < r.w1; ++w) {
              if (xn[(h * s.in_w + w) * c_n + c] > xn[best * c_n + c]) best = h * s.in_w + w;
            }
          }
          dxn[best * c_n + c] += g[c];
        }
      }
    }
  }
}

void AvgPoolForward(const CpuContext& /*ctx*/, const WindowShape& s, const float* x, float* y) {
  const int64_t c_n = s.in_c;
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* xn = x + n * s.in_elements();
    for (int64_t oh = 0; oh < s.out_h; ++oh) {
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        const WindowRange r = RangeOf(s, oh, ow);
        float* out = y + ((n * s.out_h + oh) * s.out_w + ow) * c_n;
        std::fill(out, out + c_n, 0.f);
        for (int64_t h = r.h0; h < r.h1; ++h) {
          for (int64_t w = r.w0; w < r.w1; ++w) {
            const float* in = xn + (h * s.in_w + w) * c_n;
            for (int64_t c = 0; c < c_n; ++c) out[c] += in[c];
          }
        }
        const float inv = 1.f / static_cast<float>((r.h1 - r.h0) * (r.w1 - r.w0));
        for (int64_t c = 0; c < c_n; ++c) out[c] *= inv;
      }
    }
  }
}

void AvgPoolBackward(const CpuContext& /*ctx*/, const WindowShape& s, const float* dy, float* dx,
                     Write dx_write) {
  const int64_t c_n = s.in_c;
  if (dx_write == Write::kOverwrite) std::fill(dx, dx + s.batch * s.in_elements(), 0.f);
  for (int64_t n = 0; n < s.batch; ++n) {
    float* dxn = dx + n * s.in_elements();
    for (int64_t oh = 0; oh < s.out_h; ++oh) {
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        const WindowRange r = RangeOf(s, oh, ow);
        const float* g = dy + ((n * s.out_h + oh) * s.out_w + ow) * c_n;
        const float inv = 1.f / static_cast<float>((r.h1 - r.h0) * (r.w1 - r.w0));
        for (int64_t h = r.h0; h < r.h1; ++h) {
          for (int64_t w = r.w0; w < r.w1; ++w) {
            float* d = dxn + (h * s.in_w + w) * c_n;
            for (int64_t c = 0; c < c_n; ++c) d[c] += g[c] * inv;
          }
        }
      }
    }
  }
}

void GlobalAvgPoolForward(const CpuContext& /*ctx*/, int64_t batch, int64_t spatial,
                          int64_t channels, const float* x, float* y) {
  const float inv = 1.f / static_cast<float>(spatial);
  for (int64_t n = 0; n < batch; ++n) {
    float* out = y + n * channels;
    std::fill(out, out + channels, 0.f);
    for (int64_t p = 0; p < spatial; ++p) {
      const float* in = x + (n * spatial + p) * channels;
      for (int64_t c = 0; c < channels; ++c) out[c] += in[c];
    }
    for (int64_t c = 0; c < channels; ++c) out[c] *= inv;
  }
}

void GlobalAvgPoolBackward(const CpuContext& /*ctx*/, int64_t batch, int64_t spatial,
                           int64_t channels, const float* dy, float* dx, Write dx_write) {
  const float inv = 1.f / static_cast<float>(spatial);
  for (int64_t n = 0; n < batch; ++n) {
    const float* g = dy + n * channels;
    for (int64_t p = 0; p < spatial; ++p) {
      float* d = dx + (n * spatial + p) * channels;
      if (dx_write == Write::kAccumulate) {
        for (int64_t c = 0; c < channels; ++c) d[c] += g[c] * inv;
      } else {
        for (int64_t c = 0; c < channels; ++c) d[c] = g[c] * inv;
      }
    }
  }
}

void BatchNormForwardTraining(const CpuContext& /*ctx*/, int64_t rows, int64_t channels,
                              const float* x, const float* gamma, const float* beta, float epsilon,
                              float momentum, float* y, float* running_mean, float* running_var,
                              float* save_mean, float* save_inv_std) {
  std::vector<double> sum(channels, 0.0), sum_sq(channels, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) sum[c] += in[c];
  }
  for (int64_t c = 0; c < channels; ++c) sum[c] /= static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const double d = in[c] - sum[c];
      sum_sq[c] += d * d;
    }
  }
  const double unbias = rows > 1 ? static_cast<double>(rows) / (rows - 1) : 1.0;
  for (int64_t c = 0; c < channels; ++c) {
    const double var = sum_sq[c] / static_cast<double>(rows);
    save_mean[c] = static_cast<float>(sum[c]);
    save_inv_std[c] = static_cast<float>(1.0 / std::sqrt(var + epsilon));
    running_mean[c] = momentum * running_mean[c] + (1.f - momentum) * static_cast<float>(sum[c]);
    running_var[c] =
        momentum * running_var[c] + (1.f - momentum) * static_cast<float>(var * unbias);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * channels;
    float* out = y + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      out[c] = gamma[c] * (in[c] - save_mean[c]) * save_inv_std[c] + beta[c];
    }
  }
}

void BatchNormForwardInference(const CpuContext& /*ctx*/, int64_t rows, int64_t channels,
                               const float* x, const float* gamma, const float* beta,
                               const float* mean, const float* var, float epsilon, float* y) {
  std::vector<float> scale(channels), shift(channels);
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = gamma[c] / std::sqrt(var[c] + epsilon);
    shift[c] = beta[c] - mean[c] * scale[c];
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * channels;
    float* out = y + r * channels;
    for (int64_t c = 0; c < channels; ++c) out[c] = in[c] * scale[c] + shift[c];
  }
}

void BatchNormBackward(const CpuContext& /*ctx*/, int64_t rows, int64_t channels, const float* x,
                       const float* dy, const float* gamma, const float* save_mean,
                       const float* save_inv_std, float* dx, Write dx_write, float* dgamma,
                       float* dbeta, Write param_write) {
  std::vector<double> sum_dy(channels, 0.0), sum_dy_xhat(channels, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * channels;
    const float* g = dy + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      sum_dy[c] += g[c];
      sum_dy_xhat[c] += static_cast<double>(g[c]) * (in[c] - save_mean[c]) * save_inv_std[c];
    }
  }
  for (int64_t c = 0; c < channels; ++c) {
    const float db = static_cast<float>(sum_dy[c]);
    const float dg = static_cast<float>(sum_dy_xhat[c]);
    dbeta[c] = param_write == Write::kAccumulate ? dbeta[c] + db : db;
    dgamma[c] = param_write == Write::kAccumulate ? dgamma[c] + dg : dg;
  }
  if (dx == nullptr) return;
  // dx = gamma * inv_std / rows * (rows * dy - sum(dy) - xhat * sum(dy * xhat))
  const double inv_rows = 1.0 / static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * channels;
    const float* g = dy + r * channels;
    float* d = dx + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const double xhat = (in[c] - save_mean[c]) * save_inv_std[c];
      const double v =
          gamma[c] * save_inv_std[c] * (g[c] - (sum_dy[c] + xhat * sum_dy_xhat[c]) * inv_rows);
      d[c] = dx_write == Write::kAccumulate ? d[c] + static_cast<float>(v) : static_cast<float>(v);
    }
  }
}

void EmbeddingForward(const CpuContext& /*ctx*/, int64_t num_ids, int64_t vocab, int64_t dim,
                      const float* ids, const float* table, float* y) {
  for (int64_t i = 0; i < num_ids; ++i) {
    const int64_t row = EmbeddingRow(ids[i], vocab);
    if (row < 0) {
      std::fill(y + i * dim, y + (i + 1) * dim, 0.f);
    } else {
      std::memcpy(y + i * dim, table + row * dim, dim * sizeof(float));
    }
  }
}

void EmbeddingBackward(const CpuContext& /*ctx*/, int64_t num_ids, int64_t vocab, int64_t dim,
                       const float* ids, const float* dy, float* dtable, Write param_write) {
  if (param_write == Write::kOverwrite) std::fill(dtable, dtable + vocab * dim, 0.f);
  for (int64_t i = 0; i < num_ids; ++i) {
    const int64_t row = EmbeddingRow(ids[i], vocab);
    if (row < 0) continue;
    float* d = dtable + row * dim;
    const float* g = dy + i * dim;
    for (int64_t j = 0; j < dim; ++j) d[j] += g[j];
  }
}

void PoolRows(const CpuContext& /*ctx*/, int64_t batch, int num_tables, const PooledTable* tables,
              float* features) {
  for (int t = 0; t < num_tables; ++t) {
    const PooledTable& table = tables[t];
    const int64_t dim = table.dim;
    for (int32_t i = 0; i < table.fresh; ++i) {
      std::copy_n(table.fresh_values + int64_t{i} * dim, dim,
                  table.store + int64_t{table.fresh_places[i]} * dim);
    }
    for (int64_t b = 0; b < batch; ++b) {
      float* out = features + table.slot + b * dim;
      std::fill(out, out + dim, 0.f);
      for (int32_t k = table.offsets[b]; k < table.offsets[b + 1]; ++k) {
        const float* row = PooledRow(table, table.index[k]);
        for (int64_t d = 0; d < dim; ++d) out[d] += row[d];
      }
      const float scale = PoolScale(table.mean != 0, table.offsets[b + 1] - table.offsets[b]);
      if (scale != 1.f) {
        for (int64_t d = 0; d < dim; ++d) out[d] *= scale;
      }
    }
  }
}

void PoolRowsBackward(const CpuContext& /*ctx*/, int num_tables, const PooledTable* tables,
                      const float* features_grad) {
  for (int t = 0; t < num_tables; ++t) {
    const PooledTable& table = tables[t];
    const int64_t dim = table.dim;
    for (int32_t r = 0; r < table.rows; ++r) {
      for (int64_t d = 0; d < dim; ++d) {
        float lanes[kPoolLanes] = {};
        for (int32_t k = table.row_reads[r]; k < table.row_reads[r + 1]; ++k) {
          const int32_t b = table.readers[k];
          const float g = features_grad[table.slot + int64_t{b} * dim + d];
          const float scale = PoolScale(table.mean != 0, table.offsets[b + 1] - table.offsets[b]);
          lanes[(k - table.row_reads[r]) % kPoolLanes] += table.mean != 0 ? scale * g : g;
        }
        for (int h = kPoolLanes / 2; h > 0; h /= 2) {
          for (int i = 0; i < h; ++i) lanes[i] += lanes[i + h];
        }
        table.grads[int64_t{r} * dim + d] = lanes[0];
      }
    }
  }
}

void PairwiseDotForward(const CpuContext& /*ctx*/, int64_t batch, int64_t vectors, int64_t dim,
                        const float* x, float* y) {
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * vectors * dim;
    for (int64_t i = 0; i < vectors; ++i) {
      for (int64_t j = i + 1; j < vectors; ++j) {
        float dot = 0.f;
        for (int64_t t = 0; t < dim; ++t) dot += xb[i * dim + t] * xb[j * dim + t];
        *y++ = dot;
      }
    }
  }
}

void PairwiseDotBackward(const CpuContext& /*ctx*/, int64_t batch, int64_t vectors, int64_t dim,
                         const float* x, const float* dy, float* dx) {
  const int64_t pairs = vectors * (vectors - 1) / 2;
  std::fill(dx, dx + batch * vectors * dim, 0.f);
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * vectors * dim;
    float* db = dx + b * vectors * dim;
    const float* g = dy + b * pairs;
    for (int64_t i = 0; i < vectors; ++i) {
      for (int64_t j = i + 1; j < vectors; ++j, ++g) {
        for (int64_t t = 0; t < dim; ++t) {
          db[i * dim + t] += *g * xb[j * dim + t];
          db[j * dim + t] += *g * xb[i * dim + t];
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour
