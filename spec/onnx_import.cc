#include "spec/onnx_import.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "onnx/onnx.pb.h"
#include "spec/limits.h"
#include "spec/model_shape.h"
#include "spec/onnx_importer.h"
#include "spec/onnx_tensor.h"

namespace downpour {
namespace onnx_import_internal {

absl::StatusOr<ImportedModel> Importer::Run() {
  if (graph_.sparse_initializer_size() > 0) {
    return FileError("sparse initializers are not read");
  }
  if (graph_.node_size() > 4 * kMaxLayers) {
    return FileError("the graph has ", graph_.node_size(), " nodes; at most ", 4 * kMaxLayers,
                     " are taken");
  }
  RETURN_IF_ERROR(ReadInitializers());
  RETURN_IF_ERROR(ReadInputs());
  for (const NodeProto& node : graph_.node()) {
    for (const std::string& input : node.input()) ++uses_[input];
  }
  for (const onnx::ValueInfoProto& output : graph_.output()) ++uses_[output.name()];
  for (const NodeProto& node : graph_.node()) RETURN_IF_ERROR(Take(node));
  RETURN_IF_ERROR(Finish());
  RETURN_IF_ERROR(CheckDeclaredShapes());

  ImportedModel imported;
  imported.model = std::move(model_);
  std::vector<TensorToWrite> tensors;
  for (const Weight& w : weights_) {
    tensors.push_back({w.name, TensorDtype::kF32, w.dims, w.values.data()});
  }
  ASSIGN_OR_RETURN(imported.weights,
                   SerializeSafetensors(
                       tensors, {{"downpour.layout", "pytorch"}, {"downpour.onnx_file", file_}}));
  imported.notes = std::move(notes_);
  return imported;
}

absl::Status Importer::ReadInitializers() {
  for (const TensorProto& t : graph_.initializer()) {
    absl::StatusOr<Const> c = ReadOnnxTensor(t);
    if (!c.ok()) return FileError("initializer \"", t.name(), "\": ", c.status().message());
    if (!consts_.emplace(t.name(), *std::move(c)).second) {
      return FileError("initializer \"", t.name(), "\" is given twice");
    }
  }
  return absl::OkStatus();
}

absl::Status Importer::ReadInputs() {
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const onnx::ValueInfoProto& input : graph_.input()) {
    // Older exporters list the initializers among the inputs.
    if (consts_.count(input.name()) == 0) inputs.push_back(&input);
  }
  if (inputs.empty()) return FileError("the graph has no input");
  bool any_ids = false;
  for (const onnx::ValueInfoProto* input : inputs) {
    if (input->type().has_tensor_type() &&
        !IsOnnxFloatType(input->type().tensor_type().elem_type())) {
      any_ids = true;
    }
  }
  named_inputs_ = inputs.size() > 1 || any_ids;
  for (const onnx::ValueInfoProto* input : inputs) {
    const std::string where = absl::StrCat("input \"", input->name(), "\"");
    if (!input->type().has_tensor_type() || !input->type().tensor_type().has_shape()) {
      return FileError(where, " is not a tensor of known rank");
    }
    const onnx::TypeProto::Tensor& type = input->type().tensor_type();
    const int rank = type.shape().dim_size();
    Value value;
    value.ids = !IsOnnxFloatType(type.elem_type());
    if (value.ids && type.elem_type() != TensorProto::INT64 &&
        type.elem_type() != TensorProto::INT32) {
      return FileError(where, " has element type ",
                       onnx::TensorProto_DataType_Name(type.elem_type()),
                       "; inputs are floating point, or int64 (int32) ids for a Gather");
    }
    for (int d = 1; d < rank; ++d) {
      const onnx::TensorShapeProto::Dimension& dim = type.shape().dim(d);
      if (!dim.has_dim_value() || dim.dim_value() <= 0) {
        return FileError(where, " has no fixed size in dimension ", d,
                         " (only the batch, dimension 0, may vary)");
      }
      value.dims.push_back(dim.dim_value());
    }
    if (CheckedProduct(value.dims) < 0) {
      return FileError(where, " has more than 2^31-1 elements an example");
    }
    if (value.ids ? rank != 2 : rank != 2 && rank != 4) {
      return FileError(where, " has rank ", rank,
                       value.ids ? "; ids are [batch, n]"
                                 : "; inputs are [batch, C, H, W] or "
                                   "[batch, features]");
    }
    value.ours = value.dims;
    if (value.image()) value.ours = {value.dims[1], value.dims[2], value.dims[0]};
    if (named_inputs_) {
      if (!SimpleName(input->name())) {
        return FileError(where, ": a model with several inputs names them after the graph's; ",
                         "use names of letters, digits, '_' and '.'");
      }
      InputSpec* spec = model_.add_inputs();
      spec->set_name(input->name());
      spec->set_kind(InputSpec::DENSE);
      for (int64_t d : value.ours) spec->add_shape(d);
      names_.insert(input->name());
      value.layer = input->name();
    } else {
      for (int64_t d : value.ours) model_.add_input_shape(d);
    }
    values_[input->name()] = std::move(value);
  }
  return absl::OkStatus();
}

absl::Status Importer::CheckAttributes(const NodeProto& node, std::set<std::string> known) const {
  for (const AttributeProto& a : node.attribute()) {
    if (known.count(a.name()) == 0) {
      return Error(node, "attribute ", a.name(), " is not understood");
    }
  }
  return absl::OkStatus();
}

const AttributeProto* Importer::Attribute(const NodeProto& node, const std::string& name) const {
  for (const AttributeProto& a : node.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

absl::StatusOr<int64_t> Importer::IntAttr(const NodeProto& node, const std::string& name,
                                          int64_t fallback) const {
  const AttributeProto* a = Attribute(node, name);
  if (a == nullptr) return fallback;
  if (a->type() != AttributeProto::INT) return Error(node, "attribute ", name, " is not an int");
  return a->i();
}

absl::StatusOr<float> Importer::FloatAttr(const NodeProto& node, const std::string& name,
                                          float fallback) const {
  const AttributeProto* a = Attribute(node, name);
  if (a == nullptr) return fallback;
  if (a->type() != AttributeProto::FLOAT) return Error(node, "attribute ", name, " is not a float");
  return a->f();
}

absl::StatusOr<std::vector<int64_t>> Importer::IntsAttr(const NodeProto& node,
                                                        const std::string& name,
                                                        std::vector<int64_t> fallback) const {
  const AttributeProto* a = Attribute(node, name);
  if (a == nullptr) return fallback;
  if (a->type() != AttributeProto::INTS) {
    return Error(node, "attribute ", name, " is not a list of ints");
  }
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

absl::StatusOr<const Value*> Importer::ValueInput(const NodeProto& node, int k,
                                                  bool flattened_image_ok) const {
  if (k >= node.input_size() || node.input(k).empty()) {
    return Error(node, "input ", k, " is missing");
  }
  auto it = values_.find(node.input(k));
  if (it == values_.end()) {
    if (consts_.count(node.input(k)) > 0) {
      return Error(node, "input \"", node.input(k),
                   "\" is a constant where Downpour takes a computed tensor");
    }
    return Error(node, "input \"", node.input(k), "\" is not produced by an earlier node");
  }
  const Value& v = it->second;
  if (v.softmax) {
    return Error(node, "reads the output of a Softmax; only a final Softmax (the loss) is taken");
  }
  if (v.ids && node.op_type() != "Gather") {
    return Error(node, "reads the integer ids \"", node.input(k), "\"; only a Gather reads ids");
  }
  const std::string& op = node.op_type();
  if (v.dims.size() != v.ours.size() && op != "Flatten" && op != "Reshape" && op != "Identity" &&
      op != "Shape") {
    return Error(node, "reads \"", node.input(k), "\", a global average pool's ",
                 ShapeString(v.dims), ", which Downpour keeps as the vector [", v.ours[0],
                 "]: only a Flatten (or a Reshape to [batch, ", v.ours[0], "]) may read it");
  }
  if (v.flattened_image && !flattened_image_ok) {
    return Error(node, "reads the flattened image \"", node.input(k),
                 "\"; Downpour flattens images in HWC order, so only a Gemm or MatMul (whose "
                 "weight is reordered) may read a flattened image");
  }
  return &v;
}

absl::StatusOr<const Const*> Importer::ConstInput(const NodeProto& node, int k) const {
  if (k >= node.input_size() || node.input(k).empty()) {
    return Error(node, "input ", k, " is missing");
  }
  auto it = consts_.find(node.input(k));
  if (it == consts_.end()) {
    return Error(node, "input \"", node.input(k),
                 "\" must be a constant (an initializer), it is computed");
  }
  return &it->second;
}

absl::Status Importer::SetOutput(const NodeProto& node, Value value, bool extra_outputs_ok) {
  if (node.output_size() < 1 || node.output(0).empty()) return Error(node, "has no output");
  for (int k = 1; k < node.output_size() && !extra_outputs_ok; ++k) {
    if (!node.output(k).empty()) {
      return Error(node, "its output ", k, " (\"", node.output(k),
                   "\") is not produced by Downpour; only the first output is taken");
    }
  }
  if (values_.count(node.output(0)) > 0 || consts_.count(node.output(0)) > 0) {
    return Error(node, "output \"", node.output(0), "\" is produced twice");
  }
  if (CheckedProduct(value.dims) < 0) {
    return Error(node, "its output ", ShapeString(value.dims),
                 " has more than 2^31-1 elements an example");
  }
  values_[node.output(0)] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<LayerSpec*> Importer::AddLayer(const NodeProto& node,
                                              const std::vector<const Value*>& inputs,
                                              const Const* weight, std::vector<int64_t> ours) {
  if (model_.layer_size() >= kMaxLayers - 1) {
    return Error(node, "the model would have more than ", kMaxLayers, " layers");
  }
  if (weight != nullptr && !weight->name.empty() && !tied_.insert(weight->name).second) {
    notes_.push_back(absl::StrCat("node \"", node.name(), "\" (", node.op_type(),
                                  ") reads weight \"", weight->name,
                                  "\" as an earlier layer does: Downpour trains a copy each"));
  }
  std::string base;
  if (weight != nullptr && absl::EndsWith(weight->name, ".weight") && weight->name.size() > 7 &&
      weight->name.size() <= kMaxNameBytes) {
    base = weight->name.substr(0, weight->name.size() - 7);
  } else if (SimpleName(node.output(0))) {
    base = node.output(0);
  } else {
    base = absl::StrCat(absl::AsciiStrToLower(node.op_type()), ++op_count_[node.op_type()]);
  }
  std::string name = base;
  for (int k = 2; names_.count(name) > 0; ++k) name = absl::StrCat(base, "_", k);
  names_.insert(name);
  LayerSpec* layer = model_.add_layer();
  layer->set_name(name);
  for (const Value* input : inputs) {
    if (input->layer.empty()) {
      // The unnamed model input: only the first layer reads it.
      if (model_.layer_size() != 1) {
        return Error(node,
                     "reads the graph's input after another node has; a model with one "
                     "input is read by its first layer only");
      }
      continue;
    }
    layer->add_inputs(input->layer);
  }
  expected_[name] = std::move(ours);
  return layer;
}

void Importer::AddWeight(const LayerSpec& layer, const std::string& what, std::vector<int64_t> dims,
                         std::vector<float> values) {
  weights_.push_back({absl::StrCat(layer.name(), ".", what), std::move(dims), std::move(values)});
}

absl::Status Importer::Take(const NodeProto& node) {
  if (!node.domain().empty() && node.domain() != "ai.onnx") {
    return Error(node, "ops of domain \"", node.domain(), "\" are not supported");
  }
  const std::string& op = node.op_type();
  if (node.output_size() < 1 || node.output(0).empty()) return Error(node, "has no output");
  // Nodes over constants only are folded (shape arithmetic).
  bool all_const = node.input_size() > 0;
  for (int k = 0; k < node.input_size(); ++k) {
    if (!node.input(k).empty() && consts_.count(node.input(k)) == 0) all_const = false;
  }
  if (op == "Constant" || op == "Shape" || all_const) return Fold(node);
  if (op == "Conv") return TakeConv(node);
  if (op == "MaxPool" || op == "AveragePool") return TakePool(node);
  if (op == "Gemm") return TakeGemm(node);
  if (op == "MatMul") return TakeMatMul(node);
  if (op == "Add") return TakeAdd(node);
  if (op == "BatchNormalization") return TakeBatchNorm(node);
  if (op == "Concat") return TakeConcat(node);
  if (op == "Gather") return TakeGather(node);
  if (op == "Relu") {
    RETURN_IF_ERROR(CheckAttributes(node, {}));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, nullptr, x->ours));
    layer->mutable_relu();
    return SetOutput(node, {layer->name(), x->dims, x->ours});
  }
  if (op == "Identity") {
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0, /*flattened_image_ok=*/true));
    notes_.push_back(absl::StrCat("node \"", node.name(), "\" (Identity): passed through"));
    return SetOutput(node, *x);
  }
  if (op == "Dropout") {
    RETURN_IF_ERROR(CheckAttributes(node, {"ratio", "seed"}));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    ASSIGN_OR_RETURN(float rate, FloatAttr(node, "ratio", 0.5f));
    if (node.input_size() > 1 && !node.input(1).empty()) {
      ASSIGN_OR_RETURN(const Const* ratio, ConstInput(node, 1));
      if (ratio->integer || ratio->f.size() != 1) return Error(node, "ratio is not one float");
      rate = ratio->f[0];
    }
    if (!(rate >= 0.f && rate < 1.f)) return Error(node, "ratio ", rate, " is not in [0, 1)");
    ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, nullptr, x->ours));
    layer->mutable_dropout()->set_rate(rate);
    // The mask (output 1) is for training graphs: nothing may read it.
    return SetOutput(node, {layer->name(), x->dims, x->ours}, /*extra_outputs_ok=*/true);
  }
  if (op == "GlobalAveragePool") {
    RETURN_IF_ERROR(CheckAttributes(node, {}));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    return TakeGlobalPool(node, *x, /*keepdims=*/true);
  }
  if (op == "ReduceMean") {
    // The mean over height and width (dynamo's AdaptiveAvgPool2d(1)).
    RETURN_IF_ERROR(CheckAttributes(node, {"axes", "keepdims", "noop_with_empty_axes"}));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, IntsAttr(node, "axes", {}));
    if (node.input_size() > 1 && !node.input(1).empty()) {
      ASSIGN_OR_RETURN(const Const* a, ConstInput(node, 1));
      axes = a->i;
    }
    ASSIGN_OR_RETURN(int64_t keepdims, IntAttr(node, "keepdims", 1));
    std::sort(axes.begin(), axes.end());
    if (!x->image() ||
        (axes != std::vector<int64_t>{2, 3} && axes != std::vector<int64_t>{-2, -1})) {
      return Error(node,
                   "only a mean over the height and width of an image (axes [2, 3]) is "
                   "taken, as a global average pool; this one is over axes ",
                   ShapeString(axes), " of ", ShapeString(x->dims));
    }
    return TakeGlobalPool(node, *x, keepdims != 0);
  }
  if (op == "Flatten") {
    RETURN_IF_ERROR(CheckAttributes(node, {"axis"}));
    ASSIGN_OR_RETURN(int64_t axis, IntAttr(node, "axis", 1));
    if (axis != 1) return Error(node, "axis ", axis, " is not 1 (flatten all but the batch)");
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    return TakeFlatten(node, *x);
  }
  if (op == "Reshape") {
    RETURN_IF_ERROR(CheckAttributes(node, {"allowzero"}));
    ASSIGN_OR_RETURN(int64_t allowzero, IntAttr(node, "allowzero", 0));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    ASSIGN_OR_RETURN(const Const* shape, ConstInput(node, 1));
    const int64_t n = CheckedProduct(x->dims);
    const std::vector<int64_t>& t = shape->i;
    // allowzero makes a 0 mean zero elements (not "the input's"); with no 0
    // in the shape it changes nothing.
    const bool zero = std::count(t.begin(), t.end(), 0) > 0;
    const bool flatten = shape->integer && t.size() == 2 && (allowzero == 0 || !zero) &&
                         ((t[0] >= 0 && (t[1] == -1 || t[1] == n)) || (t[0] == -1 && t[1] == n));
    if (!flatten) {
      return Error(node, "a Reshape to ", ShapeString(t), " of ", ShapeString(x->dims),
                   " is not a flatten to [batch, ", n, "], the only Reshape taken");
    }
    return TakeFlatten(node, *x);
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    RETURN_IF_ERROR(CheckAttributes(node, {"axis"}));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    ASSIGN_OR_RETURN(int64_t axis, IntAttr(node, "axis", opset_ >= 13 ? -1 : 1));
    if (x->dims.size() != 1 || (axis != 1 && axis != -1)) {
      return Error(node,
                   "only a softmax over the classes of [batch, classes] logits is the "
                   "loss; this one is over axis ",
                   axis, " of ", ShapeString(x->dims));
    }
    Value out = *x;
    out.softmax = true;
    return SetOutput(node, std::move(out));
  }
  return Error(node, "op ", op, " is not supported (the supported ops: docs/job-specs.md, ",
               "\"Models from ONNX\")");
}

