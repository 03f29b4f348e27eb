#include "spec/onnx_export.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "onnx/onnx.pb.h"
#include "spec/model_shape.h"

namespace downpour {
namespace {

// A tensor of the graph. ONNX's tensors carry the batch first; `shape` is
// ours, per example. channels_first: the ONNX tensor is ours with its last
// axis moved to just after the batch (NCHW for an [H, W, C] image), which is
// what Conv, the pools and BatchNormalization read; else our axes in order.
// A tensor of rank 1 is the same either way.
struct Value {
  std::string name;
  std::vector<int64_t> shape;
  bool channels_first = false;

  int rank() const { return static_cast<int>(shape.size()); }
  bool IsChannelsFirst() const { return channels_first && rank() >= 2; }
  // The dimensions after the batch, in the ONNX tensor's order.
  std::vector<int64_t> OnnxDims() const {
    if (!IsChannelsFirst()) return shape;
    std::vector<int64_t> dims = {shape.back()};
    dims.insert(dims.end(), shape.begin(), shape.end() - 1);
    return dims;
  }
};

constexpr char kLogits[] = "logits";
constexpr char kProbabilities[] = "probabilities";

// How errors name a layer: layer "fc1" (dense).
std::string Named(const LayerShape& layer) {
  return absl::StrCat("layer \"", layer.name, "\" (", LayerKindName(layer.kind), ")");
}

// Whether `dense`'s weight takes a flattened image's inputs in NCHW order
// (FlattenedImage, the rule control/export.cc lays the weights out by).
bool TakesNchwOrder(const ModelShape& shape, const LayerShape& dense) {
  return !FlattenedImage(shape, dense).empty();
}

void SetFloatType(const std::vector<int64_t>& dims, onnx::ValueInfoProto* info) {
  onnx::TypeProto::Tensor* tensor = info->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto* shape = tensor->mutable_shape();
  shape->add_dim()->set_dim_param("batch");
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

void AddInts(const char* name, const std::vector<int64_t>& values, onnx::NodeProto* node) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void AddInt(const char* name, int64_t value, onnx::NodeProto* node) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void AddFloat(const char* name, float value, onnx::NodeProto* node) {
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

// Builds the graph layer by layer, in the spec's order (which is a
// topological order: a layer reads only earlier ones).
class GraphBuilder {
 public:
  GraphBuilder(const ModelShape& shape, const SafetensorsFile& weights, onnx::GraphProto* graph)
      : shape_(shape), weights_(weights), graph_(graph) {}

  absl::Status Build() {
    used_ = {kLogits, kProbabilities};
    for (const auto& [name, tensor] : weights_.tensors()) used_.insert(name);
    RETURN_IF_ERROR(AddGraphInputs());
    outputs_.resize(shape_.layers.size());
    for (int i = 0; i < static_cast<int>(shape_.layers.size()); ++i) {
      const LayerShape& layer = shape_.layers[i];
      if (layer.kind == LayerKind::kSoftmaxCrossEntropy) {
        ASSIGN_OR_RETURN(Value logits, Input(i, 0));
        return AddGraphOutputs(logits);
      }
      ASSIGN_OR_RETURN(outputs_[i], Emit(i));
    }
    // InferModel makes the loss the last layer.
    return absl::InvalidArgumentError("the model has no softmax_cross_entropy layer");
  }

 private:
  // `base`, or base_1, base_2, ... when a tensor of the graph has it.
  std::string Fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; used_.count(name) > 0; ++k) name = absl::StrCat(base, "_", k);
    used_.insert(name);
    return name;
  }

  onnx::NodeProto* AddNode(const char* op, const std::string& node_name,
                           const std::vector<std::string>& inputs, const std::string& output) {
    onnx::NodeProto* node = graph_->add_node();
    node->set_op_type(op);
    node->set_name(node_name);
    for (const std::string& in : inputs) node->add_input(in);
    node->add_output(output);
    return node;
  }

  // Tensor `<layer>.<suffix>` of the weights as an initializer: F32 of
  // `dims`, else InvalidArgument naming it.
  absl::StatusOr<std::string> Weight(const LayerShape& layer, const char* suffix,
                                     const std::vector<int64_t>& dims) {
    const std::string name = absl::StrCat(layer.name, ".", suffix);
    auto it = weights_.tensors().find(name);
    const std::string needs = absl::StrCat(Named(layer), " needs F32 ", ShapeString(dims));
    if (it == weights_.tensors().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the weights have no tensor \"", name, "\" (", needs, ")"));
    }
    const SafetensorsFile::Tensor& t = it->second;
    if (t.dtype != TensorDtype::kF32 || t.shape != dims) {
      return absl::InvalidArgumentError(absl::StrCat("the weights' tensor \"", name, "\" is ",
                                                     TensorDtypeName(t.dtype), " ",
                                                     ShapeString(t.shape), "; ", needs));
    }
    onnx::TensorProto* init = graph_->add_initializer();
    init->set_name(name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) init->add_dims(d);
    // Safetensors and ONNX's raw_data are both little endian.
    init->set_raw_data(t.data.data(), t.data.size());
    return name;
  }

