// Shape inference over a ModelSpec: validates the model graph and derives its
// parameters (names, shapes, initialisers) and each layer's output shape.
//
// This is the single place the parameter list of a ModelSpec is derived —
// the coordinator (validation, placement), the parameter server (initial
// values) and the worker (Model) all call InferModel, so parameter ids and
// initial values agree everywhere. It needs no compute kernels, so the
// control-plane daemons do not link CUDA. Pure functions; thread-safe.
#ifndef DOWNPOUR_SPEC_MODEL_SHAPE_H_
#define DOWNPOUR_SPEC_MODEL_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/window_shape.h"
#include "proto/job.pb.h"
#include "spec/params.h"

namespace downpour {

// Largest tensor the kernels take (BLAS sizes are 32-bit ints).
inline constexpr int64_t kMaxTensorElements = 2147483647;

// The product of `dims`, or -1 when it exceeds kMaxTensorElements.
int64_t CheckedProduct(const std::vector<int64_t>& dims);

enum class LayerKind {
  kDense,
  kRelu,
  kFlatten,
  kDropout,
  kSoftmaxCrossEntropy,
  kConv2d,
  kMaxPool,
  kAvgPool,
  kGlobalAvgPool,
  kBatchNorm,
  kAdd,
  kEmbedding,
};

// The name LayerSpec uses for a kind ("dense", "softmax_cross_entropy", ...).
const char* LayerKindName(LayerKind kind);

// One layer after validation.
struct LayerShape {
  // Index in `inputs` meaning the model's input features.
  static constexpr int kModelInput = -1;

  std::string name;  // As given, or "<type><index>".
  LayerKind kind = LayerKind::kDense;
  std::vector<int> inputs;            // Earlier layer indices, or kModelInput.
  std::vector<int64_t> output_shape;  // Per example, without the batch; {} for the loss.
  std::vector<int32_t> param_ids;     // Into ModelShape::params, in order.
  int64_t units = 0;                  // kDense.
  float dropout_rate = 0.f;           // kDropout.
  // kConv2d, kMaxPool, kAvgPool: the window over one example (batch 0; the
  // step sets it). Images are NHWC: input_shape is [height, width, channels].
  WindowShape window;
  float bn_momentum = 0.f;               // kBatchNorm (defaults resolved).
  float bn_epsilon = 0.f;                // kBatchNorm.
  std::vector<int32_t> local_state_ids;  // kBatchNorm: running mean, running var.
  int64_t vocab_size = 0;                // kEmbedding.
  int64_t embedding_dim = 0;             // kEmbedding.
};

struct ModelShape {
  std::vector<int64_t> input_shape;  // Per example, without the batch.
  int64_t input_size = 0;            // Product of input_shape.
  int32_t num_classes = 0;
  std::vector<ParamInfo> params;   // ids 0..n-1, in layer order.
  std::vector<LayerShape> layers;  // In spec order.
  // Non-trainable tensors each replica keeps for itself (batch norm running
  // statistics), ids 0..n-1 into this list. They are not parameters: the
  // parameter server never sees them, and each worker's evaluation uses its
  // own. `init` is kZeros or kOnes.
  std::vector<ParamInfo> local_state;
};

// Validates `spec` and derives its parameters and per-layer output shapes.
// A dense layer has "<layer>/weight" [in, out] (He uniform) then, unless
// no_bias, "<layer>/bias" [out] (zeros). A conv2d has "<layer>/weight"
// [filters, kernel_h, kernel_w, in_channels] (He uniform, fan_in = kernel_h *
// kernel_w * in_channels) and "<layer>/bias" [filters]; batch_norm has
// "<layer>/gamma" (ones) and "<layer>/beta" (zeros) [channels], plus local
// state "<layer>/running_mean" (zeros) and "<layer>/running_var" (ones);
// embedding has "<layer>/table" [vocab_size, dim] (Glorot uniform). Errors
// are InvalidArgument with one sentence naming the field, e.g.
//   model.layer[2] ("fc2"): input "fc9" is not an earlier layer
absl::StatusOr<ModelShape> InferModel(const ModelSpec& spec);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_MODEL_SHAPE_H_
