// The model graph of a job: shape inference over a ModelSpec, and a Model that
// owns one replica's parameters, gradients and activations and runs a training
// step (forward, then backward) or an evaluation on a batch.
//
// InferModel is the single place the parameter list of a ModelSpec is derived
// (worker, coordinator placement and parameter server all call it), so the
// parameter ids and initial values agree everywhere.
//
// Layers form a DAG: each reads the outputs named in LayerSpec.inputs (by
// default the previous layer's output). The gradient of an output read by
// several layers is the sum of their contributions.
//
// Thread safety: InferModel is a pure function. Model is thread-compatible:
// const methods may run concurrently; TrainStep and Evaluate mutate internal
// buffers and need external synchronisation. Model owns every buffer it
// returns pointers to; they stay valid for the Model's lifetime.
#ifndef DOWNPOUR_CORE_MODEL_H_
#define DOWNPOUR_CORE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/params.h"
#include "kernels/cpu.h"
#include "kernels/types.h"
#include "proto/job.pb.h"

namespace downpour {
namespace model_internal {
class Layer;
struct Buffer;
}  // namespace model_internal

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
  kernels::WindowShape window;
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

struct StepResult {
  double loss = 0.0;    // Mean over the batch.
  int64_t correct = 0;  // Examples whose argmax is the label.
};

struct EvalResult {
  double loss_sum = 0.0;  // Sum over the batch.
  int64_t correct = 0;
};

class Model {
 public:
  // Validates `spec` (InferModel) and initialises every parameter with
  // InitParamRange(param, seed, ...), so a model built with the same seed holds
  // the same values as the parameter server. Dropout masks are drawn from
  // (seed, layer, step).
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelSpec& spec, uint64_t seed);

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelShape& shape() const { return shape_; }
  const std::vector<ParamInfo>& params() const { return shape_.params; }
  // Elements of one example's features (the product of input_shape).
  int64_t input_size() const { return shape_.input_size; }
  int32_t num_classes() const { return shape_.num_classes; }

  // Contiguous buffers of params()[id].num_elements floats, row-major.
  // REQUIRES: 0 <= id < params().size().
  float* param(int id) { return params_[id].data(); }
  const float* param(int id) const { return params_[id].data(); }
  // The gradient of the mean loss with respect to param(id), as of the last
  // TrainStep (zeros before the first).
  float* grad(int id) { return grads_[id].data(); }
  const float* grad(int id) const { return grads_[id].data(); }

  // Forward in training mode (dropout active, masks from seed and `step`;
  // batch norm normalises with the batch's statistics and moves its running
  // ones), then backward: overwrites every grad(id). `features` is
  // [batch, input_size()], `labels` is [batch].
  // InvalidArgument for batch <= 0, null pointers, a label outside
  // [0, num_classes()), or a feature read by an embedding that is not an
  // integer id in [0, vocab_size).
  absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels, int64_t batch,
                                       int64_t step);

  // Local state (see ModelShape::local_state): batch norm's running
  // statistics, updated by TrainStep and read by Evaluate.
  // REQUIRES: 0 <= id < local_state().size().
  const std::vector<ParamInfo>& local_state() const { return shape_.local_state; }
  float* local_state_data(int id) { return local_state_[id].data(); }
  const float* local_state_data(int id) const { return local_state_[id].data(); }

  // Forward in inference mode (dropout is the identity, batch norm uses the
  // running statistics); grads untouched.
  absl::StatusOr<EvalResult> Evaluate(const float* features, const int32_t* labels, int64_t batch);

 private:
  Model(ModelShape shape, uint64_t seed);
  absl::Status CheckBatch(const float* features, const int32_t* labels, int64_t batch) const;
  void Reserve(int64_t batch);
  // Runs every layer's forward and fills *loss; dropout is active only when training.
  void Forward(const float* features, const int32_t* labels, int64_t batch, bool training,
               int64_t step, kernels::LossStats* loss);
  void Backward(const float* features, int64_t batch);
  const float* Activation(int buffer, const float* features) const;

  const ModelShape shape_;
  const uint64_t seed_;
  kernels::cpu::CpuContext ctx_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> local_state_;
  std::vector<std::unique_ptr<model_internal::Layer>> layers_;
  // Activation buffers; a layer that only reshapes (flatten) shares its
  // input's. Index 0 stands for the model input and owns no memory.
  std::vector<model_internal::Buffer> buffers_;
  std::vector<int> buffer_of_layer_;  // -1 for the loss (scalar output).
  int64_t capacity_ = 0;              // Largest batch the buffers hold.
};

}  // namespace downpour

#endif  // DOWNPOUR_CORE_MODEL_H_