  // An INT64 initializer of `values` (a shape, axes or indices), 1-D.
  std::string Int64Constant(const std::string& base, const std::vector<int64_t>& values) {
    onnx::TensorProto* init = graph_->add_initializer();
    init->set_name(Fresh(base));
    init->set_data_type(onnx::TensorProto::INT64);
    init->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) init->add_int64_data(v);
    return init->name();
  }

  // `v` transposed to channels-first (or back), once per tensor.
  Value Transposed(const Value& v, bool channels_first) {
    if (v.rank() <= 1 || v.IsChannelsFirst() == channels_first) return v;
    const std::string key = absl::StrCat(v.name, channels_first ? "|cf" : "|cl");
    auto it = transposed_.find(key);
    if (it != transposed_.end()) return it->second;
    const int r = v.rank();
    std::vector<int64_t> perm = {0};
    if (channels_first) {
      perm.push_back(r);
      for (int k = 1; k < r; ++k) perm.push_back(k);
    } else {
      for (int k = 2; k <= r; ++k) perm.push_back(k);
      perm.push_back(1);
    }
    Value out{Fresh(absl::StrCat(v.name, channels_first ? "/nchw" : "/nhwc")), v.shape,
              channels_first};
    AddInts("perm", perm, AddNode("Transpose", out.name, {v.name}, out.name));
    transposed_[key] = out;
    return out;
  }

  absl::Status AddGraphInputs() {
    for (const InputSlot& slot : shape_.input_slots) {
      if (slot.sparse_table >= 0) {
        slots_.push_back(Value{});  // Read by a sparse embedding, which is refused.
        continue;
      }
      if (used_.count(slot.name) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model input \"", slot.name,
            "\" has the name of an output or weight of the ONNX graph; rename the input"));
      }
      used_.insert(slot.name);
      // An image is NCHW, as the PyTorch module takes it.
      Value v{slot.name, slot.shape, slot.shape.size() == 3};
      onnx::ValueInfoProto* input = graph_->add_input();
      input->set_name(v.name);
      SetFloatType(v.OnnxDims(), input);
      slots_.push_back(std::move(v));
    }
    return absl::OkStatus();
  }

  // What layer `index` reads as its input `k`. A flatten is made here, for
  // its reader: NCHW order for a dense weight laid out for it, else ours.
  absl::StatusOr<Value> Input(int index, int k) {
    const LayerShape& layer = shape_.layers[index];
    const int from = layer.inputs[k];
    if (from < 0) {
      const Value& slot = slots_[LayerShape::SlotOf(from)];
      if (slot.name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Named(layer), " reads a sparse input, which has no ONNX form here"));
      }
      return slot;
    }
    if (shape_.layers[from].kind != LayerKind::kFlatten) return outputs_[from];
    const bool nchw = TakesNchwOrder(shape_, layer);
    const std::pair<int, bool> key = {from, nchw};
    auto it = flattened_.find(key);
    if (it != flattened_.end()) return it->second;
    ASSIGN_OR_RETURN(Value in, Input(from, 0));
    if (in.rank() <= 1) return in;
    in = Transposed(in, nchw && in.rank() == 3);
    const std::string& name = shape_.layers[from].name;
    Value out{Fresh(name), shape_.layers[from].output_shape, false};
    AddInt("axis", 1, AddNode("Flatten", out.name, {in.name}, out.name));
    flattened_[key] = out;
    return out;
  }

  // The layout several inputs are brought to: channels-first when one is.
  absl::StatusOr<std::vector<Value>> SameLayoutInputs(int index) {
    std::vector<Value> in;
    bool channels_first = false;
    for (size_t k = 0; k < shape_.layers[index].inputs.size(); ++k) {
      ASSIGN_OR_RETURN(Value v, Input(index, static_cast<int>(k)));
      channels_first = channels_first || v.IsChannelsFirst();
      in.push_back(std::move(v));
    }
    for (Value& v : in) v = Transposed(v, channels_first);
    return in;
  }

  absl::StatusOr<Value> Emit(int index) {
    const LayerShape& layer = shape_.layers[index];
    switch (layer.kind) {
      case LayerKind::kDense:
        return EmitDense(index);
      case LayerKind::kRelu: {
        ASSIGN_OR_RETURN(Value in, Input(index, 0));
        Value out{Fresh(layer.name), in.shape, in.channels_first};
        AddNode("Relu", layer.name, {in.name}, out.name);
        return out;
      }
      case LayerKind::kFlatten:
        return Value{};  // Made for each reader (Input).
      case LayerKind::kDropout:
        return Input(index, 0);  // The identity at inference.
      case LayerKind::kConv2d:
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
        return EmitWindow(index);
      case LayerKind::kGlobalAvgPool: {
        ASSIGN_OR_RETURN(Value in, Input(index, 0));
        in = Transposed(in, true);
        const std::string pooled = Fresh(absl::StrCat(layer.name, "/pooled"));
        AddNode("GlobalAveragePool", layer.name, {in.name}, pooled);
        Value out{Fresh(layer.name), layer.output_shape, false};
        AddInt("axis", 1,
               AddNode("Flatten", absl::StrCat(layer.name, "/flatten"), {pooled}, out.name));
        return out;
      }
      case LayerKind::kBatchNorm:
        return EmitBatchNorm(index);
      case LayerKind::kAdd: {
        ASSIGN_OR_RETURN(std::vector<Value> in, SameLayoutInputs(index));
        // (x0 + x1) + x2 ...: the order the layer sums in.
        Value sum = in[0];
        for (size_t k = 1; k < in.size(); ++k) {
          const bool last = k + 1 == in.size();
          Value next{Fresh(last ? layer.name : absl::StrCat(layer.name, "/partial")),
                     layer.output_shape, in[0].channels_first};
          AddNode("Add", last ? layer.name : absl::StrCat(layer.name, "/", k),
                  {sum.name, in[k].name}, next.name);
          sum = std::move(next);
        }
        return sum;
      }
      case LayerKind::kConcat: {
        ASSIGN_OR_RETURN(std::vector<Value> in, SameLayoutInputs(index));
        std::vector<std::string> names;
        for (const Value& v : in) names.push_back(v.name);
        Value out{Fresh(layer.name), layer.output_shape, in[0].channels_first};
        // Our last axis: 1 in a channels-first tensor, else after the batch's.
        AddInt("axis", out.IsChannelsFirst() ? 1 : out.rank(),
               AddNode("Concat", layer.name, names, out.name));
        return out;
      }
      case LayerKind::kEmbedding:
        return EmitEmbedding(index);
      case LayerKind::kDotInteraction:
        return EmitDotInteraction(index);
      case LayerKind::kSoftmaxCrossEntropy:
      case LayerKind::kStageOutput:
        break;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(Named(layer), " has no ONNX form in this exporter"));
  }

  absl::StatusOr<Value> EmitDense(int index) {
    const LayerShape& layer = shape_.layers[index];
    ASSIGN_OR_RETURN(Value in, Input(index, 0));
    ASSIGN_OR_RETURN(std::string weight, Weight(layer, "weight", {layer.units, in.shape[0]}));
    std::vector<std::string> inputs = {in.name, weight};
    if (layer.param_ids.size() > 1) {
      ASSIGN_OR_RETURN(std::string bias, Weight(layer, "bias", {layer.units}));
      inputs.push_back(bias);
    }
    Value out{Fresh(layer.name), layer.output_shape, false};
    AddInt("transB", 1, AddNode("Gemm", layer.name, inputs, out.name));
    return out;
  }

  // conv2d, max_pool, avg_pool: a window over an NCHW image.
  absl::StatusOr<Value> EmitWindow(int index) {
    const LayerShape& layer = shape_.layers[index];
    const WindowShape& w = layer.window;
    ASSIGN_OR_RETURN(Value in, Input(index, 0));
    in = Transposed(in, true);
    std::vector<std::string> inputs = {in.name};
    const char* op = "Conv";
    if (layer.kind == LayerKind::kConv2d) {
      ASSIGN_OR_RETURN(std::string weight,
                       Weight(layer, "weight", {w.out_c, w.in_c, w.kernel_h, w.kernel_w}));
      inputs.push_back(weight);
      if (layer.param_ids.size() > 1) {
        ASSIGN_OR_RETURN(std::string bias, Weight(layer, "bias", {w.out_c}));
        inputs.push_back(bias);
      }
    } else {
      op = layer.kind == LayerKind::kMaxPool ? "MaxPool" : "AveragePool";
    }
    Value out{Fresh(layer.name), layer.output_shape, true};
    onnx::NodeProto* node = AddNode(op, layer.name, inputs, out.name);
    AddInts("kernel_shape", {w.kernel_h, w.kernel_w}, node);
    AddInts("strides", {w.stride_h, w.stride_w}, node);
    // [top, left, bottom, right]. The window's bottom/right padding is what
    // its output size implies; negative where VALID leaves rows unread,
    // which ONNX's floor of the output size leaves unread as well.
    AddInts("pads",
            {w.pad_top, w.pad_left, std::max<int64_t>(w.pad_bottom(), 0),
             std::max<int64_t>(w.pad_right(), 0)},
            node);
    if (layer.kind == LayerKind::kConv2d) AddInt("group", 1, node);
    if (layer.kind == LayerKind::kAvgPool) AddInt("count_include_pad", 0, node);
    return out;
  }

  // Over our last axis: ONNX's channel axis 1 of a channels-first tensor.
  absl::StatusOr<Value> EmitBatchNorm(int index) {
    const LayerShape& layer = shape_.layers[index];
    ASSIGN_OR_RETURN(Value in, Input(index, 0));
    in = Transposed(in, true);
    const std::vector<int64_t> channels = {layer.output_shape.back()};
    std::vector<std::string> inputs = {in.name};
    for (const char* suffix : {"weight", "bias", "running_mean", "running_var"}) {
      ASSIGN_OR_RETURN(std::string name, Weight(layer, suffix, channels));
      inputs.push_back(name);
    }
    Value out{Fresh(layer.name), layer.output_shape, in.channels_first};
    AddFloat("epsilon", layer.bn_epsilon,
             AddNode("BatchNormalization", layer.name, inputs, out.name));
    return out;
  }

  // A dense table: each id (a float) picks a row.
  absl::StatusOr<Value> EmitEmbedding(int index) {
    const LayerShape& layer = shape_.layers[index];
    if (layer.sparse_table >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Named(layer),
                       ": sparse tables have no ONNX form in this exporter; export "
                       "--format=safetensors"));
    }
    if (layer.inputs[0] >= 0) {
      // The job reads an id that is not in the table as zeros, ONNX's Gather
      // refuses it: only ids from the model's input, which the job checks
      // too, mean the same in both.
      return absl::InvalidArgumentError(absl::StrCat(
          Named(layer), ": ids computed by layer \"", shape_.layers[layer.inputs[0]].name,
          "\" have no ONNX form in this exporter; read them from a model input"));
    }
    ASSIGN_OR_RETURN(Value in, Input(index, 0));
    in = Transposed(in, false);
    ASSIGN_OR_RETURN(std::string table,
                     Weight(layer, "weight", {layer.vocab_size, layer.embedding_dim}));
    const std::string ids = Fresh(absl::StrCat(layer.name, "/ids"));
    AddInt("to", onnx::TensorProto::INT64,
           AddNode("Cast", absl::StrCat(layer.name, "/cast"), {in.name}, ids));
    Value out{Fresh(layer.name), layer.output_shape, false};
    AddInt("axis", 0, AddNode("Gather", layer.name, {table, ids}, out.name));
    return out;
  }

  // Every pair's dot product <x_i, x_j>, i < j, in the order (0,1), (0,2),
  // ..., (1,2), ... (kernels' PairwiseDotForward): the upper triangle of
  // X X^T, X the inputs stacked [batch, k, dim].
  absl::StatusOr<Value> EmitDotInteraction(int index) {
    const LayerShape& layer = shape_.layers[index];
    const int64_t k = static_cast<int64_t>(layer.inputs.size());
    const std::string axes = Int64Constant(absl::StrCat(layer.name, "/axes"), {1});
    std::vector<std::string> rows;
    for (int64_t i = 0; i < k; ++i) {
      ASSIGN_OR_RETURN(Value in, Input(index, static_cast<int>(i)));
      rows.push_back(Fresh(absl::StrCat(layer.name, "/row")));
      AddNode("Unsqueeze", absl::StrCat(layer.name, "/unsqueeze", i), {in.name, axes}, rows.back());
    }
    const std::string stacked = Fresh(absl::StrCat(layer.name, "/stacked"));
    AddInt("axis", 1, AddNode("Concat", absl::StrCat(layer.name, "/stack"), rows, stacked));
    const std::string columns = Fresh(absl::StrCat(layer.name, "/transposed"));
    AddInts("perm", {0, 2, 1},
            AddNode("Transpose", absl::StrCat(layer.name, "/transpose"), {stacked}, columns));
    const std::string products = Fresh(absl::StrCat(layer.name, "/products"));
    AddNode("MatMul", absl::StrCat(layer.name, "/matmul"), {stacked, columns}, products);
    // 0: keep the batch.
    const std::string flat_shape = Int64Constant(absl::StrCat(layer.name, "/shape"), {0, k * k});
    const std::string flat = Fresh(absl::StrCat(layer.name, "/flat"));
    AddNode("Reshape", absl::StrCat(layer.name, "/reshape"), {products, flat_shape}, flat);
    std::vector<int64_t> pairs;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = i + 1; j < k; ++j) pairs.push_back(i * k + j);
    }
    const std::string pair_index = Int64Constant(absl::StrCat(layer.name, "/pairs"), pairs);
    Value out{Fresh(layer.name), layer.output_shape, false};
    AddInt("axis", 1, AddNode("Gather", layer.name, {flat, pair_index}, out.name));
    return out;
  }

  // "logits" (the loss layer's input, renamed where a node makes it, else
  // an Identity of a graph input) and "probabilities".
  absl::Status AddGraphOutputs(const Value& logits) {
    bool made_by_node = false;
    for (const onnx::NodeProto& node : graph_->node()) {
      for (const std::string& out : node.output())
        made_by_node = made_by_node || out == logits.name;
    }
    if (made_by_node) {
      for (onnx::NodeProto& node : *graph_->mutable_node()) {
        for (std::string& in : *node.mutable_input()) {
          if (in == logits.name) in = kLogits;
        }
        for (std::string& out : *node.mutable_output()) {
          if (out == logits.name) out = kLogits;
        }
      }
    } else {
      AddNode("Identity", kLogits, {logits.name}, kLogits);
    }
    AddInt("axis", 1, AddNode("Softmax", kProbabilities, {kLogits}, kProbabilities));
    for (const char* name : {kLogits, kProbabilities}) {
      onnx::ValueInfoProto* out = graph_->add_output();
      out->set_name(name);
      SetFloatType({shape_.num_classes}, out);
    }
    return absl::OkStatus();
  }

  const ModelShape& shape_;
  const SafetensorsFile& weights_;
  onnx::GraphProto* const graph_;
  std::set<std::string> used_;  // Every tensor name of the graph.
  std::vector<Value> slots_;    // Per input slot; no name: a sparse one.
  std::vector<Value> outputs_;  // Per layer; none for a flatten.
  std::map<std::string, Value> transposed_;
  std::map<std::pair<int, bool>, Value> flattened_;  // (flatten, NCHW order).
};

}  // namespace

