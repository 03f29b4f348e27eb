// Dense layers and the matrix products behind them: cuBLAS in fp32 (full
// fp32, or TF32 tensor cores where ctx.tf32 allows GEMMs), tensor-core
// products with fp32 accumulation on reduced activations and weights in
// bf16/fp16.
#include <cublas_v2.h>

#include "kernels/cuda/layers.h"
#include "kernels/cuda/layers_internal.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = internal;
using internal::Acc;
using internal::AsInt;
using internal::CheckType;
using internal::ColumnScratch;
using internal::CudaType;
using internal::kIsFloat;
using internal::WeightsToReduced;

// A dense layer's reduced weights: the registered copy, or a conversion at
// the head of the workspace (asked for only then: a large layer's copy is
// hundreds of MB).
template <typename T>
absl::StatusOr<const T*> DenseWeights(const CudaContext& ctx, int64_t n, const float* w) {
  if (const void* copy = FindReducedCopy(ctx, w); copy != nullptr) {
    return static_cast<const T*>(copy);
  }
  RETURN_IF_ERROR(EnsureWorkspace(ctx, Reduced16Bytes(n)));
  return WeightsToReduced<T>(ctx, n, w, ctx.workspace);
}

// Row-major C = alpha op(A) op(B) + beta C on tensor cores with fp32
// accumulation; A and B of type `ab`, C of type `c_type`.
absl::Status GemmMixed(const CudaContext& ctx, Transpose trans_a, Transpose trans_b, int64_t m,
                       int64_t n, int64_t k_dim, float alpha, const void* a, const void* b,
                       cudaDataType_t ab, float beta, void* c, cudaDataType_t c_type) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k_dim == 0) {
    // Shapes are validated non-empty; keep the BLAS meaning all the same.
    if (beta != 0.f) return absl::InvalidArgumentError("GemmMixed: k = 0 with beta != 0");
    const size_t element = c_type == CUDA_R_32F ? 4 : 2;
    return FromCuda(cudaMemsetAsync(c, 0, element * m * n, ctx.stream), "cudaMemsetAsync");
  }
  const int lda = AsInt(trans_a == Transpose::kYes ? m : k_dim);
  const int ldb = AsInt(trans_b == Transpose::kYes ? k_dim : n);
  return FromCublas(cublasGemmEx(ctx.cublas, trans_b == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N, AsInt(n),
                                 AsInt(m), AsInt(k_dim), &alpha, b, ab, ldb, a, ab, lda, &beta, c,
                                 c_type, AsInt(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx");
}

}  // namespace

absl::Status Gemm(const CudaContext& ctx, Transpose trans_a, Transpose trans_b, int64_t m,
                  int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta,
                  float* c) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) return FromCuda(k::Scale(ctx.stream, m * n, beta, c), "Scale");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const int lda = AsInt(trans_a == Transpose::kYes ? m : k);
  const int ldb = AsInt(trans_b == Transpose::kYes ? k : n);
  const cublasOperation_t op_b = trans_b == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (Tf32Gemms(ctx.tf32)) {
    // fp32 in and out, products on TF32 tensor cores (PyTorch's
    // matmul.allow_tf32).
    return FromCublas(cublasGemmEx(ctx.cublas, op_b, op_a, AsInt(n), AsInt(m), AsInt(k), &alpha, b,
                                   CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c, CUDA_R_32F,
                                   AsInt(n), CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx (TF32)");
  }
  return FromCublas(cublasSgemm(ctx.cublas, op_b, op_a, AsInt(n), AsInt(m), AsInt(k), &alpha, b,
                                ldb, a, lda, &beta, c, AsInt(n)),
                    "cublasSgemm");
}

template <typename T>
absl::Status DenseForward(const CudaContext& ctx, int64_t batch, int64_t in, int64_t out,
                          const T* x, const float* w, const float* bias, T* y) {
  RETURN_IF_ERROR(CheckType<T>(ctx, "DenseForward"));
  if (bias != nullptr) {
    CUDA_RETURN_IF_ERROR(k::BroadcastRows<T>(ctx.stream, batch, out, bias, y));
  }
  const float beta = bias != nullptr ? 1.f : 0.f;
  if constexpr (kIsFloat<T>) {
    return Gemm(ctx, Transpose::kNo, Transpose::kNo, batch, out, in, 1.f, x, w, beta, y);
  } else {
    absl::StatusOr<const T*> w16 = DenseWeights<T>(ctx, in * out, w);
    if (!w16.ok()) return w16.status();
    return GemmMixed(ctx, Transpose::kNo, Transpose::kNo, batch, out, in, 1.f, x, *w16,
                     CudaType<T>(), beta, y, CudaType<T>());
  }
}

template <typename T>
absl::Status DenseBackward(const CudaContext& ctx, int64_t batch, int64_t in, int64_t out,
                           const T* x, const float* w, const T* dy, T* dx, Write dx_write,
                           float* dw, float* dbias, Write param_write) {
  RETURN_IF_ERROR(CheckType<T>(ctx, "DenseBackward"));
  // dbias first: its partials use the workspace the weight copy then reuses.
  if (dbias != nullptr) {
    absl::StatusOr<float*> partials = ColumnScratch(ctx, batch, out, 0);
    if (!partials.ok()) return partials.status();
    CUDA_RETURN_IF_ERROR(
        k::ColumnSumFast<T>(ctx.stream, batch, out, dy, dbias, Acc(param_write), *partials));
  }
  const float param_beta = Acc(param_write) ? 1.f : 0.f;
  const float dx_beta = Acc(dx_write) ? 1.f : 0.f;
  if constexpr (kIsFloat<T>) {
    RETURN_IF_ERROR(
        Gemm(ctx, Transpose::kYes, Transpose::kNo, in, out, batch, 1.f, x, dy, param_beta, dw));
    if (dx == nullptr) return absl::OkStatus();
    return Gemm(ctx, Transpose::kNo, Transpose::kYes, batch, in, out, 1.f, dy, w, dx_beta, dx);
  } else {
    RETURN_IF_ERROR(GemmMixed(ctx, Transpose::kYes, Transpose::kNo, in, out, batch, 1.f, x, dy,
                              CudaType<T>(), param_beta, dw, CUDA_R_32F));
    if (dx == nullptr) return absl::OkStatus();
    absl::StatusOr<const T*> w16 = DenseWeights<T>(ctx, in * out, w);
    if (!w16.ok()) return w16.status();
    return GemmMixed(ctx, Transpose::kNo, Transpose::kYes, batch, in, out, 1.f, dy, *w16,
                     CudaType<T>(), dx_beta, dx, CudaType<T>());
  }
}

#define DOWNPOUR_INSTANTIATE(T)                                                                   \
  template absl::Status DenseForward<T>(const CudaContext&, int64_t, int64_t, int64_t, const T*,  \
                                        const float*, const float*, T*);                          \
  template absl::Status DenseBackward<T>(const CudaContext&, int64_t, int64_t, int64_t, const T*, \
                                         const float*, const T*, T*, Write, float*, float*,       \
                                         Write);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
