// How a model split into pipeline stages (ModelShape::pipeline, validated
// by InferModel) becomes one ModelShape per stage, each of which a Model
// runs on its own device (Model::CreateStage), and how the stages' tensors
// map to the whole model's.
//
// A stage's shape holds its layers, re-indexed from 0. The first stage
// reads the model's input slots; a later stage reads, as its input slots
// (one per tensor), the outputs of earlier stages' layers that its layers
// read (shape().input_slots name them after those layers). Where later
// stages read a stage's outputs, its shape ends with a kStageOutput layer
// whose inputs are those outputs, once per stage reading each. The
// parameters of a stage are a contiguous run of the whole model's (ids are
// in layer order), renumbered from 0; so is its local state.
//
// Pure functions; thread-safe.
#ifndef DOWNPOUR_MODEL_PIPELINE_STAGES_H_
#define DOWNPOUR_MODEL_PIPELINE_STAGES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/model_shape.h"
#include "spec/params.h"

namespace downpour {

struct StageShape {
  ModelShape shape;     // No pipeline of its own.
  int first_layer = 0;  // Index in the whole model of the stage's first layer.
  // The whole model's ids of the stage's parameters and local state start
  // here (stage id k is whole-model id first_param + k).
  int32_t first_param = 0;
  int32_t first_state = 0;
  // The whole model's ParamInfo of each parameter, by stage id (its id seeds
  // the initial value).
  std::vector<ParamInfo> init_params;
  // Input slot k is the output of stage inputs[k].stage's kStageOutput input
  // inputs[k].output (empty for the first stage).
  struct Source {
    int stage = 0;
    int output = 0;
  };
  std::vector<Source> inputs;
  // The kStageOutput layer's input k goes to stage outputs[k].stage's input
  // slot outputs[k].slot.
  struct Destination {
    int stage = 0;
    int slot = 0;
  };
  std::vector<Destination> outputs;
  // Per example, elements of each input slot and of each output.
  std::vector<int64_t> input_widths, output_widths;
};

// The stages of `shape`: one per ModelShape::pipeline stage, or the whole
// model as one when it has no pipeline. InvalidArgument for a pipeline that
// InferModel would refuse (a layer of a later stage reading the model input
// or flattening an earlier stage's output).
absl::StatusOr<std::vector<StageShape>> SplitModel(const ModelShape& shape);

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_PIPELINE_STAGES_H_
