#include "spec/model_shape.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "spec/limits.h"

namespace downpour {

int64_t CheckedProduct(const std::vector<int64_t>& dims) {
  int64_t product = 1;
  for (int64_t d : dims) {
    if (d != 0 && product > kMaxTensorElements / d) return -1;
    product *= d;
  }
  return product;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

ParamInfo MakeParam(int32_t id, std::string name, std::vector<int64_t> shape, ParamInit init,
                    int64_t fan_in, int64_t fan_out) {
  ParamInfo p;
  p.id = id;
  p.name = std::move(name);
  p.num_elements = CheckedProduct(shape);
  p.shape = std::move(shape);
  p.init = init;
  p.fan_in = fan_in;
  p.fan_out = fan_out;
  return p;
}

// Reads a [v] or [h, w] field of `layer_kind` into *h, *w; both `fallback`
// values when the field is empty.
absl::Status PairOf(const std::string& where, const std::string& field,
                    const google::protobuf::RepeatedField<int32_t>& values, int64_t fallback_h,
                    int64_t fallback_w, int64_t* h, int64_t* w) {
  if (values.empty()) {
    *h = fallback_h;
    *w = fallback_w;
  } else if (values.size() == 1) {
    *h = *w = values[0];
  } else if (values.size() == 2) {
    *h = values[0];
    *w = values[1];
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", field, " takes 1 or 2 values, got ", values.size()));
  }
  if (*h <= 0 || *w <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " must be positive, got [",
                                                   absl::StrJoin(values, ", "), "]"));
  }
  return absl::OkStatus();
}

// Output size and leading padding of one spatial axis; see Padding in job.proto.
absl::Status ResolveAxis(const std::string& where, const std::string& kind, const char* axis,
                         int64_t in, int64_t window, int64_t stride, Padding padding,
                         int64_t pad_before, int64_t pad_after, bool pool, int64_t* out,
                         int64_t* pad_top) {
  switch (padding) {
    case SAME: {
      *out = (in + stride - 1) / stride;
      const int64_t total = std::max<int64_t>((*out - 1) * stride + window - in, 0);
      *pad_top = total / 2;
      return absl::OkStatus();
    }
    case VALID:
      pad_before = pad_after = 0;
      break;
    case EXPLICIT:
      if (pool && (pad_before >= window || pad_after >= window)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", kind, ".explicit_padding must be smaller than the window along ", axis,
            " (", window, "), got ", pad_before, " and ", pad_after));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", kind, ".padding ", static_cast<int>(padding), " is unknown"));
  }
  if (in + pad_before + pad_after < window) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", kind, " window ", window,
                                                   " is larger than the padded input ", axis, " ",
                                                   in + pad_before + pad_after));
  }
  *out = (in + pad_before + pad_after - window) / stride + 1;
  *pad_top = pad_before;
  return absl::OkStatus();
}

// The window of a conv2d (out_c = filters) or pooling (out_c = in channels)
// layer over one [h, w, c] example.
absl::Status ResolveWindow(const std::string& where, const std::string& kind,
                           const std::vector<int64_t>& in_shape,
                           const google::protobuf::RepeatedField<int32_t>& window_field,
                           const google::protobuf::RepeatedField<int32_t>& stride_field,
                           Padding padding,
                           const google::protobuf::RepeatedField<int32_t>& explicit_padding,
                           int64_t out_c, bool pool, WindowShape* s) {
  const std::string window_name = absl::StrCat(kind, pool ? ".window" : ".kernel_size");
  if (window_field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", window_name, " is required"));
  }
  RETURN_IF_ERROR(PairOf(where, window_name, window_field, 0, 0, &s->kernel_h, &s->kernel_w));
  RETURN_IF_ERROR(PairOf(where, absl::StrCat(kind, ".stride"), stride_field, pool ? s->kernel_h : 1,
                         pool ? s->kernel_w : 1, &s->stride_h, &s->stride_w));
  int64_t pads[4] = {0, 0, 0, 0};  // top, bottom, left, right
  if (padding == EXPLICIT) {
    if (explicit_padding.size() == 2) {
      pads[0] = pads[1] = explicit_padding[0];
      pads[2] = pads[3] = explicit_padding[1];
    } else if (explicit_padding.size() == 4) {
      for (int k = 0; k < 4; ++k) pads[k] = explicit_padding[k];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", kind,
                       ".explicit_padding takes [pad_h, pad_w] or [top, bottom, left, "
                       "right] with padding EXPLICIT, got ",
                       explicit_padding.size(), " values"));
    }
    for (int64_t p : pads) {
      if (p < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", kind, ".explicit_padding must not be negative, got ", p));
      }
    }
  } else if (!explicit_padding.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", kind, ".explicit_padding needs padding: EXPLICIT"));
  }
  s->in_h = in_shape[0];
  s->in_w = in_shape[1];
  s->in_c = in_shape[2];
  s->out_c = out_c;
  RETURN_IF_ERROR(ResolveAxis(where, kind, "height", s->in_h, s->kernel_h, s->stride_h, padding,
                              pads[0], pads[1], pool, &s->out_h, &s->pad_top));
  RETURN_IF_ERROR(ResolveAxis(where, kind, "width", s->in_w, s->kernel_w, s->stride_w, padding,
                              pads[2], pads[3], pool, &s->out_w, &s->pad_left));
  return absl::OkStatus();
}

}  // namespace

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kDense:
      return "dense";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kFlatten:
      return "flatten";
    case LayerKind::kDropout:
      return "dropout";
    case LayerKind::kSoftmaxCrossEntropy:
      return "softmax_cross_entropy";
    case LayerKind::kConv2d:
      return "conv2d";
    case LayerKind::kMaxPool:
      return "max_pool";
    case LayerKind::kAvgPool:
      return "avg_pool";
    case LayerKind::kGlobalAvgPool:
      return "global_avg_pool";
    case LayerKind::kBatchNorm:
      return "batch_norm";
    case LayerKind::kAdd:
      return "add";
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kConcat:
      return "concat";
    case LayerKind::kDotInteraction:
      return "dot_interaction";
    case LayerKind::kStageOutput:
      return "stage_output";
  }
  return "unknown";
}

