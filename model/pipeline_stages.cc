#include "model/pipeline_stages.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<std::vector<StageShape>> SplitModel(const ModelShape& shape) {
  const int n = static_cast<int>(shape.layers.size());
  PipelineShape pipeline = shape.pipeline;
  if (pipeline.num_stages() == 0) pipeline.first_layer = {0};
  const int stages = pipeline.num_stages();
  auto end_of = [&](int s) { return s + 1 < stages ? pipeline.first_layer[s + 1] : n; };

  // Every tensor crossing stages, as (producer layer, consumer stage), in
  // producer order: the consumer's input slots and the producer's outputs.
  std::vector<std::pair<int, int>> edges;
  for (int i = 0; i < n; ++i) {
    const int consumer = pipeline.StageOf(i);
    for (int input : shape.layers[i].inputs) {
      if (input < 0) {
        if (consumer > 0) {
          return absl::InvalidArgumentError(absl::StrCat("layer \"", shape.layers[i].name,
                                                         "\" of stage ", consumer,
                                                         " reads the model input"));
        }
        continue;
      }
      if (pipeline.StageOf(input) == consumer) continue;
      if (shape.layers[i].kind == LayerKind::kFlatten) {
        return absl::InvalidArgumentError(
            absl::StrCat("flatten \"", shape.layers[i].name, "\" reads an earlier stage's output"));
      }
      edges.emplace_back(input, consumer);
    }
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());

  std::vector<StageShape> result(stages);
  // (producer layer, consumer stage) -> the consumer's slot.
  std::map<std::pair<int, int>, int> slot_of;
  for (int s = 0; s < stages; ++s) {
    StageShape& stage = result[s];
    ModelShape& out = stage.shape;
    const int begin = pipeline.first_layer[s], end = end_of(s);
    stage.first_layer = begin;
    out.num_classes = shape.num_classes;
    if (s == 0) {
      out.input_shape = shape.input_shape;
      out.input_size = shape.input_size;
      out.input_slots = shape.input_slots;
      out.inputs = shape.inputs;
    } else {
      for (const auto& [producer, consumer] : edges) {
        if (consumer != s) continue;
        InputSlot slot;
        slot.name = shape.layers[producer].name;
        slot.shape = shape.layers[producer].output_shape;
        slot.width = CheckedProduct(slot.shape);
        slot.offset = out.input_size;
        out.input_size += slot.width;
        slot_of[{producer, s}] = static_cast<int>(out.input_slots.size());
        stage.input_widths.push_back(slot.width);
        out.input_slots.push_back(std::move(slot));
      }
      out.input_shape = {out.input_size};
    }
    // Parameters and local state: contiguous runs, as the layers are.
    stage.first_param = static_cast<int32_t>(shape.params.size());
    stage.first_state = static_cast<int32_t>(shape.local_state.size());
    for (int i = begin; i < end; ++i) {
      for (int32_t id : shape.layers[i].param_ids) {
        stage.first_param = std::min(stage.first_param, id);
      }
      for (int32_t id : shape.layers[i].local_state_ids) {
        stage.first_state = std::min(stage.first_state, id);
      }
    }
    for (int i = begin; i < end; ++i) {
      LayerShape layer = shape.layers[i];
      for (int& input : layer.inputs) {
        if (input < 0) continue;
        input = input >= begin ? input - begin : LayerShape::ModelInputSlot(slot_of.at({input, s}));
      }
      for (int32_t& id : layer.param_ids) {
        ParamInfo p = shape.params[id];
        stage.init_params.push_back(p);
        p.id = id - stage.first_param;
        id = p.id;
        out.params.push_back(std::move(p));
      }
      for (int32_t& id : layer.local_state_ids) {
        ParamInfo p = shape.local_state[id];
        p.id = id - stage.first_state;
        id = p.id;
        out.local_state.push_back(std::move(p));
      }
      out.layers.push_back(std::move(layer));
    }
  }
  // Each stage's outputs: the tensors later stages read, once per reader.
  for (const auto& [producer, consumer] : edges) {
    StageShape& stage = result[pipeline.StageOf(producer)];
    if (stage.outputs.empty()) {
      LayerShape sink;
      sink.name = "stage_output";
      sink.kind = LayerKind::kStageOutput;
      stage.shape.layers.push_back(std::move(sink));
    }
    const int slot = slot_of.at({producer, consumer});
    stage.shape.layers.back().inputs.push_back(producer - stage.first_layer);
    stage.outputs.push_back({consumer, slot});
    stage.output_widths.push_back(result[consumer].input_widths[slot]);
    result[consumer].inputs.resize(result[consumer].shape.input_slots.size());
    result[consumer].inputs[slot] = {pipeline.StageOf(producer),
                                     static_cast<int>(stage.outputs.size()) - 1};
  }
  return result;
}

}  // namespace downpour