absl::Status Importer::Fold(const NodeProto& node) {
  const std::string& op = node.op_type();
  Const out;
  if (op == "Constant") {
    absl::StatusOr<Const> c = ReadOnnxConstant(node);
    if (!c.ok()) return Error(node, c.status().message());
    out = *std::move(c);
  } else if (op == "Identity") {
    // Exporters copy an initializer read twice (a shared weight) this way.
    ASSIGN_OR_RETURN(const Const* c, ConstInput(node, 0));
    // Each copy costs memory: at most the file's own size in all.
    copied_bytes_ += c->f.size() * sizeof(float) + c->i.size() * sizeof(int64_t);
    if (copied_bytes_ > kMaxOnnxBytes) {
      return Error(node, "Identity nodes copy more than ", kMaxOnnxBytes, " bytes of weights");
    }
    out = *c;
  } else if (op == "Shape") {
    RETURN_IF_ERROR(CheckAttributes(node, {"start", "end"}));
    // A computed tensor's shape has its batch as 0 (which a Reshape reads
    // as "the input's"); a constant's is its dims.
    std::vector<int64_t> shape;
    if (IsConst(node, 0)) {
      shape = consts_.at(node.input(0)).dims;
    } else {
      ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0, /*flattened_image_ok=*/true));
      shape = {0};
      shape.insert(shape.end(), x->dims.begin(), x->dims.end());
    }
    // [start, end) of the shape (opset 15), clamped as ONNX does.
    const int64_t rank = static_cast<int64_t>(shape.size());
    ASSIGN_OR_RETURN(int64_t start, IntAttr(node, "start", 0));
    ASSIGN_OR_RETURN(int64_t end, IntAttr(node, "end", rank));
    auto clamp = [rank](int64_t k) { return std::clamp<int64_t>(k < 0 ? k + rank : k, 0, rank); };
    start = clamp(start);
    end = std::max(clamp(end), start);
    out.integer = true;
    out.i.assign(shape.begin() + start, shape.begin() + end);
    out.dims = {static_cast<int64_t>(out.i.size())};
  } else {
    std::vector<const Const*> in;
    for (int k = 0; k < node.input_size(); ++k) {
      if (node.input(k).empty()) continue;
      ASSIGN_OR_RETURN(const Const* c, ConstInput(node, k));
      in.push_back(c);
    }
    if (op == "Gather") RETURN_IF_ERROR(CheckAttributes(node, {"axis"}));
    absl::StatusOr<Const> c = FoldOnnxShapeOp(op, in);
    if (!c.ok()) return Error(node, c.status().message());
    out = *std::move(c);
  }
  if (node.output_size() != 1 || node.output(0).empty()) {
    return Error(node, "does not have exactly one output");
  }
  if (consts_.count(node.output(0)) > 0 || values_.count(node.output(0)) > 0) {
    return Error(node, "output \"", node.output(0), "\" is produced twice");
  }
  out.name = node.output(0);
  consts_[node.output(0)] = std::move(out);
  return absl::OkStatus();
}

