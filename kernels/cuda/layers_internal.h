// Internal to kernels/cuda: what the host side of the layer ops (dense.cc,
// elementwise.cc, conv.cc, pool.cc, batch_norm.cc, embedding.cc) shares: the
// activation type checks, conversions through our kernels, reduced weights
// and workspace scratch. Stateless helpers over a context used by one thread
// at a time (see context.h).
#ifndef DOWNPOUR_KERNELS_CUDA_LAYERS_INTERNAL_H_
#define DOWNPOUR_KERNELS_CUDA_LAYERS_INTERNAL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/status.h"
#include "kernels/cuda/weights.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace internal {

inline bool Acc(Write w) { return w == Write::kAccumulate; }

inline int AsInt(int64_t v) { return static_cast<int>(v); }

template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float>;

// The cuBLAS / cuDNN names of the activation types.
template <typename T>
constexpr cudaDataType_t CudaType() {
  return kIsFloat<T> ? CUDA_R_32F : std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}
template <typename T>
constexpr ComputePrecision PrecisionOf() {
  return kIsFloat<T>                 ? ComputePrecision::kFp32
         : std::is_same_v<T, __half> ? ComputePrecision::kFp16
                                     : ComputePrecision::kBf16;
}

// The ops that multiply read reduced weight copies of the context's type:
// their activations must be of that type too.
template <typename T>
absl::Status CheckType(const CudaContext& ctx, const char* what) {
  if (ctx.compute == PrecisionOf<T>()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": activations of ", sizeof(T),
                                                 "-byte type in a context of precision ",
                                                 static_cast<int>(ctx.compute)));
}

template <typename S, typename D>
absl::Status ConvertOn(const CudaContext& ctx, int64_t n, const S* x, D* y, const float* bias,
                       int64_t channels, bool accumulate, bool relu) {
  if (n == 0) return absl::OkStatus();
  return FromCuda(Convert<S, D>(ctx.stream, n, x, y, bias, channels, accumulate, relu), "Convert");
}

// The reduced copy (of type T) of the `n` weights at `w`: the registered one
// (CastReducedWeights), or `w` converted into `scratch`.
template <typename T>
absl::StatusOr<const T*> WeightsToReduced(const CudaContext& ctx, int64_t n, const float* w,
                                          void* scratch) {
  if (const void* copy = FindReducedCopy(ctx, w); copy != nullptr) {
    return static_cast<const T*>(copy);
  }
  T* copy = static_cast<T*>(scratch);
  RETURN_IF_ERROR(ConvertOn(ctx, n, w, copy, nullptr, 1, false, false));
  return static_cast<const T*>(copy);
}

// The workspace as scratch for column-reduction partials (and `extra_floats`
// more after them).
inline absl::StatusOr<float*> ColumnScratch(const CudaContext& ctx, int64_t rows, int64_t channels,
                                            size_t extra_floats) {
  const size_t need =
      Aligned(sizeof(float) *
              (ColumnPartialsElements(std::max<int64_t>(rows, 1), channels) + extra_floats));
  RETURN_IF_ERROR(EnsureWorkspace(ctx, need));
  return static_cast<float*>(ctx.workspace);
}

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_LAYERS_INTERNAL_H_
