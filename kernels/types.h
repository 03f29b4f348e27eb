// Types shared by every kernel backend (the CPU reference in kernels/cpu/ and
// its CUDA twin in kernels/cuda/), so callers can switch backend without
// changing the arguments they pass. Plain values; thread-compatible.
#ifndef DOWNPOUR_KERNELS_TYPES_H_
#define DOWNPOUR_KERNELS_TYPES_H_

#include <cstdint>

#include "common/host_device.h"
#include "common/splitmix64.h"
#include "common/window_shape.h"

namespace downpour {
namespace kernels {

// The key of a dropout layer's mask at `step` (element i draws
// DropoutUniform(key, i)), the same on every backend.
DOWNPOUR_HOST_DEVICE inline uint64_t DropoutKey(uint64_t seed, uint64_t step) {
  return SplitMix64(seed ^ SplitMix64(step));
}

// Element i's uniform draw in [0, 1) (24 bits) under `key`.
DOWNPOUR_HOST_DEVICE inline float DropoutUniform(uint64_t key, int64_t i) {
  return static_cast<float>(SplitMix64(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / (1 << 24));
}

// The table row an embedding id names (ids are integers stored as floats),
// or -1 when it is not an integer in [0, vocab).
DOWNPOUR_HOST_DEVICE inline int64_t EmbeddingRow(float id, int64_t vocab) {
  if (!(id >= 0.f) || id >= static_cast<float>(vocab)) return -1;
  const int64_t row = static_cast<int64_t>(id);
  return static_cast<float>(row) == id ? row : -1;
}

// One sparse table's reads in a batch of B examples, laid out for
// ComputeBackend::PoolRows and PoolRowsBackward: the distinct rows the batch
// reads, which row each id names, and (for the gradient) which examples
// read each row. Pointers are in the compute memory (device memory on a
// GPU); a kernel reads an array of these, one per table.
struct PooledTable {
  int64_t dim = 0;
  // Where the table's slot starts in the features and in their gradient,
  // in floats: B * the slot's offset (the input is slot-major).
  int64_t slot = 0;
  int32_t mean = 0;                    // MEAN pooling (else SUM).
  int32_t rows = 0;                    // Distinct rows.
  const float* values = nullptr;       // rows * dim.
  const int32_t* offsets = nullptr;    // B + 1: example b reads ids [offsets[b], offsets[b + 1]).
  const int32_t* index = nullptr;      // Per id: its row.
  const int32_t* row_reads = nullptr;  // Per row: where its reads start in readers (rows + 1).
  const int32_t* readers = nullptr;    // The example of each read, a row's in id order.
  float* grads = nullptr;              // rows * dim: each row's gradient.
  // A table whose rows stay in the compute memory between steps: `store`
  // holds them by place and row r is at places[r] (values unused); before
  // pooling, the `fresh` rows at fresh_values (fresh * dim) are written to
  // their places (fresh_places).
  float* store = nullptr;
  const int32_t* places = nullptr;
  int32_t fresh = 0;
  const int32_t* fresh_places = nullptr;
  const float* fresh_values = nullptr;
};

// Where row r of `table` is read from: its values, or its place in the
// store.
DOWNPOUR_HOST_DEVICE inline const float* PooledRow(const PooledTable& table, int32_t r) {
  return table.store != nullptr ? table.store + int64_t{table.places[r]} * table.dim
                                : table.values + int64_t{r} * table.dim;
}

// A row's gradient is summed by this many lanes (a GPU warp), lane l over
// the row's reads l, l + kPoolLanes, ..., the lanes' sums then halved in a
// tree: lane i + h joins lane i for h = 16, 8, 4, 2, 1. The CPU twin sums
// in the same order.
constexpr int kPoolLanes = 32;

// An example of `reads` ids pooled with MEAN is scaled by this; SUM by 1.
DOWNPOUR_HOST_DEVICE inline float PoolScale(bool mean, int64_t reads) {
  return mean && reads > 1 ? 1.f / static_cast<float>(reads) : 1.f;
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

// What a GPU backend stores activations in and multiplies in: fp32, or
// bf16/fp16 activations with tensor-core products (fp32 accumulation,
// parameters and statistics). The CPU computes everything in fp32.
enum class ComputePrecision { kFp32, kBf16, kFp16 };

// Which fp32 products a GPU may run on TF32 tensor cores: inputs rounded to
// a 10-bit mantissa (relative error up to 2^-11), products summed in fp32.
// PyTorch's torch.backends.cudnn.allow_tf32 (true by default) and
// torch.backends.cuda.matmul.allow_tf32 (false by default). It governs fp32
// convolutions and GEMMs, including those a bf16/fp16 backend runs in fp32
// on converted copies; bf16/fp16 products are tensor-core products anyway.
// The CPU computes in full fp32 whatever is asked.
enum class Tf32Policy {
  // FMA-only fp32: results within fp32 rounding of the CPU twin.
  kOff,
  // cuDNN may pick TF32 convolution algorithms (where it measures them
  // faster); GEMMs in full fp32. PyTorch's default.
  kConvolutions,
  // Convolutions and cuBLAS GEMMs on TF32 tensor cores.
  kConvolutionsAndGemms,
};

constexpr bool Tf32Convolutions(Tf32Policy p) { return p != Tf32Policy::kOff; }
constexpr bool Tf32Gemms(Tf32Policy p) { return p == Tf32Policy::kConvolutionsAndGemms; }

// Memory layout GPU convolutions run in. Tensors are NHWC at the API either
// way; kNchw convolves transposed copies in the workspace. kAuto measures
// both per shape (transposes included) and keeps the faster.
enum class ConvLayout { kAuto, kNhwc, kNchw };

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_TYPES_H_
