// Embedding layer ops: wrappers over our kernels (embedding.cu).
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
absl::Status EmbeddingForward(const CudaContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                              const float* ids, const float* table, T* y) {
  return FromCuda(k::EmbeddingForward<T>(ctx.stream, num_ids, vocab, dim, ids, table, y),
                  "EmbeddingForward");
}

template <typename T>
absl::Status EmbeddingBackward(const CudaContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                               const float* ids, const T* dy, float* dtable, Write param_write) {
  if (!Acc(param_write)) RETURN_IF_ERROR(Zero<float>(ctx, vocab * dim, dtable));
  return FromCuda(k::EmbeddingBackward<T>(ctx.stream, num_ids, vocab, dim, ids, dy, dtable),
                  "EmbeddingBackward");
}

template <typename T>
absl::Status PairwiseDotForward(const CudaContext& ctx, int64_t batch, int64_t vectors, int64_t dim,
                                const T* x, T* y) {
  return FromCuda(k::PairwiseDotForward<T>(ctx.stream, batch, vectors, dim, x, y),
                  "PairwiseDotForward");
}

template <typename T>
absl::Status PairwiseDotBackward(const CudaContext& ctx, int64_t batch, int64_t vectors,
                                 int64_t dim, const T* x, const T* dy, T* dx) {
  return FromCuda(k::PairwiseDotBackward<T>(ctx.stream, batch, vectors, dim, x, dy, dx),
                  "PairwiseDotBackward");
}

absl::Status PoolRows(const CudaContext& ctx, int64_t batch, int num_tables,
                      const PooledTable* tables, int64_t most_work, float* features) {
  return FromCuda(k::PoolRows(ctx.stream, batch, num_tables, tables, most_work, features),
                  "PoolRows");
}

absl::Status PoolRowsBackward(const CudaContext& ctx, int num_tables, const PooledTable* tables,
                              int64_t most_work, const float* features_grad) {
  return FromCuda(k::PoolRowsBackward(ctx.stream, num_tables, tables, most_work, features_grad),
                  "PoolRowsBackward");
}

#define DOWNPOUR_INSTANTIATE(T)                                                               \
  template absl::Status PairwiseDotForward<T>(const CudaContext&, int64_t, int64_t, int64_t,  \
                                              const T*, T*);                                  \
  template absl::Status PairwiseDotBackward<T>(const CudaContext&, int64_t, int64_t, int64_t, \
                                               const T*, const T*, T*);                       \
  template absl::Status EmbeddingForward<T>(const CudaContext&, int64_t, int64_t, int64_t,    \
                                            const float*, const float*, T*);                  \
  template absl::Status EmbeddingBackward<T>(const CudaContext&, int64_t, int64_t, int64_t,   \
                                             const float*, const T*, float*, Write);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