namespace {

// Largest InputSpec.max_ids.
constexpr int32_t kMaxIdsPerExample = 1 << 16;

// Indices by name: of ModelSpec.inputs, or of the layers inferred so far.
using IndexOfName = std::unordered_map<std::string, int>;

// Validates ModelSpec.inputs into `model` (a slot per DENSE input) and
// `input_of_name`.
absl::Status InferInputs(const ModelSpec& spec, ModelShape* model, IndexOfName* input_of_name) {
  for (int i = 0; i < spec.inputs_size(); ++i) {
    InputSpec input = spec.inputs(i);
    const std::string where = absl::StrFormat("model.inputs[%d] (\"%s\")", i, input.name());
    auto error = [&where](auto&&... parts) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
    };
    if (input.name().empty()) return error("name is required");
    if (!input_of_name->emplace(input.name(), i).second) return error("duplicate input name");
    if (input.features().empty()) input.add_features(input.name());
    for (const std::string& feature : input.features()) {
      if (feature.empty()) return error("a feature name is empty");
    }
    switch (input.kind()) {
      case InputSpec::DENSE: {
        if (input.max_ids() != 0) return error("max_ids is for SPARSE inputs");
        if (input.shape().empty()) input.add_shape(input.features_size());
        InputSlot slot;
        slot.name = input.name();
        slot.shape.assign(input.shape().begin(), input.shape().end());
        for (int64_t d : slot.shape) {
          if (d <= 0) return error("shape must be positive, got ", ShapeString(slot.shape));
        }
        slot.width = CheckedProduct(slot.shape);
        if (slot.width < 0) return error("shape has more than 2^31-1 elements");
        slot.input = i;
        model->input_slots.push_back(std::move(slot));
        break;
      }
      case InputSpec::SPARSE:
        if (input.features_size() != 1) {
          return error("a SPARSE input reads exactly 1 feature, got ", input.features_size());
        }
        if (!input.shape().empty()) return error("shape is for DENSE inputs");
        if (input.max_ids() == 0) input.set_max_ids(64);
        if (input.max_ids() < 0 || input.max_ids() > kMaxIdsPerExample) {
          return error("max_ids must be in [1, ", kMaxIdsPerExample, "], got ", input.max_ids());
        }
        break;
      default:
        return error("kind ", static_cast<int>(input.kind()), " is unknown");
    }
    model->inputs.push_back(std::move(input));
  }
  return absl::OkStatus();
}

// ModelSpec.input_shape (or ModelSpec.inputs: InferInputs) into `model`'s
// input shape and slots.
absl::Status InferModelInput(const ModelSpec& spec, ModelShape* model, IndexOfName* input_of_name) {
  if (spec.inputs_size() > 0) {
    if (spec.input_shape_size() > 0) {
      return absl::InvalidArgumentError(
          "model.input_shape and model.inputs exclude each other: give the shapes in inputs");
    }
    return InferInputs(spec, model, input_of_name);
  }
  if (spec.input_shape_size() == 0) {
    return absl::InvalidArgumentError("model.input_shape (or model.inputs) is required");
  }
  for (int i = 0; i < spec.input_shape_size(); ++i) {
    if (spec.input_shape(i) <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model.input_shape[%d] must be positive, got %d", i, spec.input_shape(i)));
    }
  }
  model->input_shape.assign(spec.input_shape().begin(), spec.input_shape().end());
  model->input_size = CheckedProduct(model->input_shape);
  if (model->input_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.input_shape ", ShapeString(model->input_shape), " has more than 2^31-1 elements"));
  }
  InputSlot whole;
  whole.name = "input";
  whole.shape = model->input_shape;
  whole.width = model->input_size;
  model->input_slots.push_back(std::move(whole));
  return absl::OkStatus();
}

