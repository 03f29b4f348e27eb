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

// "[2, 3]": a shape in messages.
std::string ShapeString(const std::vector<int64_t>& shape);

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
  kConcat,
  kDotInteraction,
  // Never in a ModelSpec: the last layer of a pipeline stage whose outputs
  // later stages read (model/pipeline_stages.h). Its inputs are those
  // outputs; it has no output of its own, and its backward hands each input
  // the gradient the later stages sent back.
  kStageOutput,
};

// The name LayerSpec uses for a kind ("dense", "softmax_cross_entropy", ...).
const char* LayerKindName(LayerKind kind);

// One layer after validation.
struct LayerShape {
  // Index in `inputs` meaning the model's input features: slot 0 of
  // ModelShape::input_slots (the whole input of a model without named
  // inputs). Slot k is kModelInput - k.
  static constexpr int kModelInput = -1;
  static constexpr int ModelInputSlot(int slot) { return kModelInput - slot; }
  // The slot an input index names; REQUIRES: input < 0.
  static constexpr int SlotOf(int input) { return kModelInput - input; }

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
  // kEmbedding with sparse: true: its table is ModelShape::sparse_tables
  // [sparse_table], not a parameter; the layer copies its model-input slot
  // (the pooled rows the worker writes there) to its output, and its
  // gradient back to that slot of the input gradient.
  int sparse_table = -1;
};

// A contiguous part of the model input. The input of a batch is slot-major:
// slot k's values, [batch, width] example-major, start at element
// batch * offset, so a layer reads its slot without a copy.
struct InputSlot {
  std::string name;  // The input's (or the sparse embedding layer's) name.
  int64_t offset = 0;
  int64_t width = 0;  // Product of shape.
  std::vector<int64_t> shape;
  // ModelSpec.inputs index of a DENSE input, or -1.
  int input = -1;
  // ModelShape::sparse_tables index whose pooled rows the worker writes
  // here, or -1.
  int sparse_table = -1;
};

// A sparse embedding table (EmbeddingLayer with sparse: true), held by the
// parameter servers, rows created on first touch.
struct SparseTableInfo {
  std::string name;  // "<layer>/table".
  int layer = -1;    // Index in ModelShape::layers.
  int input = -1;    // ModelSpec.inputs index of its SPARSE input.
  int slot = -1;     // Index in ModelShape::input_slots.
  // Ids lie in [0, vocab_size); with hash_ids, any id is hashed into it
  // (vocab_size 2^63 - 1 standing for 2^63 when the spec gives 0).
  int64_t vocab_size = 0;
  bool hash_ids = false;
  int64_t dim = 0;
  bool mean = false;       // The combiner: MEAN (true) or SUM.
  float init_scale = 0.f;  // Resolved: > 0.
  int64_t max_rows = 0;
  EmbeddingLayer::Eviction eviction = EmbeddingLayer::LRU;
  // EmbeddingLayer.embedding_staleness: steps a read row may be behind.
  int staleness = 0;
  // The table's optimizer when set, else the job's (resolved by the caller).
  bool has_optimizer = false;
  OptimizerSpec optimizer;
};

// "model.layer[i].embedding.optimizer": where sparse table `table`'s own
// optimizer is set.
std::string SparseTableOptimizerField(const SparseTableInfo& table);

// The one rule on a sparse table's optimizer kind: SGD, ADAGRAD or ADAM, not
// MOMENTUM (a table updates only the rows a step touched, and keeps no
// velocity for the others). `kind` is the table's own optimizer's or, without
// one, the job's. InvalidArgument naming the table and the field to set.
absl::Status CheckSparseTableOptimizerKind(const SparseTableInfo& table, OptimizerSpec::Kind kind);

// ModelSpec.pipeline after validation: the model's layers cut into stages
// that follow the layer order.
struct PipelineShape {
  // The index in ModelShape::layers of each stage's first layer (ascending;
  // stage s ends where stage s + 1 begins). Empty: no pipeline.
  std::vector<int> first_layer;
  int micro_batches = 0;  // Resolved: > 0.
  PipelineSpec::Schedule schedule = PipelineSpec::ONE_F_ONE_B;

  int num_stages() const { return static_cast<int>(first_layer.size()); }
  // REQUIRES: num_stages() > 0 and 0 <= layer < the model's layer count.
  int StageOf(int layer) const;
};

struct ModelShape {
  // Per example, without the batch: ModelSpec.input_shape, or [input_size]
  // for a model with named inputs.
  std::vector<int64_t> input_shape;
  int64_t input_size = 0;  // Elements per example: the sum of the slots' widths.
  // One slot for a model without named inputs; else one per DENSE input
  // (in spec order), then one per sparse embedding layer (in layer order).
  std::vector<InputSlot> input_slots;
  std::vector<SparseTableInfo> sparse_tables;
  // A copy of ModelSpec.inputs (for the data reader).
  std::vector<InputSpec> inputs;
  int32_t num_classes = 0;
  std::vector<ParamInfo> params;   // ids 0..n-1, in layer order.
  std::vector<LayerShape> layers;  // In spec order.
  // Non-trainable tensors each replica keeps for itself (batch norm running
  // statistics), ids 0..n-1 into this list. They are not parameters: the
  // parameter server never sees them, and each worker's evaluation uses its
  // own. `init` is kZeros or kOnes.
  std::vector<ParamInfo> local_state;
  PipelineShape pipeline;
};

// Validates `spec` and derives its parameters and per-layer output shapes.
// A dense layer has "<layer>/weight" [in, out] then, unless no_bias,
// "<layer>/bias" [out]. A conv2d has "<layer>/weight" [filters, kernel_h,
// kernel_w, in_channels] (fan_in = kernel_h * kernel_w * in_channels) and
// "<layer>/bias" [filters]; both start as their `initializer` says (He
// uniform weight and zero bias by default); batch_norm has
// "<layer>/gamma" (ones) and "<layer>/beta" (zeros) [channels], plus local
// state "<layer>/running_mean" (zeros) and "<layer>/running_var" (ones);
// embedding has "<layer>/table" [vocab_size, dim] (Glorot uniform). A
// pipeline (ModelSpec.pipeline) is checked against the layers: every layer
// in exactly one stage, stages in layer order, only the first reading the
// model's inputs, no sparse embedding, no stage beginning with a flatten of
// an earlier stage's output, and no embedding reading ids from one. Errors
// are InvalidArgument with one sentence naming the field, e.g.
//   model.layer[2] ("fc2"): input "fc9" is not an earlier layer
absl::StatusOr<ModelShape> InferModel(const ModelSpec& spec);

// The image [H, W, C] a dense layer's one input is a flatten of, or {}: the
// dense weights PyTorch holds with their inputs in (c, h, w) order, where
// ours are (h, w, c) (control/export.h's PyTorch layout, and the ONNX graph
// of spec/onnx_export.h, which must agree on it).
std::vector<int64_t> FlattenedImage(const ModelShape& shape, const LayerShape& dense);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_MODEL_SHAPE_H_
