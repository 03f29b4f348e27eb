// Types shared by every kernel backend (the CPU reference in kernels/cpu.h and
// the CUDA version that follows it), so callers can switch backend without
// changing the arguments they pass. Plain values; thread-compatible.
#ifndef DOWNPOUR_KERNELS_TYPES_H_
#define DOWNPOUR_KERNELS_TYPES_H_

#include <cstdint>

// Marks the small inline helpers below usable in CUDA device code too.
#ifdef __CUDACC__
#define DOWNPOUR_HOST_DEVICE __host__ __device__
#else
#define DOWNPOUR_HOST_DEVICE
#endif

namespace downpour {
namespace kernels {

// SplitMix64: a counter-based generator (element i needs no state). Dropout
// masks (CPU and GPU alike) and parameter initialisation draw from it.
DOWNPOUR_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The key of a dropout layer's mask at `step` (element i draws
// SplitMix64(key + i)), the same on every backend.
DOWNPOUR_HOST_DEVICE inline uint64_t DropoutKey(uint64_t seed, uint64_t step) {
  return SplitMix64(seed ^ SplitMix64(step));
}

// Element i's uniform draw in [0, 1) (24 bits) under `key`.
DOWNPOUR_HOST_DEVICE inline float DropoutUniform(uint64_t key, int64_t i) {
  return static_cast<float>(SplitMix64(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / (1 << 24));
}

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

// A sliding window over a batch of NHWC images: a convolution (out_c
// filters) or a pooling (out_c == in_c). Element (n, h, w, c) of an image is
// at ((n * H + h) * W + w) * C + c. Output (oh, ow) covers input rows
// oh * stride_h - pad_top + [0, kernel_h) and likewise for columns; positions
// outside the image are padding. Padding at the bottom/right is implied by
// out_h/out_w, so it may differ from pad_top/pad_left (TensorFlow's SAME).
struct WindowShape {
  int64_t batch = 0;
  int64_t in_h = 0, in_w = 0, in_c = 0;
  int64_t out_h = 0, out_w = 0, out_c = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;

  DOWNPOUR_HOST_DEVICE int64_t pad_bottom() const {
    return (out_h - 1) * stride_h + kernel_h - in_h - pad_top;
  }
  DOWNPOUR_HOST_DEVICE int64_t pad_right() const {
    return (out_w - 1) * stride_w + kernel_w - in_w - pad_left;
  }
  // Elements of one input / output image.
  DOWNPOUR_HOST_DEVICE int64_t in_elements() const { return in_h * in_w * in_c; }
  DOWNPOUR_HOST_DEVICE int64_t out_elements() const { return out_h * out_w * out_c; }
  // Elements of one convolution filter: kernel_h * kernel_w * in_c.
  DOWNPOUR_HOST_DEVICE int64_t patch_elements() const { return kernel_h * kernel_w * in_c; }
};

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_TYPES_H_