// The offsets of a model with named inputs: its slots one after the other.
absl::Status LayOutInputSlots(ModelShape* model) {
  if (model->inputs.empty()) return absl::OkStatus();  // One slot, the whole input.
  for (InputSlot& slot : model->input_slots) {
    slot.offset = model->input_size;
    model->input_size += slot.width;
    if (model->input_size > kMaxTensorElements) {
      return absl::InvalidArgumentError("model.inputs: more than 2^31-1 elements per example");
    }
  }
  model->input_shape = {model->input_size};
  return absl::OkStatus();
}

// One layer's inference: the LayerSpec it reads, the LayerShape it fills in
// and the model it adds parameters (and, for a sparse embedding, a table and
// an input slot) to. The layer joins model->layers only when it is whole.
struct LayerInference {
  const LayerSpec& spec;
  int index;
  int last;           // The model's last layer.
  std::string where;  // model.layer[i] ("name"): what every error begins with.
  LayerShape* layer;
  ModelShape* model;

  template <typename... Parts>
  absl::Status Error(const Parts&... parts) const {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
  }
  const char* kind() const { return LayerKindName(layer->kind); }
  // The output shape of the layer's k-th input: an earlier layer or a slot
  // of the model input.
  const std::vector<int64_t>& InputShape(size_t k) const {
    const int input = layer->inputs[k];
    return input < 0 ? model->input_slots[LayerShape::SlotOf(input)].shape
                     : model->layers[input].output_shape;
  }
  // Adds "<layer>/<suffix>" to the model's parameters and the layer's.
  void AddParam(absl::string_view suffix, std::vector<int64_t> shape, ParamInit init,
                int64_t fan_in, int64_t fan_out) const {
    const int32_t id = static_cast<int32_t>(model->params.size());
    model->params.push_back(MakeParam(id, absl::StrCat(layer->name, "/", suffix), std::move(shape),
                                      init, fan_in, fan_out));
    layer->param_ids.push_back(id);
  }
  // Adds "<layer>/<suffix>", [channels], to the model's local state and the layer's.
  void AddLocalState(absl::string_view suffix, int64_t channels, ParamInit init) const {
    const int32_t id = static_cast<int32_t>(model->local_state.size());
    model->local_state.push_back(MakeParam(id, absl::StrCat(layer->name, "/", suffix), {channels},
                                           init, channels, channels));
    layer->local_state_ids.push_back(id);
  }
  // An error unless the layer's first input is one [height, width, channels]
  // image per example.
  absl::Status RequireImageInput() const {
    if (InputShape(0).size() == 3) return absl::OkStatus();
    return Error(kind(), " needs a [height, width, channels] input, got ",
                 ShapeString(InputShape(0)));
  }
  // An error unless every input has the first's shape (add, dot_interaction).
  absl::Status RequireSameInputShapes() const {
    for (size_t k = 1; k < layer->inputs.size(); ++k) {
      if (InputShape(k) != InputShape(0)) {
        return Error(kind(), " inputs must have the same shape; \"", spec.inputs(0), "\" is ",
                     ShapeString(InputShape(0)), " but \"", spec.inputs(k), "\" is ",
                     ShapeString(InputShape(k)));
      }
    }
    return absl::OkStatus();
  }
};

// Fills in layer->inputs from LayerSpec.inputs (none: the previous layer, or
// the model input of the first layer). A SPARSE model input is only for a
// sparse embedding: its index goes to *sparse_input, and a placeholder to
// the inputs (its slot is made by InferSparseEmbedding).
absl::Status ResolveLayerInputs(const LayerInference& c, const IndexOfName& input_of_name,
                                const IndexOfName& index_of_name, int* sparse_input) {
  LayerShape& layer = *c.layer;
  auto read_input = [&](int index) -> absl::Status {
    const InputSpec& input = c.model->inputs[index];
    if (input.kind() == InputSpec::SPARSE) {
      if (layer.kind != LayerKind::kEmbedding || !c.spec.embedding().sparse()) {
        return c.Error("input \"", input.name(),
                       "\" is SPARSE: only an embedding with sparse: true reads it");
      }
      *sparse_input = index;
      layer.inputs.push_back(LayerShape::kModelInput);
      return absl::OkStatus();
    }
    for (size_t k = 0; k < c.model->input_slots.size(); ++k) {
      if (c.model->input_slots[k].input == index) {
        layer.inputs.push_back(LayerShape::ModelInputSlot(static_cast<int>(k)));
      }
    }
    return absl::OkStatus();
  };
  if (c.spec.inputs_size() == 0) {
    const size_t named = c.model->inputs.size();
    if (c.index > 0) {
      layer.inputs.push_back(c.index - 1);
    } else if (named > 1) {
      return c.Error("set inputs: the model has ", named, " named inputs");
    } else if (named == 1) {
      return read_input(0);
    } else {
      layer.inputs.push_back(LayerShape::kModelInput);
    }
  }
  for (const std::string& name : c.spec.inputs()) {
    if (auto it = input_of_name.find(name); it != input_of_name.end()) {
      RETURN_IF_ERROR(read_input(it->second));
      continue;
    }
    auto it = index_of_name.find(name);
    if (it == index_of_name.end()) {
      return c.Error("input \"", name, "\" is not a model input or an earlier layer");
    }
    layer.inputs.push_back(it->second);
  }
  return absl::OkStatus();
}