absl::Status Importer::Finish() {
  if (graph_.output_size() != 1) {
    return FileError("the graph has ", graph_.output_size(),
                     " outputs; Downpour trains a graph with one (the logits or probabilities)");
  }
  const std::string& name = graph_.output(0).name();
  auto it = values_.find(name);
  if (it == values_.end()) {
    return FileError("the graph's output \"", name, "\" is not computed by the network");
  }
  const Value& logits = it->second;
  if (logits.dims.size() != 1 || logits.layer.empty()) {
    return FileError("the graph's output \"", name, "\" is ", ShapeString(logits.dims),
                     "; a classifier's output is [batch, classes], from a layer");
  }
  std::string loss = "loss";
  for (int k = 2; names_.count(loss) > 0; ++k) loss = absl::StrCat("loss_", k);
  LayerSpec* layer = model_.add_layer();
  layer->set_name(loss);
  layer->add_inputs(logits.layer);
  layer->mutable_softmax_cross_entropy();
  model_.set_num_classes(static_cast<int32_t>(logits.dims[0]));
  if (!logits.softmax) {
    notes_.push_back(absl::StrCat("the graph ends in logits \"", name,
                                  "\": trained with softmax cross-entropy over them"));
  }
  // Downpour's own inference over what was built must agree with the graph.
  absl::StatusOr<ModelShape> shape = InferModel(model_);
  if (!shape.ok()) {
    return FileError("the model it maps to is refused: ", shape.status().message());
  }
  for (const LayerShape& l : shape->layers) {
    auto want = expected_.find(l.name);
    if (want != expected_.end() && want->second != l.output_shape) {
      return FileError("layer \"", l.name, "\": the graph gives ", ShapeString(want->second),
                       " (HWC), Downpour infers ", ShapeString(l.output_shape));
    }
  }
  return absl::OkStatus();
}