absl::StatusOr<std::string> ExportOnnx(const ModelSpec& model, const SafetensorsFile& weights) {
  const auto& meta = weights.metadata();
  auto layout = meta.find("downpour.layout");
  if (layout != meta.end() && layout->second != "pytorch") {
    return absl::InvalidArgumentError(
        absl::StrCat("the weights are in the ", layout->second,
                     " layout; ONNX export reads the pytorch layout"));
  }
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(model));
  onnx::ModelProto proto;
  proto.set_ir_version(kOnnxIrVersion);
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  proto.set_producer_name("downpour");
  proto.set_doc_string(
      "Inference graph of a Downpour job: logits are the input of its softmax_cross_entropy "
      "loss, which has no node.");
  for (const auto& [key, value] : meta) {
    if (!absl::StartsWith(key, "downpour.")) continue;
    onnx::StringStringEntryProto* entry = proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }
  onnx::GraphProto* graph = proto.mutable_graph();
  auto job = meta.find("downpour.job");
  graph->set_name(job != meta.end() ? job->second : "downpour");
  RETURN_IF_ERROR(GraphBuilder(shape, weights, graph).Build());
  const size_t bytes = proto.ByteSizeLong();
  if (bytes > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ONNX model would be ", bytes,
        " bytes, more than protobuf's 2 GiB limit (external data is not written); export "
        "--format=safetensors"));
  }
  std::string out;
  if (!proto.SerializeToString(&out)) {
    return absl::InternalError("the ONNX model could not be serialized");
  }
  return out;
}

}  // namespace downpour