// Validates a sparse embedding (EmbeddingLayer with sparse: true) reading
// SPARSE input `input`, and adds its table and input slot.
absl::Status InferSparseEmbedding(const LayerInference& c, int input) {
  const EmbeddingLayer& emb = c.spec.embedding();
  ModelShape* model = c.model;
  if (input < 0 || model->inputs[input].kind() != InputSpec::SPARSE) {
    return c.Error("embedding with sparse: true reads a SPARSE model input (ModelSpec.inputs)");
  }
  SparseTableInfo table;
  table.name = absl::StrCat(c.layer->name, "/table");
  table.layer = c.index;
  table.input = input;
  table.hash_ids = emb.hash_ids();
  table.vocab_size = emb.vocab_size();
  if (table.vocab_size == 0 && table.hash_ids) table.vocab_size = INT64_MAX;
  if (table.vocab_size <= 0) {
    return c.Error("embedding.vocab_size must be positive (or 0 with hash_ids), got ",
                   emb.vocab_size());
  }
  table.dim = emb.dim();
  if (!EmbeddingLayer::Combiner_IsValid(emb.combiner())) {
    return c.Error("embedding.combiner ", emb.combiner(), " is unknown");
  }
  table.mean = emb.combiner() == EmbeddingLayer::MEAN;
  if (!(emb.init_scale() >= 0.f && std::isfinite(emb.init_scale()))) {
    return c.Error("embedding.init_scale must be >= 0, got ", emb.init_scale());
  }
  table.init_scale =
      emb.init_scale() > 0.f ? emb.init_scale() : 1.f / std::sqrt(static_cast<float>(emb.dim()));
  if (emb.max_rows() < 0) {
    return c.Error("embedding.max_rows must not be negative, got ", emb.max_rows());
  }
  table.max_rows = emb.max_rows();
  if (!EmbeddingLayer::Eviction_IsValid(emb.eviction())) {
    return c.Error("embedding.eviction ", emb.eviction(), " is unknown");
  }
  table.eviction = emb.eviction();
  if (emb.embedding_staleness() < 0 || emb.embedding_staleness() > kMaxEmbeddingStaleness) {
    return c.Error("embedding.embedding_staleness must be in [0, ", kMaxEmbeddingStaleness,
                   "], got ", emb.embedding_staleness());
  }
  table.staleness = emb.embedding_staleness();
  table.has_optimizer = emb.has_optimizer();
  if (table.has_optimizer) {
    table.optimizer = emb.optimizer();
    RETURN_IF_ERROR(CheckSparseTableOptimizerKind(table, table.optimizer.kind()));
  }
  InputSlot slot;
  slot.name = c.layer->name;
  slot.shape = {table.dim};
  slot.width = table.dim;
  slot.sparse_table = static_cast<int>(model->sparse_tables.size());
  table.slot = static_cast<int>(model->input_slots.size());
  c.layer->sparse_table = slot.sparse_table;
  c.layer->inputs = {LayerShape::ModelInputSlot(table.slot)};
  model->input_slots.push_back(std::move(slot));
  model->sparse_tables.push_back(std::move(table));
  return absl::OkStatus();
}

// ------------------------------------------------ one function a layer kind

// A dense or conv2d layer's weight and bias initialisation.
struct WeightInit {
  ParamInit weight;
  ParamInit bias;
};

// `initializer`'s weight and bias; InvalidArgument naming `field` for a
// value no Initializer has (a number in the spec's text).
absl::StatusOr<WeightInit> InitOf(const LayerInference& c, const char* field,
                                  Initializer initializer) {
  switch (initializer) {
    case HE_UNIFORM:
      return WeightInit{ParamInit::kHeUniform, ParamInit::kZeros};
    case GLOROT_UNIFORM:
      return WeightInit{ParamInit::kGlorotUniform, ParamInit::kZeros};
    case PYTORCH_DEFAULT:
      return WeightInit{ParamInit::kFanInUniform, ParamInit::kFanInUniform};
    default:
      return c.Error(field, " = ", static_cast<int>(initializer),
                     " is none of HE_UNIFORM, GLOROT_UNIFORM, PYTORCH_DEFAULT");
  }
}

absl::Status InferDense(const LayerInference& c) {
  const int64_t units = c.spec.dense().units();
  if (units <= 0) return c.Error("dense.units must be positive, got ", units);
  const std::vector<int64_t>& in_shape = c.InputShape(0);
  if (in_shape.size() != 1) {
    return c.Error("dense needs a rank-1 input, got ", ShapeString(in_shape),
                   "; add a flatten layer before it");
  }
  const int64_t in = in_shape[0];
  if (CheckedProduct({in, units}) < 0) {
    return c.Error("dense.units = ", units, " makes a weight of [", in, ", ", units,
                   "], more than 2^31-1 elements");
  }
  c.layer->units = units;
  c.layer->output_shape = {units};
  ASSIGN_OR_RETURN(const WeightInit init,
                   InitOf(c, "dense.initializer", c.spec.dense().initializer()));
  c.AddParam("weight", {in, units}, init.weight, in, units);
  if (!c.spec.dense().no_bias()) c.AddParam("bias", {units}, init.bias, in, units);
  return absl::OkStatus();
}

