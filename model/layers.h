// The layers of a model: each layer kind's forward and backward over the ops
// of a compute backend (kernels/backend.h), built from its LayerShape
// (spec/model_shape.h). A Model (model/model.h) owns the layers, their
// parameters and the activations they read and write; a layer owns only its
// scratch (dropout mask, dlogits, batch statistics), in the backend's memory.
//
// Thread-compatible: a layer is driven by its model's thread.
#ifndef DOWNPOUR_MODEL_LAYERS_H_
#define DOWNPOUR_MODEL_LAYERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "spec/model_shape.h"

namespace downpour {
namespace model_internal {

using kernels::Act;
using kernels::ComputeBackend;

struct ForwardArgs {
  int64_t batch = 0;
  bool training = false;
  uint64_t step = 0;
  std::vector<Act> x;  // One per LayerShape::inputs entry.
  Act y;               // Null for the loss and for aliasing layers.
  const int32_t* labels = nullptr;
  // The layer's model-input slot as given (floats), for embeddings' ids.
  const float* model_input = nullptr;
  float loss_scale = 1.f;  // FP16: what the loss's gradient is multiplied by.
};

struct BackwardArgs {
  int64_t batch = 0;
  std::vector<Act> x;
  Act y;
  Act dy;                                // Null for the loss.
  std::vector<Act> dx;                   // Null entries: no gradient wanted (model input).
  std::vector<kernels::Write> dx_write;  // Overwrite for the first contribution, then add.
  const float* model_input = nullptr;
  // How parameter gradients are written: a pipeline stage adds each
  // micro-batch's to the step's (model/pipeline.h).
  kernels::Write param_write = kernels::Write::kOverwrite;
  // kStageOutput: the gradients later stages sent back, one block of
  // [batch, width] per input, in input order.
  Act stage_output_grad;
};

// A layer's computation over the backend's ops.
class Layer {
 public:
  virtual ~Layer() = default;
  // Grows per-batch scratch to hold `batch` examples.
  virtual absl::Status Reserve(ComputeBackend& /*backend*/, int64_t /*batch*/) {
    return absl::OkStatus();
  }
  // True for layers that only reinterpret their input's shape: they share the
  // input's buffer and do nothing in forward or backward.
  virtual bool aliases_input() const { return false; }
  // Fusion of a convolution with the in-place ReLU that alone reads its
  // output: the convolution applies it in the pass that writes its output
  // (FuseFollowingRelu returns whether it can), and the ReLU's forward then
  // has nothing left to do (ForwardDoneByInput); its backward is unchanged.
  virtual bool FuseFollowingRelu() { return false; }
  virtual void ForwardDoneByInput() {}
  virtual absl::Status Forward(ComputeBackend& backend, const ForwardArgs& args) = 0;
  virtual absl::Status Backward(ComputeBackend& backend, const BackwardArgs& args) = 0;
};

// Where a layer's tensors live in the compute memory: its parameters and
// their gradients in LayerShape::param_ids order (null past the end), and its
// local state (batch norm's running mean and variance).
struct LayerTensors {
  std::vector<const float*> params;
  std::vector<float*> grads;
  std::vector<float*> state;
};

// The layer `shape.layers[index]` of a model seeded with `seed`. Dropout
// draws its masks from `mask_index` (the layer's index in the whole model
// when `shape` is a pipeline stage's; -1: `index`).
std::unique_ptr<Layer> MakeLayer(const ModelShape& shape, size_t index, uint64_t seed,
                                 const LayerTensors& tensors, int64_t mask_index = -1);

}  // namespace model_internal
}  // namespace downpour

#endif  // DOWNPOUR_MODEL_LAYERS_H_
