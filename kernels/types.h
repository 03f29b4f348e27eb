// Types shared by every kernel backend (the CPU reference in kernels/cpu.h and
// the CUDA version that follows it), so callers can switch backend without
// changing the arguments they pass. Plain values; thread-compatible.
#ifndef DOWNPOUR_KERNELS_TYPES_H_
#define DOWNPOUR_KERNELS_TYPES_H_

#include <cstdint>

namespace downpour {
namespace kernels {

// How a kernel stores a result: replace what the output holds, or add to it.
// Adding is how the gradient of a tensor read by several layers is summed, and
// how gradients are accumulated over micro-batches.
enum class Write {
  kOverwrite,
  kAccumulate,
};

// Whether a matrix operand of Gemm is used as stored or transposed.
enum class Transpose {
  kNo,
  kYes,
};

// What the fused softmax cross-entropy reports for a batch.
struct LossStats {
  double loss_sum = 0.0;  // Sum over the batch of -log softmax(logits)[label].
  int64_t correct = 0;    // Examples whose argmax (first on ties) is the label.
};

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_TYPES_H_
