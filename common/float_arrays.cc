#include "common/float_arrays.h"

#include "common/platform/vector_clones.h"

namespace downpour {

DOWNPOUR_VECTOR_CLONES void AddInto(const float* __restrict x, int64_t n, float* __restrict sum) {
  for (int64_t i = 0; i < n; ++i) sum[i] += x[i];
}

DOWNPOUR_VECTOR_CLONES void ScaleInPlace(float factor, int64_t n, float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) v[i] *= factor;
}

}  // namespace downpour