absl::Status InferRelu(const LayerInference& c) {
  c.layer->output_shape = c.InputShape(0);
  return absl::OkStatus();
}

absl::Status InferFlatten(const LayerInference& c) {
  c.layer->output_shape = {CheckedProduct(c.InputShape(0))};
  return absl::OkStatus();
}

absl::Status InferDropout(const LayerInference& c) {
  const float rate = c.spec.dropout().rate();
  if (!(rate >= 0.f && rate < 1.f)) return c.Error("dropout.rate must be in [0, 1), got ", rate);
  c.layer->dropout_rate = rate;
  c.layer->output_shape = c.InputShape(0);
  return absl::OkStatus();
}

absl::Status InferConv2d(const LayerInference& c) {
  const Conv2dLayer& conv = c.spec.conv2d();
  if (conv.filters() <= 0) return c.Error("conv2d.filters must be positive, got ", conv.filters());
  RETURN_IF_ERROR(c.RequireImageInput());
  WindowShape& w = c.layer->window;
  RETURN_IF_ERROR(ResolveWindow(c.where, "conv2d", c.InputShape(0), conv.kernel_size(),
                                conv.stride(), conv.padding(), conv.explicit_padding(),
                                conv.filters(), /*pool=*/false, &w));
  c.layer->output_shape = {w.out_h, w.out_w, w.out_c};
  if (CheckedProduct(c.layer->output_shape) < 0 ||
      CheckedProduct({w.out_c, w.patch_elements()}) < 0) {
    return c.Error("conv2d output ", ShapeString(c.layer->output_shape),
                   " or weight has more than 2^31-1 elements");
  }
  const int64_t fan_out = w.kernel_h * w.kernel_w * w.out_c;
  ASSIGN_OR_RETURN(const WeightInit init, InitOf(c, "conv2d.initializer", conv.initializer()));
  c.AddParam("weight", {w.out_c, w.kernel_h, w.kernel_w, w.in_c}, init.weight, w.patch_elements(),
             fan_out);
  if (!conv.no_bias()) c.AddParam("bias", {w.out_c}, init.bias, w.patch_elements(), fan_out);
  return absl::OkStatus();
}

// max_pool and avg_pool.
absl::Status InferPool(const LayerInference& c) {
  const PoolLayer& pool =
      c.layer->kind == LayerKind::kMaxPool ? c.spec.max_pool() : c.spec.avg_pool();
  RETURN_IF_ERROR(c.RequireImageInput());
  const std::vector<int64_t>& in_shape = c.InputShape(0);
  WindowShape& w = c.layer->window;
  RETURN_IF_ERROR(ResolveWindow(c.where, c.kind(), in_shape, pool.window(), pool.stride(),
                                pool.padding(), pool.explicit_padding(), in_shape[2],
                                /*pool=*/true, &w));
  c.layer->output_shape = {w.out_h, w.out_w, w.out_c};
  return absl::OkStatus();
}

absl::Status InferGlobalAvgPool(const LayerInference& c) {
  RETURN_IF_ERROR(c.RequireImageInput());
  c.layer->output_shape = {c.InputShape(0)[2]};
  return absl::OkStatus();
}

absl::Status InferBatchNorm(const LayerInference& c) {
  const BatchNormLayer& bn = c.spec.batch_norm();
  LayerShape& layer = *c.layer;
  layer.bn_momentum = bn.momentum() == 0.f ? 0.99f : bn.momentum();
  layer.bn_epsilon = bn.epsilon() == 0.f ? 1e-3f : bn.epsilon();
  if (!(layer.bn_momentum > 0.f && layer.bn_momentum < 1.f)) {
    return c.Error("batch_norm.momentum must be in (0, 1), got ", bn.momentum());
  }
  if (!(layer.bn_epsilon >= 1e-5f && std::isfinite(layer.bn_epsilon))) {
    return c.Error("batch_norm.epsilon must be at least 1e-5, got ", bn.epsilon());
  }
  layer.output_shape = c.InputShape(0);
  const int64_t channels = layer.output_shape.back();
  c.AddParam("gamma", {channels}, ParamInit::kOnes, channels, channels);
  c.AddParam("beta", {channels}, ParamInit::kZeros, channels, channels);
  c.AddLocalState("running_mean", channels, ParamInit::kZeros);
  c.AddLocalState("running_var", channels, ParamInit::kOnes);
  return absl::OkStatus();
}

