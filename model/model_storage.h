// The memory a Model (model.h) owns besides its layers' scratch, shared by
// model.cc and model_stage.cc. Internal to model/: nothing else includes it.
// Thread-compatible, as Model.
#ifndef DOWNPOUR_MODEL_MODEL_STORAGE_H_
#define DOWNPOUR_MODEL_MODEL_STORAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/layers.h"

namespace downpour {
namespace model_internal {

using kernels::DeviceMemory;

// One activation tensor: per-example size, values and (in training) the
// gradient of the loss with respect to them, in the compute memory. Both
// live in the Model's activation arena (model/arena.h), which reuses
// memory between tensors whose lifetimes in the step do not overlap.
struct Buffer {
  int64_t elements = 0;
  // >= 1: the values are that buffer's, overwritten in place (a ReLU that is
  // its input's only reader).
  int value_alias = -1;
  void* value_data = nullptr;
  void* grad_data = nullptr;
  kernels::Act value_ptr() const { return kernels::Act(value_data); }
  kernels::Act grad_ptr() const { return kernels::Act(grad_data); }
};

// What each micro-batch in flight keeps of its own (StageOptions::
// activation_sets): the passes use the model's current set, whose parts
// live in Storage, Model::layers_, scratch_at_, input_ and labels_; the
// others wait here (Model::UseSet swaps them), and sets[current] is empty.
struct ActivationSet {
  DeviceMemory arena;
  std::vector<void*> value, grad;  // Per buffer, as Buffer's.
  std::vector<char*> scratch_at;
  std::vector<std::unique_ptr<Layer>> layers;
  DeviceMemory input_activations, boundary_grad, output_grad;
  const float* input = nullptr;
  const int32_t* labels = nullptr;
};

// Every block of memory a Model owns besides its layers' scratch.
struct Storage {
  DeviceMemory params, grads, state;                 // Compute memory.
  DeviceMemory params_host, grads_host, state_host;  // GPU only: page-locked copies.
  DeviceMemory features, labels;                     // GPU only: the staged batch.
  // The input in the activation type: reduced activations' converted copy,
  // or a pipeline stage's boundary input (current set's).
  DeviceMemory input_activations;
  DeviceMemory features_host, labels_host;  // GPU only: page-locked staging.
  DeviceMemory slots;                       // ApplyOptimizerOnDevice's.
  // Sparse embeddings: the gradient of the loss with respect to the model
  // input (slot-major, as the input), and its host copy on a GPU.
  DeviceMemory input_grad, input_grad_host;
  // GPU, rows pooled on the device (Model::PooledStaging): the block of
  // rows and reads (host and device, the same layout) and the rows'
  // gradients (device and host).
  DeviceMemory pooled_host, pooled, pooled_grads, pooled_grads_host;
  // Per sparse table: its rows kept on the device between steps (StoredRows),
  // by place.
  std::vector<DeviceMemory> row_stores;
  // A pipeline stage's (current set's): the gradient of its boundary input
  // slots, and the gradients later stages sent back for its outputs.
  DeviceMemory boundary_grad, output_grad;
  std::vector<ActivationSet> sets;  // See ActivationSet.
  int num_slots = 0;
  std::vector<Buffer> buffers;       // Activations; [0] is the model input (no memory).
  DeviceMemory arena;                // Every buffer's values and gradients.
  std::vector<int> buffer_of_layer;  // -1 for the loss and kStageOutput (no output).
  int64_t capacity = 0;              // Largest batch the buffers hold.
  int64_t staged_capacity = 0;       // Largest batch features/labels hold.
};

}  // namespace model_internal
}  // namespace downpour

#endif  // DOWNPOUR_MODEL_MODEL_STORAGE_H_
