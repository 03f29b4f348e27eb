// Pooling layer ops: wrappers over our kernels (pool.cu).
#include "kernels/cuda/layers.h"
#include "kernels/cuda/layers_internal.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = internal;
using internal::Acc;

}  // namespace

template <typename T>
absl::Status MaxPoolForward(const CudaContext& ctx, const WindowShape& s, const T* x, T* y) {
  return FromCuda(k::MaxPoolForward<T>(ctx.stream, s, x, y), "MaxPoolForward");
}

template <typename T>
absl::Status MaxPoolBackward(const CudaContext& ctx, const WindowShape& s, const T* x, const T* dy,
                             T* dx, Write dx_write) {
  return FromCuda(k::MaxPoolBackward<T>(ctx.stream, s, x, dy, dx, Acc(dx_write)),
                  "MaxPoolBackward");
}

template <typename T>
absl::Status AvgPoolForward(const CudaContext& ctx, const WindowShape& s, const T* x, T* y) {
  return FromCuda(k::AvgPoolForward<T>(ctx.stream, s, x, y), "AvgPoolForward");
}

template <typename T>
absl::Status AvgPoolBackward(const CudaContext& ctx, const WindowShape& s, const T* dy, T* dx,
                             Write dx_write) {
  return FromCuda(k::AvgPoolBackward<T>(ctx.stream, s, dy, dx, Acc(dx_write)), "AvgPoolBackward");
}

template <typename T>
absl::Status GlobalAvgPoolForward(const CudaContext& ctx, int64_t batch, int64_t spatial,
                                  int64_t channels, const T* x, T* y) {
  return FromCuda(k::GlobalAvgPoolForward<T>(ctx.stream, batch, spatial, channels, x, y),
                  "GlobalAvgPoolForward");
}

template <typename T>
absl::Status GlobalAvgPoolBackward(const CudaContext& ctx, int64_t batch, int64_t spatial,
                                   int64_t channels, const T* dy, T* dx, Write dx_write) {
  return FromCuda(
      k::GlobalAvgPoolBackward<T>(ctx.stream, batch, spatial, channels, dy, dx, Acc(dx_write)),
      "GlobalAvgPoolBackward");
}

#define DOWNPOUR_INSTANTIATE(T)                                                                  \
  template absl::Status MaxPoolForward<T>(const CudaContext&, const WindowShape&, const T*, T*); \
  template absl::Status MaxPoolBackward<T>(const CudaContext&, const WindowShape&, const T*,     \
                                           const T*, T*, Write);                                 \
  template absl::Status AvgPoolForward<T>(const CudaContext&, const WindowShape&, const T*, T*); \
  template absl::Status AvgPoolBackward<T>(const CudaContext&, const WindowShape&, const T*, T*, \
                                           Write);                                               \
  template absl::Status GlobalAvgPoolForward<T>(const CudaContext&, int64_t, int64_t, int64_t,   \
                                                const T*, T*);                                   \
  template absl::Status GlobalAvgPoolBackward<T>(const CudaContext&, int64_t, int64_t, int64_t,  \
                                                 const T*, T*, Write);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