absl::Status InferAdd(const LayerInference& c) {
  RETURN_IF_ERROR(c.RequireSameInputShapes());
  c.layer->output_shape = c.InputShape(0);
  return absl::OkStatus();
}

absl::Status InferConcat(const LayerInference& c) {
  const std::vector<int64_t>& first = c.InputShape(0);
  int64_t width = 0;
  for (size_t k = 0; k < c.layer->inputs.size(); ++k) {
    const std::vector<int64_t>& shape = c.InputShape(k);
    if (shape.size() != first.size() ||
        !std::equal(shape.begin(), shape.end() - 1, first.begin())) {
      return c.Error("concat inputs must agree but in their last axis; \"", c.spec.inputs(0),
                     "\" is ", ShapeString(first), " but \"", c.spec.inputs(k), "\" is ",
                     ShapeString(shape));
    }
    width += shape.back();
  }
  c.layer->output_shape = first;
  c.layer->output_shape.back() = width;
  if (CheckedProduct(c.layer->output_shape) < 0) {
    return c.Error("concat output ", ShapeString(c.layer->output_shape),
                   " has more than 2^31-1 elements");
  }
  return absl::OkStatus();
}

absl::Status InferDotInteraction(const LayerInference& c) {
  if (c.InputShape(0).size() != 1) {
    return c.Error("dot_interaction takes rank-1 inputs, got ", ShapeString(c.InputShape(0)));
  }
  RETURN_IF_ERROR(c.RequireSameInputShapes());
  const int64_t k = static_cast<int64_t>(c.layer->inputs.size());
  c.layer->output_shape = {k * (k - 1) / 2};
  return absl::OkStatus();
}

// A dense embedding's table is a parameter; a sparse one's table and slot
// are InferSparseEmbedding's.
absl::Status InferEmbedding(const LayerInference& c) {
  const EmbeddingLayer& emb = c.spec.embedding();
  LayerShape& layer = *c.layer;
  if (emb.dim() <= 0) return c.Error("embedding.dim must be positive, got ", emb.dim());
  if (emb.sparse()) {
    layer.vocab_size = c.model->sparse_tables.back().vocab_size;
    layer.embedding_dim = emb.dim();
    layer.output_shape = {emb.dim()};
    return absl::OkStatus();
  }
  if (emb.hash_ids() || emb.max_rows() != 0 || emb.has_optimizer() || emb.init_scale() != 0.f ||
      emb.combiner() != EmbeddingLayer::SUM || emb.eviction() != EmbeddingLayer::LRU ||
      emb.embedding_staleness() != 0) {
    return c.Error(
        "embedding: hash_ids, combiner, optimizer, init_scale, max_rows, eviction and "
        "embedding_staleness are for sparse: true");
  }
  // Ids travel as floats to a dense table: exact below 2^24.
  constexpr int64_t kMaxDenseVocab = int64_t{1} << 24;
  if (emb.vocab_size() > kMaxDenseVocab) {
    return c.Error("embedding.vocab_size ", emb.vocab_size(),
                   " is more than a dense table takes (2^24, ids as floats); set sparse: true");
  }
  if (emb.vocab_size() <= 0) {
    return c.Error("embedding.vocab_size must be positive, got ", emb.vocab_size());
  }
  layer.vocab_size = emb.vocab_size();
  layer.embedding_dim = emb.dim();
  layer.output_shape = c.InputShape(0);
  layer.output_shape.push_back(emb.dim());
  if (CheckedProduct(layer.output_shape) < 0 ||
      CheckedProduct({layer.vocab_size, layer.embedding_dim}) < 0) {
    return c.Error("embedding output ", ShapeString(layer.output_shape),
                   " or table has more than 2^31-1 elements");
  }
  c.AddParam("table", {layer.vocab_size, layer.embedding_dim}, ParamInit::kGlorotUniform,
             layer.vocab_size, layer.embedding_dim);
  return absl::OkStatus();
}

