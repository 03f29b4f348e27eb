// The element-wise layer ops (conversion, ReLU, dropout, copy-or-add, add,
// zero, loss-scale unscaling) and the softmax cross-entropy loss: thin
// wrappers over our kernels (elementwise.cu, loss.cu).
#include "kernels/cuda/layers.h"
#include "kernels/cuda/layers_internal.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = internal;
using internal::Acc;
using internal::ConvertOn;

}  // namespace

template <typename S, typename D>
absl::Status Convert(const CudaContext& ctx, int64_t n, const S* x, D* y) {
  return ConvertOn(ctx, n, x, y, nullptr, 1, false, false);
}

template <typename T>
absl::Status ReluForward(const CudaContext& ctx, int64_t n, const T* x, T* y) {
  return FromCuda(k::ReluForward<T>(ctx.stream, n, x, y), "ReluForward");
}

template <typename T>
absl::Status ReluBackward(const CudaContext& ctx, int64_t n, const T* y, const T* dy, T* dx,
                          Write dx_write) {
  return FromCuda(k::ReluBackward<T>(ctx.stream, n, y, dy, dx, Acc(dx_write)), "ReluBackward");
}

template <typename T>
absl::Status DropoutForward(const CudaContext& ctx, int64_t n, float rate, uint64_t seed,
                            uint64_t step, const T* x, T* y, uint8_t* mask) {
  return FromCuda(k::DropoutForward<T>(ctx.stream, n, rate, DropoutKey(seed, step), x, y, mask),
                  "DropoutForward");
}

template <typename T>
absl::Status DropoutBackward(const CudaContext& ctx, int64_t n, float rate, const uint8_t* mask,
                             const T* dy, T* dx, Write dx_write) {
  return FromCuda(k::DropoutBackward<T>(ctx.stream, n, rate, mask, dy, dx, Acc(dx_write)),
                  "DropoutBackward");
}

template <typename T>
absl::Status SoftmaxCrossEntropyAsync(const CudaContext& ctx, int64_t batch, int64_t classes,
                                      const T* logits, const int32_t* labels, T* dlogits,
                                      float dlogits_scale, double* loss_sum,
                                      unsigned long long* correct) {
  return FromCuda(k::SoftmaxCrossEntropy<T>(ctx.stream, batch, classes, logits, labels, dlogits,
                                            dlogits_scale, loss_sum, correct),
                  "SoftmaxCrossEntropy");
}

template <typename T>
absl::Status CopyOrAdd(const CudaContext& ctx, int64_t n, const T* x, T* y, Write write) {
  if (!Acc(write)) {
    if (x == y || n == 0) return absl::OkStatus();
    return FromCuda(cudaMemcpyAsync(y, x, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream),
                    "cudaMemcpyAsync");
  }
  return FromCuda(k::CopyOrAdd<T>(ctx.stream, n, x, y, true), "CopyOrAdd");
}

template <typename T>
absl::Status CopyBlock(const CudaContext& ctx, int64_t rows, int64_t width, const T* x,
                       int64_t x_stride, int64_t x_offset, T* y, int64_t y_stride, int64_t y_offset,
                       Write write) {
  if (rows == 0 || width == 0) return absl::OkStatus();
  x += x_offset;
  y += y_offset;
  if (!Acc(write)) {
    return FromCuda(
        cudaMemcpy2DAsync(y, y_stride * sizeof(T), x, x_stride * sizeof(T), width * sizeof(T), rows,
                          cudaMemcpyDeviceToDevice, ctx.stream),
        "cudaMemcpy2DAsync");
  }
  return FromCuda(k::AddBlock<T>(ctx.stream, rows, width, x, x_stride, y, y_stride), "AddBlock");
}

absl::Status UnscaleCheckFinite(const CudaContext& ctx, int64_t n, float inv_scale, float* g,
                                int* flag) {
  return FromCuda(k::UnscaleCheckFinite(ctx.stream, n, inv_scale, g, flag), "UnscaleCheckFinite");
}

template <typename T>
absl::Status Zero(const CudaContext& ctx, int64_t n, T* x) {
  return FromCuda(cudaMemsetAsync(x, 0, n * sizeof(T), ctx.stream), "cudaMemsetAsync");
}

template <typename T>
absl::Status Add(const CudaContext& ctx, int64_t n, const T* a, const T* b, T* y) {
  return FromCuda(k::Add<T>(ctx.stream, n, a, b, y), "Add");
}

#define DOWNPOUR_CONVERT_TO(S, D) \
  template absl::Status Convert<S, D>(const CudaContext&, int64_t, const S*, D*);
#define DOWNPOUR_CONVERT_FROM(S)        \
  DOWNPOUR_CONVERT_TO(S, float)         \
  DOWNPOUR_CONVERT_TO(S, __nv_bfloat16) \
  DOWNPOUR_CONVERT_TO(S, __half)
DOWNPOUR_CONVERT_FROM(float)
DOWNPOUR_CONVERT_FROM(__nv_bfloat16)
DOWNPOUR_CONVERT_FROM(__half)
#undef DOWNPOUR_CONVERT_FROM
#undef DOWNPOUR_CONVERT_TO

#define DOWNPOUR_INSTANTIATE(T)                                                                   \
  template absl::Status ReluForward<T>(const CudaContext&, int64_t, const T*, T*);                \
  template absl::Status ReluBackward<T>(const CudaContext&, int64_t, const T*, const T*, T*,      \
                                        Write);                                                   \
  template absl::Status DropoutForward<T>(const CudaContext&, int64_t, float, uint64_t, uint64_t, \
                                          const T*, T*, uint8_t*);                                \
  template absl::Status DropoutBackward<T>(const CudaContext&, int64_t, float, const uint8_t*,    \
                                           const T*, T*, Write);                                  \
  template absl::Status SoftmaxCrossEntropyAsync<T>(const CudaContext&, int64_t, int64_t,         \
                                                    const T*, const int32_t*, T*, float, double*, \
                                                    unsigned long long*);                         \
  template absl::Status CopyOrAdd<T>(const CudaContext&, int64_t, const T*, T*, Write);           \
  template absl::Status CopyBlock<T>(const CudaContext&, int64_t, int64_t, const T*, int64_t,     \
                                     int64_t, T*, int64_t, int64_t, Write);                       \
  template absl::Status Zero<T>(const CudaContext&, int64_t, T*);                                 \
  template absl::Status Add<T>(const CudaContext&, int64_t, const T*, const T*, T*);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