absl::Status Importer::CheckDeclaredShapes() {
  std::vector<const onnx::ValueInfoProto*> declared;
  for (const auto& v : graph_.value_info()) declared.push_back(&v);
  for (const auto& v : graph_.output()) declared.push_back(&v);
  for (const onnx::ValueInfoProto* v : declared) {
    auto it = values_.find(v->name());
    if (it == values_.end() || !v->type().has_tensor_type() ||
        !v->type().tensor_type().has_shape()) {
      continue;
    }
    const onnx::TensorShapeProto& shape = v->type().tensor_type().shape();
    std::vector<int64_t> dims;
    bool known = shape.dim_size() >= 1;
    for (int d = 1; d < shape.dim_size() && known; ++d) {
      known = shape.dim(d).has_dim_value();
      dims.push_back(shape.dim(d).dim_value());
    }
    if (known && dims != it->second.dims) {
      return FileError("the graph declares \"", v->name(), "\" as [batch, ",
                       absl::StrJoin(dims, ", "), "]; its nodes compute [batch, ",
                       absl::StrJoin(it->second.dims, ", "), "]");
    }
  }
  return absl::OkStatus();
}

}  // namespace onnx_import_internal

absl::StatusOr<ImportedModel> ImportOnnx(absl::string_view bytes, absl::string_view name) {
  const std::string file(name.empty() ? "the ONNX model" : name);
  if (bytes.size() > kMaxOnnxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", bytes.size(), " bytes is more than an ONNX file holds"));
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not an ONNX model (the bytes do not parse as onnx.ModelProto)"));
  }
  if (!model.has_graph()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": the model has no graph"));
  }
  int opset = -1;
  for (const onnx::OperatorSetIdProto& set : model.opset_import()) {
    if (set.domain().empty() || set.domain() == "ai.onnx") opset = static_cast<int>(set.version());
  }
  if (opset < kMinOnnxOpset || opset > kMaxOnnxOpset) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ",
                     opset < 0 ? "no opset of the default domain is named"
                               : absl::StrCat("opset ", opset, " is not supported"),
                     "; Downpour reads opsets ", kMinOnnxOpset, " to ", kMaxOnnxOpset,
                     " (export with opset_version in that range)"));
  }
  return onnx_import_internal::Importer(model.graph(), file, opset).Run();
}

}  // namespace downpour