absl::Status InferSoftmaxCrossEntropy(const LayerInference& c) {
  if (c.index != c.last) {
    return c.Error("softmax_cross_entropy must be the last layer (model.layer[", c.last,
                   "] follows it)");
  }
  const int32_t classes = c.model->num_classes;
  if (c.InputShape(0) != std::vector<int64_t>{classes}) {
    return c.Error("softmax_cross_entropy expects [num_classes=", classes, "] logits, got ",
                   ShapeString(c.InputShape(0)));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------ the table of kinds

// What a layer kind reads and how its shape is inferred. kStageOutput has no
// LayerSpec: pipeline stages make it (model/pipeline_stages.h).
struct LayerRule {
  LayerSpec::KindCase spec_kind;
  LayerKind kind;
  bool reads_several;  // add, concat, dot_interaction: 2 inputs or more; else exactly 1.
  absl::Status (*infer)(const LayerInference&);
};

constexpr LayerRule kLayerRules[] = {
    {LayerSpec::kDense, LayerKind::kDense, false, InferDense},
    {LayerSpec::kRelu, LayerKind::kRelu, false, InferRelu},
    {LayerSpec::kFlatten, LayerKind::kFlatten, false, InferFlatten},
    {LayerSpec::kDropout, LayerKind::kDropout, false, InferDropout},
    {LayerSpec::kSoftmaxCrossEntropy, LayerKind::kSoftmaxCrossEntropy, false,
     InferSoftmaxCrossEntropy},
    {LayerSpec::kConv2D, LayerKind::kConv2d, false, InferConv2d},
    {LayerSpec::kMaxPool, LayerKind::kMaxPool, false, InferPool},
    {LayerSpec::kAvgPool, LayerKind::kAvgPool, false, InferPool},
    {LayerSpec::kGlobalAvgPool, LayerKind::kGlobalAvgPool, false, InferGlobalAvgPool},
    {LayerSpec::kBatchNorm, LayerKind::kBatchNorm, false, InferBatchNorm},
    {LayerSpec::kAdd, LayerKind::kAdd, true, InferAdd},
    {LayerSpec::kEmbedding, LayerKind::kEmbedding, false, InferEmbedding},
    {LayerSpec::kConcat, LayerKind::kConcat, true, InferConcat},
    {LayerSpec::kDotInteraction, LayerKind::kDotInteraction, true, InferDotInteraction},
};

// The rule of a LayerSpec's kind; null when none is set.
const LayerRule* RuleOf(LayerSpec::KindCase spec_kind) {
  for (const LayerRule& rule : kLayerRules) {
    if (rule.spec_kind == spec_kind) return &rule;
  }
  return nullptr;
}

// The checks every layer passes (its name, its inputs and how many) before
// its kind's rule infers its shape; then the last must be the loss.
absl::StatusOr<LayerShape> InferLayer(const ModelSpec& spec, int i,
                                      const IndexOfName& input_of_name,
                                      const IndexOfName& index_of_name, ModelShape* model) {
  const LayerSpec& ls = spec.layer(i);
  const LayerRule* rule = RuleOf(ls.kind_case());
  if (rule == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model.layer[%d]%s: no layer type set", i,
                        ls.name().empty() ? "" : absl::StrCat(" (\"", ls.name(), "\")")));
  }
  LayerShape layer;
  layer.kind = rule->kind;
  const char* kind = LayerKindName(layer.kind);
  layer.name = ls.name().empty() ? absl::StrCat(kind, i) : ls.name();
  const LayerInference c{ls,
                         i,
                         spec.layer_size() - 1,
                         absl::StrFormat("model.layer[%d] (\"%s\")", i, layer.name),
                         &layer,
                         model};
  if (auto it = index_of_name.find(layer.name); it != index_of_name.end()) {
    return c.Error("duplicate layer name (model.layer[", it->second, "] has it too)");
  }
  if (input_of_name.count(layer.name) > 0) return c.Error("a model input has this name too");
  int sparse_input = -1;
  RETURN_IF_ERROR(ResolveLayerInputs(c, input_of_name, index_of_name, &sparse_input));
  if (rule->reads_several && layer.inputs.size() < 2) {
    return c.Error(kind, " takes at least 2 inputs (set inputs), got ", layer.inputs.size());
  }
  if (!rule->reads_several && layer.inputs.size() != 1) {
    return c.Error(kind, " takes exactly 1 input, got ", layer.inputs.size());
  }
  if (layer.kind == LayerKind::kEmbedding && ls.embedding().sparse()) {
    RETURN_IF_ERROR(InferSparseEmbedding(c, sparse_input));
  }
  RETURN_IF_ERROR(rule->infer(c));
  if (i == c.last && layer.kind != LayerKind::kSoftmaxCrossEntropy) {
    return c.Error("the last layer must be softmax_cross_entropy, got ", kind);
  }
  return layer;
}

// Largest PipelineSpec.micro_batches.
constexpr int32_t kMaxMicroBatches = 4096;

