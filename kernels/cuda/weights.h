// Reduced-precision copies of a model's weights on one device: in a bf16 or
// fp16 context, dense layers and convolutions multiply reduced weights, and
// casting each weight at every op would read and write it once per use.
// Registered once, refreshed by one kernel per forward pass, and looked up
// by the ops (layers.h) through the fp32 range they copy.
//
// Thread safety: as the context (one host thread at a time). Ownership: the
// context owns the copies (CudaContext::reduced_weights); the fp32 ranges
// stay the caller's.
#ifndef DOWNPOUR_KERNELS_CUDA_WEIGHTS_H_
#define DOWNPOUR_KERNELS_CUDA_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/context.h"

namespace downpour {
namespace kernels {
namespace cuda {

// bf16/fp16 contexts: keeps one reduced copy of each fp32 device range in
// `ranges` (start, elements), so that DenseForward/Backward and
// Conv2dForward/Backward read the copy of a weight that starts a registered
// range instead of casting it at every op. Replaces an earlier registration;
// does nothing in fp32 contexts.
// REQUIRES: CastReducedWeights after every change of the ranges' values and
// before the next op that reads them; the ranges outlive the registration.
absl::Status RegisterReducedWeights(CudaContext& ctx,
                                    const std::vector<std::pair<const float*, int64_t>>& ranges);
// Refreshes every registered copy from its fp32 range (one kernel).
absl::Status CastReducedWeights(const CudaContext& ctx);
// Refreshes the copy of the registered range that starts at `w` (one
// kernel; nothing when no range starts there).
absl::Status CastReducedWeight(const CudaContext& ctx, const float* w);
// Device bytes the registered copies take.
size_t ReducedWeightBytes(const CudaContext& ctx);

// The registered reduced copy (of the context's type) of the range that
// starts at `w`, or null when none does.
const void* FindReducedCopy(const CudaContext& ctx, const float* w);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_WEIGHTS_H_
