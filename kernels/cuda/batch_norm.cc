// Batch norm layer ops. Ours, not cuDNN's: over the [rows, 1, 1, channels]
// view that NHWC needs, cuDNN 9's spatial batch norm ran one reduction per
// channel over 262144 rows (ResNet-18 at batch 256) and took most of the
// step. The partials of the column reductions (batch_norm.cu) go to the
// workspace.
#include "kernels/cuda/layers.h"
#include "kernels/cuda/layers_internal.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = internal;
using internal::Acc;
using internal::ColumnScratch;

}  // namespace

template <typename T>
absl::Status BatchNormForwardTraining(const CudaContext& ctx, int64_t rows, int64_t channels,
                                      const T* x, const float* gamma, const float* beta,
                                      float epsilon, float momentum, T* y, float* running_mean,
                                      float* running_var, float* save_mean, float* save_inv_std) {
  absl::StatusOr<float*> partials = ColumnScratch(ctx, rows, channels, 0);
  if (!partials.ok()) return partials.status();
  return FromCuda(k::BatchNormForwardTraining<T>(ctx.stream, rows, channels, x, gamma, beta,
                                                 epsilon, momentum, y, running_mean, running_var,
                                                 save_mean, save_inv_std, *partials),
                  "BatchNormForwardTraining");
}

template <typename T>
absl::Status BatchNormForwardInference(const CudaContext& ctx, int64_t rows, int64_t channels,
                                       const T* x, const float* gamma, const float* beta,
                                       const float* mean, const float* var, float epsilon, T* y) {
  return FromCuda(k::BatchNormForwardInference<T>(ctx.stream, rows, channels, x, gamma, beta, mean,
                                                  var, epsilon, y),
                  "BatchNormForwardInference");
}

template <typename T>
absl::Status BatchNormBackward(const CudaContext& ctx, int64_t rows, int64_t channels, const T* x,
                               const T* dy, const float* gamma, const float* save_mean,
                               const float* save_inv_std, T* dx, Write dx_write, float* dgamma,
                               float* dbeta, Write param_write) {
  absl::StatusOr<float*> scratch = ColumnScratch(ctx, rows, channels, 2 * channels);
  if (!scratch.ok()) return scratch.status();
  float* sums = *scratch + k::ColumnPartialsElements(std::max<int64_t>(rows, 1), channels);
  return FromCuda(
      k::BatchNormBackward<T>(ctx.stream, rows, channels, x, dy, gamma, save_mean, save_inv_std, dx,
                              Acc(dx_write), dgamma, dbeta, Acc(param_write), *scratch, sums),
      "BatchNormBackward");
}

#define DOWNPOUR_INSTANTIATE(T)                                                                  \
  template absl::Status BatchNormForwardTraining<T>(const CudaContext&, int64_t, int64_t,        \
                                                    const T*, const float*, const float*, float, \
                                                    float, T*, float*, float*, float*, float*);  \
  template absl::Status BatchNormForwardInference<T>(const CudaContext&, int64_t, int64_t,       \
                                                     const T*, const float*, const float*,       \
                                                     const float*, const float*, float, T*);     \
  template absl::Status BatchNormBackward<T>(const CudaContext&, int64_t, int64_t, const T*,     \
                                             const T*, const float*, const float*, const float*, \
                                             T*, Write, float*, float*, Write);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