// Validates ModelSpec.pipeline against the model's layers into
// model->pipeline.
absl::Status InferPipeline(const ModelSpec& spec, const IndexOfName& index_of_name,
                           ModelShape* model) {
  if (!spec.has_pipeline()) return absl::OkStatus();
  const PipelineSpec& pipeline = spec.pipeline();
  if (pipeline.stage_size() == 0) {
    return absl::InvalidArgumentError("model.pipeline.stage is empty: give one stage or more");
  }
  if (pipeline.micro_batches() < 0 || pipeline.micro_batches() > kMaxMicroBatches) {
    return absl::InvalidArgumentError(absl::StrCat("model.pipeline.micro_batches must be in [0, ",
                                                   kMaxMicroBatches, "], got ",
                                                   pipeline.micro_batches()));
  }
  if (!PipelineSpec::Schedule_IsValid(pipeline.schedule())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.pipeline.schedule ", pipeline.schedule(), " is unknown"));
  }
  if (!model->sparse_tables.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.pipeline: sparse embeddings (layer \"",
        model->layers[model->sparse_tables[0].layer].name, "\") cannot be split into stages yet"));
  }
  const int n = static_cast<int>(model->layers.size());
  std::vector<int> stage_of(n, -1);
  for (int s = 0; s < pipeline.stage_size(); ++s) {
    const PipelineSpec::Stage& stage = pipeline.stage(s);
    if (stage.layers_size() == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("model.pipeline.stage[%d]: no layers", s));
    }
    for (int k = 0; k < stage.layers_size(); ++k) {
      const std::string& name = stage.layers(k);
      const std::string where =
          absl::StrFormat("model.pipeline.stage[%d].layers[%d] (\"%s\")", s, k, name);
      auto it = index_of_name.find(name);
      if (it == index_of_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": not a layer of the model"));
      }
      if (stage_of[it->second] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": already in stage[", stage_of[it->second], "]"));
      }
      stage_of[it->second] = s;
    }
  }
  for (int i = 0; i < n; ++i) {
    const LayerShape& layer = model->layers[i];
    if (stage_of[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.pipeline: layer \"", layer.name, "\" is in no stage"));
    }
    if (i > 0 && stage_of[i] < stage_of[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.pipeline: layer \"", layer.name, "\" (stage[", stage_of[i],
                       "]) follows \"", model->layers[i - 1].name, "\" (stage[", stage_of[i - 1],
                       "]); stages follow the layer order"));
    }
  }
  for (int i = 0; i < n; ++i) {
    const LayerShape& layer = model->layers[i];
    const std::string where =
        absl::StrFormat("model.pipeline.stage[%d]: layer \"%s\"", stage_of[i], layer.name);
    for (int input : layer.inputs) {
      if (input < 0) {
        if (stage_of[i] > 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, " reads the model input; only the first stage does"));
        }
        continue;
      }
      if (stage_of[input] == stage_of[i]) continue;
      if (layer.kind == LayerKind::kFlatten) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " flattens \"", model->layers[input].name,
                         "\" of an earlier stage; put the flatten in that stage"));
      }
      if (layer.kind == LayerKind::kEmbedding) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " reads ids from \"", model->layers[input].name,
                         "\" of an earlier stage; keep them in one stage"));
      }
    }
  }
  PipelineShape& shape = model->pipeline;
  for (int i = 0; i < n; ++i) {
    if (i == 0 || stage_of[i] != stage_of[i - 1]) shape.first_layer.push_back(i);
  }
  shape.micro_batches =
      pipeline.micro_batches() > 0 ? pipeline.micro_batches() : 4 * pipeline.stage_size();
  shape.schedule = pipeline.schedule();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelShape> InferModel(const ModelSpec& spec) {
  ModelShape model;
  IndexOfName input_of_name;
  RETURN_IF_ERROR(InferModelInput(spec, &model, &input_of_name));
  if (spec.num_classes() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model.num_classes must be positive, got %d", spec.num_classes()));
  }
  model.num_classes = spec.num_classes();
  if (spec.layer_size() == 0) {
    return absl::InvalidArgumentError(
        "model.layer is empty: a model needs at least a softmax_cross_entropy layer");
  }
  IndexOfName index_of_name;
  for (int i = 0; i < spec.layer_size(); ++i) {
    ASSIGN_OR_RETURN(LayerShape layer, InferLayer(spec, i, input_of_name, index_of_name, &model));
    index_of_name.emplace(layer.name, i);
    model.layers.push_back(std::move(layer));
  }
  RETURN_IF_ERROR(LayOutInputSlots(&model));
  RETURN_IF_ERROR(InferPipeline(spec, index_of_name, &model));
  return model;
}

std::string SparseTableOptimizerField(const SparseTableInfo& table) {
  return absl::StrCat("model.layer[", table.layer, "].embedding.optimizer");
}

absl::Status CheckSparseTableOptimizerKind(const SparseTableInfo& table, OptimizerSpec::Kind kind) {
  if (kind != OptimizerSpec::MOMENTUM) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("sparse table ", table.name, ": MOMENTUM is not offered for sparse tables; set ",
                   SparseTableOptimizerField(table), " to SGD, ADAGRAD or ADAM"));
}

int PipelineShape::StageOf(int layer) const {
  const auto after = std::upper_bound(first_layer.begin(), first_layer.end(), layer);
  return static_cast<int>(after - first_layer.begin()) - 1;
}

std::vector<int64_t> FlattenedImage(const ModelShape& shape, const LayerShape& dense) {
  // A negative input is a model input slot (LayerShape::ModelInputSlot).
  if (dense.kind != LayerKind::kDense || dense.inputs.size() != 1 || dense.inputs[0] < 0) {
    return {};
  }
  const LayerShape& flatten = shape.layers[dense.inputs[0]];
  if (flatten.kind != LayerKind::kFlatten || flatten.inputs.size() != 1) return {};
  const int read = flatten.inputs[0];
  const std::vector<int64_t>& in = read >= 0 ? shape.layers[read].output_shape
                                             : shape.input_slots[LayerShape::SlotOf(read)].shape;
  return in.size() == 3 ? in : std::vector<int64_t>{};
}

}  // namespace downpour
