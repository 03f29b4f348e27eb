// Element-wise arithmetic on host float arrays, vectorised (AVX-512, AVX2 or
// SSE2, picked at load: common/platform/vector_clones.h): a worker sums a
// model's gradients over the steps between its pushes (ConsistencySpec.
// push_every), millions of floats a step. Each element is computed alone,
// in the same order at every width, so the results are the same bits as a
// plain loop's. Pure functions; thread-safe.
#ifndef DOWNPOUR_COMMON_FLOAT_ARRAYS_H_
#define DOWNPOUR_COMMON_FLOAT_ARRAYS_H_

#include <cstdint>

namespace downpour {

// sum[i] += x[i] for i in [0, n). REQUIRES: the arrays do not overlap.
void AddInto(const float* x, int64_t n, float* sum);

// v[i] *= factor for i in [0, n).
void ScaleInPlace(float factor, int64_t n, float* v);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_FLOAT_ARRAYS_H_
