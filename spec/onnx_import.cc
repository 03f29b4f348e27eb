#include "spec/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "onnx/onnx.pb.h"
#include "spec/onnx_tensor.h"
#include "spec/limits.h"
#include "spec/model_shape.h"

namespace downpour {
namespace {

using onnx::AttributeProto;
using onnx::NodeProto;
using onnx::TensorProto;
using Const = OnnxConst;


// A tensor the network computes, per example (the batch dimension left out).
struct Value {
  // The layer (or named model input) that produces it; empty: the model's
  // one unnamed input.
  std::string layer;
  std::vector<int64_t> dims;  // ONNX's order: [C, H, W] for an image.
  std::vector<int64_t> ours;  // Downpour's: [H, W, C] for an image.
  bool ids = false;           // Integer ids, a Gather's indices.
  // A flatten of an image of more than one pixel: ONNX flattens CHW and
  // Downpour HWC, which only a dense layer's weight can make up for.
  bool flattened_image = false;
  bool softmax = false;   // A final Softmax / LogSoftmax: the loss.
  int bias_layer = -1;    // A MatMul's dense layer still waiting for its bias.
  bool image() const { return dims.size() == 3; }
};

bool SimpleName(const std::string& name) {
  if (name.empty() || name.size() > 64 || !absl::ascii_isalpha(name[0])) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char ch) { return absl::ascii_isalnum(ch) || ch == '_' || ch == '.'; });
}

// A weight the import hands back, in PyTorch's layout.
struct Weight {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<float> values;
};

class Importer {
 public:
  Importer(const onnx::GraphProto& graph, std::string file, int opset)
      : graph_(graph), file_(std::move(file)), opset_(opset) {}

  absl::StatusOr<ImportedModel> Run();

 private:
  template <typename... Args>
  absl::Status Error(const NodeProto& node, const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": node \"", node.name(), "\" (",
                                                   node.op_type(), "): ", args...));
  }
  template <typename... Args>
  absl::Status FileError(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", args...));
  }

  absl::Status ReadInitializers();
  absl::Status ReadInputs();
  absl::Status Take(const NodeProto& node);
  absl::Status Finish();
  absl::Status CheckDeclaredShapes();

  // Attributes, checked against the set each op understands.
  absl::Status CheckAttributes(const NodeProto& node, std::set<std::string> known) const;
  const AttributeProto* Attribute(const NodeProto& node, const std::string& name) const;
  absl::StatusOr<int64_t> IntAttr(const NodeProto& node, const std::string& name,
                                  int64_t fallback) const;
  absl::StatusOr<float> FloatAttr(const NodeProto& node, const std::string& name,
                                  float fallback) const;
  absl::StatusOr<std::vector<int64_t>> IntsAttr(const NodeProto& node, const std::string& name,
                                                std::vector<int64_t> fallback) const;

  // Input k of `node`: a value the network computes, or a constant.
  absl::StatusOr<const Value*> ValueInput(const NodeProto& node, int k,
                                          bool flattened_image_ok = false) const;
  absl::StatusOr<const Const*> ConstInput(const NodeProto& node, int k) const;
  bool IsConst(const NodeProto& node, int k) const {
    return k < node.input_size() && consts_.count(node.input(k)) > 0;
  }
  absl::Status SetOutput(const NodeProto& node, Value value, bool extra_outputs_ok = false);

  // A new layer reading `inputs`, named after `weight` ("x.weight" -> "x")
  // or the node.
  absl::StatusOr<LayerSpec*> AddLayer(const NodeProto& node,
                                      const std::vector<const Value*>& inputs,
                                      const Const* weight, std::vector<int64_t> ours);
  void AddWeight(const LayerSpec& layer, const std::string& what, std::vector<int64_t> dims,
                 std::vector<float> values);

  absl::Status TakeConv(const NodeProto& node);
  absl::Status TakePool(const NodeProto& node);
  absl::Status TakeGemm(const NodeProto& node);
  absl::Status TakeMatMul(const NodeProto& node);
  absl::Status TakeAdd(const NodeProto& node);
  absl::Status TakeBatchNorm(const NodeProto& node);
  absl::Status TakeConcat(const NodeProto& node);
  absl::Status TakeFlatten(const NodeProto& node, const Value& x);
  absl::Status TakeGather(const NodeProto& node);
  absl::Status Fold(const NodeProto& node);

  // The window of a Conv or pool: explicit pads [top, bottom, left, right]
  // (auto_pad resolved) and the output's height and width.
  struct Window {
    std::vector<int64_t> kernel, stride, pads;
    int64_t out_h = 0, out_w = 0;
  };
  absl::StatusOr<Window> ReadWindow(const NodeProto& node, const Value& x,
                                    std::vector<int64_t> kernel) const;

  const onnx::GraphProto& graph_;
  const std::string file_;
  const int opset_;
  std::map<std::string, Const> consts_;
  std::map<std::string, Value> values_;
  bool named_inputs_ = false;
  ModelSpec model_;
  std::map<std::string, std::vector<int64_t>> expected_;  // Layer -> its shape (ours).
  std::set<std::string> names_;
  std::map<std::string, int> op_count_;
  std::vector<Weight> weights_;
  std::vector<std::string> notes_;
};

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
                   SerializeSafetensors(tensors, {{"downpour.layout", "pytorch"},
                                                  {"downpour.onnx_file", file_}}));
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
      return FileError(where, " has element type ", type.elem_type(),
                       "; inputs are floating point, or int64 ids for a Gather");
    }
    for (int d = 1; d < rank; ++d) {
      const onnx::TensorShapeProto::Dimension& dim = type.shape().dim(d);
      if (!dim.has_dim_value() || dim.dim_value() <= 0) {
        return FileError(where, " has no fixed size in dimension ", d,
                         " (only the batch, dimension 0, may vary)");
      }
      value.dims.push_back(dim.dim_value());
    }
    if (value.ids ? rank != 2 : rank != 2 && rank != 4) {
      return FileError(where, " has rank ", rank,
                       value.ids ? "; ids are [batch, n]" : "; inputs are [batch, C, H, W] or "
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
  values_[node.output(0)] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<LayerSpec*> Importer::AddLayer(const NodeProto& node,
                                              const std::vector<const Value*>& inputs,
                                              const Const* weight, std::vector<int64_t> ours) {
  if (model_.layer_size() >= kMaxLayers - 1) {
    return Error(node, "the model would have more than ", kMaxLayers, " layers");
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
        return Error(node, "reads the graph's input after another node has; a model with one "
                           "input is read by its first layer only");
      }
      continue;
    }
    layer->add_inputs(input->layer);
  }
  expected_[name] = std::move(ours);
  return layer;
}

void Importer::AddWeight(const LayerSpec& layer, const std::string& what,
                         std::vector<int64_t> dims, std::vector<float> values) {
  weights_.push_back({absl::StrCat(layer.name(), ".", what), std::move(dims), std::move(values)});
}

absl::Status Importer::Take(const NodeProto& node) {
  if (!node.domain().empty() && node.domain() != "ai.onnx") {
    return Error(node, "ops of domain \"", node.domain(), "\" are not supported");
  }
  const std::string& op = node.op_type();
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
    if (!x->image()) return Error(node, "input is ", OnnxShapeText(x->dims), ", not an image [C, H, W]");
    const int64_t c = x->dims[0];
    ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, nullptr, {c}));
    layer->mutable_global_avg_pool();
    // [C, 1, 1] to ONNX; Downpour's is [C] already, which a Flatten keeps.
    return SetOutput(node, {layer->name(), {c, 1, 1}, {c}});
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
    if (!x->image() || (axes != std::vector<int64_t>{2, 3} &&
                        axes != std::vector<int64_t>{-2, -1})) {
      return Error(node, "only a mean over the height and width of an image (axes [2, 3]) is "
                         "taken, as a global average pool; this one is over axes ",
                   OnnxShapeText(axes), " of ", OnnxShapeText(x->dims));
    }
    const int64_t c = x->dims[0];
    ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, nullptr, {c}));
    layer->mutable_global_avg_pool();
    return SetOutput(node, {layer->name(), keepdims ? std::vector<int64_t>{c, 1, 1}
                                                    : std::vector<int64_t>{c}, {c}});
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
    int64_t n = 1;
    for (int64_t d : x->dims) n *= d;
    const std::vector<int64_t>& t = shape->i;
    // allowzero makes a 0 mean zero elements (not "the input's"); with no 0
    // in the shape it changes nothing.
    const bool zero = std::count(t.begin(), t.end(), 0) > 0;
    const bool flatten = shape->integer && t.size() == 2 && (allowzero == 0 || !zero) &&
                         ((t[0] >= 0 && (t[1] == -1 || t[1] == n)) || (t[0] == -1 && t[1] == n));
    if (!flatten) {
      return Error(node, "a Reshape to ", OnnxShapeText(t), " of ", OnnxShapeText(x->dims),
                   " is not a flatten to [batch, ", n, "], the only Reshape taken");
    }
    return TakeFlatten(node, *x);
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    RETURN_IF_ERROR(CheckAttributes(node, {"axis"}));
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
    ASSIGN_OR_RETURN(int64_t axis, IntAttr(node, "axis", opset_ >= 13 ? -1 : 1));
    if (x->dims.size() != 1 || (axis != 1 && axis != -1)) {
      return Error(node, "only a softmax over the classes of [batch, classes] logits is the "
                         "loss; this one is over axis ", axis, " of ", OnnxShapeText(x->dims));
    }
    Value out = *x;
    out.softmax = true;
    return SetOutput(node, std::move(out));
  }
  return Error(node, "op ", op, " is not supported (the supported ops: docs/job-specs.md, ",
               "\"Models from ONNX\")");
}

absl::Status Importer::TakeFlatten(const NodeProto& node, const Value& x) {
  int64_t n = 1;
  for (int64_t d : x.dims) n *= d;
  if (x.ours.size() == 1) {  // Already one vector in Downpour (e.g. a global pool).
    Value out = x;
    out.dims = {n};
    return SetOutput(node, std::move(out));
  }
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {&x}, nullptr, {n}));
  layer->mutable_flatten();
  Value out{layer->name(), {n}, {n}};
  out.flattened_image = x.image() && x.dims[1] * x.dims[2] > 1;
  return SetOutput(node, std::move(out));
}

absl::StatusOr<Importer::Window> Importer::ReadWindow(const NodeProto& node, const Value& x,
                                                      std::vector<int64_t> kernel) const {
  if (!x.image()) return Error(node, "input is ", OnnxShapeText(x.dims), ", not an image [C, H, W]");
  Window w;
  ASSIGN_OR_RETURN(w.kernel, IntsAttr(node, "kernel_shape", kernel));
  if (w.kernel.size() != 2 || w.kernel[0] <= 0 || w.kernel[1] <= 0) {
    return Error(node, "kernel_shape ", OnnxShapeText(w.kernel), " is not a 2-D window");
  }
  if (!kernel.empty() && w.kernel != kernel) {
    return Error(node, "kernel_shape ", OnnxShapeText(w.kernel), " disagrees with the weight's ",
                 OnnxShapeText(kernel));
  }
  ASSIGN_OR_RETURN(w.stride, IntsAttr(node, "strides", {1, 1}));
  ASSIGN_OR_RETURN(std::vector<int64_t> dilations, IntsAttr(node, "dilations", {1, 1}));
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntsAttr(node, "pads", {0, 0, 0, 0}));
  if (w.stride.size() != 2 || w.stride[0] <= 0 || w.stride[1] <= 0) {
    return Error(node, "strides ", OnnxShapeText(w.stride), " are not two positive numbers");
  }
  if (dilations != std::vector<int64_t>{1, 1}) {
    return Error(node, "dilations ", OnnxShapeText(dilations), " are not supported (only 1)");
  }
  if (pads.size() != 4 || *std::min_element(pads.begin(), pads.end()) < 0) {
    return Error(node, "pads ", OnnxShapeText(pads), " are not four numbers >= 0");
  }
  const AttributeProto* auto_pad = Attribute(node, "auto_pad");
  const std::string mode = auto_pad == nullptr ? "NOTSET" : auto_pad->s();
  const int64_t h = x.dims[1], wd = x.dims[2];
  if (mode == "VALID") {
    pads = {0, 0, 0, 0};
  } else if (mode == "SAME_UPPER" || mode == "SAME_LOWER") {
    auto same = [&](int64_t in, int64_t k, int64_t s, int64_t* begin, int64_t* end) {
      const int64_t out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>((out - 1) * s + k - in, 0);
      *begin = mode == "SAME_UPPER" ? total / 2 : total - total / 2;
      *end = total - *begin;
    };
    same(h, w.kernel[0], w.stride[0], &pads[0], &pads[2]);
    same(wd, w.kernel[1], w.stride[1], &pads[1], &pads[3]);
  } else if (mode != "NOTSET") {
    return Error(node, "auto_pad ", mode, " is unknown");
  }
  // ONNX: [top, left, bottom, right]; Downpour: [top, bottom, left, right].
  w.pads = {pads[0], pads[2], pads[1], pads[3]};
  w.out_h = (h + pads[0] + pads[2] - w.kernel[0]) / w.stride[0] + 1;
  w.out_w = (wd + pads[1] + pads[3] - w.kernel[1]) / w.stride[1] + 1;
  if (h + pads[0] + pads[2] < w.kernel[0] || wd + pads[1] + pads[3] < w.kernel[1]) {
    return Error(node, "window ", OnnxShapeText(w.kernel), " is larger than its padded input ",
                 OnnxShapeText(x.dims));
  }
  return w;
}

template <typename Layer>
void SetWindow(Layer* layer, const std::vector<int64_t>& stride, const std::vector<int64_t>& pads) {
  for (int64_t s : stride) layer->add_stride(static_cast<int32_t>(s));
  layer->set_padding(EXPLICIT);
  for (int64_t p : pads) layer->add_explicit_padding(static_cast<int32_t>(p));
}

absl::Status Importer::TakeConv(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(
      node, {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}));
  ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
  ASSIGN_OR_RETURN(const Const* w, ConstInput(node, 1));
  ASSIGN_OR_RETURN(int64_t group, IntAttr(node, "group", 1));
  if (group != 1) return Error(node, "group ", group, " is not supported (grouped convolution)");
  if (w->integer || w->dims.size() != 4) {
    return Error(node, "weight \"", w->name, "\" is not a float [out, in, kh, kw] tensor");
  }
  if (x->image() && w->dims[1] != x->dims[0]) {
    return Error(node, "weight \"", w->name, "\" ", OnnxShapeText(w->dims), " takes ", w->dims[1],
                 " channels; the input ", OnnxShapeText(x->dims), " has ", x->dims[0]);
  }
  ASSIGN_OR_RETURN(Window win, ReadWindow(node, *x, {w->dims[2], w->dims[3]}));
  const int64_t filters = w->dims[0];
  const Const* b = nullptr;
  if (node.input_size() > 2 && !node.input(2).empty()) {
    ASSIGN_OR_RETURN(b, ConstInput(node, 2));
    if (b->integer || b->dims != std::vector<int64_t>{filters}) {
      return Error(node, "bias \"", b->name, "\" is not a float [", filters, "] tensor");
    }
  }
  ASSIGN_OR_RETURN(LayerSpec * layer,
                   AddLayer(node, {x}, w, {win.out_h, win.out_w, filters}));
  Conv2dLayer* conv = layer->mutable_conv2d();
  conv->set_filters(static_cast<int32_t>(filters));
  for (int64_t k : win.kernel) conv->add_kernel_size(static_cast<int32_t>(k));
  SetWindow(conv, win.stride, win.pads);
  conv->set_no_bias(b == nullptr);
  AddWeight(*layer, "weight", w->dims, w->f);
  if (b != nullptr) AddWeight(*layer, "bias", b->dims, b->f);
  return SetOutput(node, {layer->name(), {filters, win.out_h, win.out_w},
                          {win.out_h, win.out_w, filters}});
}

absl::Status Importer::TakePool(const NodeProto& node) {
  const bool avg = node.op_type() == "AveragePool";
  std::set<std::string> known = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                                 "strides"};
  known.insert(avg ? "count_include_pad" : "storage_order");
  RETURN_IF_ERROR(CheckAttributes(node, known));
  ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
  ASSIGN_OR_RETURN(int64_t ceil_mode, IntAttr(node, "ceil_mode", 0));
  if (ceil_mode != 0) return Error(node, "ceil_mode 1 is not supported");
  ASSIGN_OR_RETURN(int64_t storage_order, IntAttr(node, "storage_order", 0));
  if (storage_order != 0) return Error(node, "storage_order 1 is not supported");
  ASSIGN_OR_RETURN(Window win, ReadWindow(node, *x, {}));
  ASSIGN_OR_RETURN(int64_t count_pad, IntAttr(node, "count_include_pad", 0));
  const bool padded = *std::max_element(win.pads.begin(), win.pads.end()) > 0;
  if (avg && count_pad != 0 && padded) {
    return Error(node, "count_include_pad 1 with padding is not supported (Downpour's average "
                       "pooling counts only the input under the window)");
  }
  const int64_t c = x->dims[0];
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, nullptr, {win.out_h, win.out_w, c}));
  PoolLayer* pool = avg ? layer->mutable_avg_pool() : layer->mutable_max_pool();
  for (int64_t k : win.kernel) pool->add_window(static_cast<int32_t>(k));
  SetWindow(pool, win.stride, win.pads);
  return SetOutput(node, {layer->name(), {c, win.out_h, win.out_w}, {win.out_h, win.out_w, c}});
}

// A [out] or [1, out] bias.
bool IsBias(const Const& b, int64_t out) {
  return !b.integer && (b.dims == std::vector<int64_t>{out} ||
                        b.dims == std::vector<int64_t>{1, out});
}

absl::Status Importer::TakeGemm(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {"alpha", "beta", "transA", "transB"}));
  ASSIGN_OR_RETURN(const Value* a, ValueInput(node, 0, /*flattened_image_ok=*/true));
  ASSIGN_OR_RETURN(const Const* b, ConstInput(node, 1));
  ASSIGN_OR_RETURN(float alpha, FloatAttr(node, "alpha", 1.f));
  ASSIGN_OR_RETURN(float beta, FloatAttr(node, "beta", 1.f));
  ASSIGN_OR_RETURN(int64_t trans_a, IntAttr(node, "transA", 0));
  ASSIGN_OR_RETURN(int64_t trans_b, IntAttr(node, "transB", 0));
  if (alpha != 1.f || trans_a != 0) {
    return Error(node, "alpha ", alpha, " / transA ", trans_a, " are not supported (1 and 0)");
  }
  if (a->dims.size() != 1) {
    return Error(node, "input is ", OnnxShapeText(a->dims), "; a Gemm takes [batch, features]");
  }
  if (b->integer || b->dims.size() != 2) return Error(node, "weight is not a float matrix");
  const int64_t in = a->dims[0];
  const int64_t out = trans_b ? b->dims[0] : b->dims[1];
  if ((trans_b ? b->dims[1] : b->dims[0]) != in) {
    return Error(node, "weight \"", b->name, "\" ", OnnxShapeText(b->dims), " (transB ", trans_b,
                 ") does not take ", in, " inputs");
  }
  const Const* c = nullptr;
  if (node.input_size() > 2 && !node.input(2).empty()) {
    ASSIGN_OR_RETURN(c, ConstInput(node, 2));
    if (!IsBias(*c, out)) {
      return Error(node, "bias \"", c->name, "\" ", OnnxShapeText(c->dims), " is not [", out, "]");
    }
    if (beta != 1.f) return Error(node, "beta ", beta, " is not supported (1)");
  }
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {a}, b, {out}));
  layer->mutable_dense()->set_units(static_cast<int32_t>(out));
  layer->mutable_dense()->set_no_bias(c == nullptr);
  std::vector<float> weight = b->f;  // PyTorch's [out, in].
  if (!trans_b) {
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t o = 0; o < out; ++o) weight[o * in + i] = b->f[i * out + o];
    }
  }
  AddWeight(*layer, "weight", {out, in}, std::move(weight));
  if (c != nullptr) AddWeight(*layer, "bias", {out}, c->f);
  return SetOutput(node, {layer->name(), {out}, {out}});
}

absl::Status Importer::TakeMatMul(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {}));
  ASSIGN_OR_RETURN(const Value* a, ValueInput(node, 0, /*flattened_image_ok=*/true));
  ASSIGN_OR_RETURN(const Const* b, ConstInput(node, 1));
  if (a->dims.size() != 1) {
    return Error(node, "input is ", OnnxShapeText(a->dims),
                 "; a MatMul is taken as a dense layer over [batch, features]");
  }
  const int64_t in = a->dims[0];
  if (b->integer || b->dims.size() != 2 || b->dims[0] != in) {
    return Error(node, "weight \"", b->name, "\" ", OnnxShapeText(b->dims), " is not a float [", in,
                 ", out] matrix");
  }
  const int64_t out = b->dims[1];
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {a}, b, {out}));
  layer->mutable_dense()->set_units(static_cast<int32_t>(out));
  layer->mutable_dense()->set_no_bias(true);
  std::vector<float> weight(b->f.size());
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < out; ++o) weight[o * in + i] = b->f[i * out + o];
  }
  AddWeight(*layer, "weight", {out, in}, std::move(weight));
  Value value{layer->name(), {out}, {out}};
  value.bias_layer = model_.layer_size() - 1;
  return SetOutput(node, std::move(value));
}

absl::Status Importer::TakeAdd(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {}));
  if (node.input_size() != 2) return Error(node, "does not have two inputs");
  const int c = IsConst(node, 0) ? 0 : IsConst(node, 1) ? 1 : -1;
  if (c >= 0) {
    // A bias after a MatMul: the dense layer gets it.
    ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 1 - c));
    ASSIGN_OR_RETURN(const Const* bias, ConstInput(node, c));
    if (x->bias_layer < 0 || !IsBias(*bias, x->dims[0])) {
      return Error(node, "adds the constant \"", bias->name, "\" ", OnnxShapeText(bias->dims),
                   "; a constant is only taken as the [out] bias of a MatMul");
    }
    LayerSpec* layer = model_.mutable_layer(x->bias_layer);
    layer->mutable_dense()->set_no_bias(false);
    AddWeight(*layer, "bias", {x->dims[0]}, bias->f);
    Value out = *x;
    out.bias_layer = -1;
    return SetOutput(node, std::move(out));
  }
  ASSIGN_OR_RETURN(const Value* a, ValueInput(node, 0));
  ASSIGN_OR_RETURN(const Value* b, ValueInput(node, 1));
  if (a->dims != b->dims) {
    return Error(node, "adds ", OnnxShapeText(a->dims), " and ", OnnxShapeText(b->dims),
                 "; Downpour adds tensors of one shape (no broadcasting)");
  }
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {a, b}, nullptr, a->ours));
  layer->mutable_add();
  return SetOutput(node, {layer->name(), a->dims, a->ours});
}

absl::Status Importer::TakeBatchNorm(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {"epsilon", "momentum", "training_mode"}));
  ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
  ASSIGN_OR_RETURN(float epsilon, FloatAttr(node, "epsilon", 1e-5f));
  ASSIGN_OR_RETURN(float momentum, FloatAttr(node, "momentum", 0.9f));
  // A graph exported in training mode computes batch statistics and the
  // updated running ones (outputs 1 and 2): what a batch_norm layer does
  // when it trains, so it maps the same; nothing may read those outputs.
  ASSIGN_OR_RETURN(int64_t training, IntAttr(node, "training_mode", 0));
  if (training != 0) {
    notes_.push_back(absl::StrCat("node \"", node.name(),
                                  "\" (BatchNormalization): exported in training mode; a "
                                  "batch_norm layer, which uses its running statistics to "
                                  "evaluate"));
  }
  if (x->dims.size() != 1 && !x->image()) {
    return Error(node, "input is ", OnnxShapeText(x->dims), "; batch norm takes [C, H, W] or [C]");
  }
  const int64_t c = x->dims[0];
  const char* kNames[] = {"weight", "bias", "running_mean", "running_var"};
  std::vector<const Const*> params;
  for (int k = 1; k <= 4; ++k) {
    ASSIGN_OR_RETURN(const Const* p, ConstInput(node, k));
    if (p->integer || p->dims != std::vector<int64_t>{c}) {
      return Error(node, kNames[k - 1], " \"", p->name, "\" is not a float [", c, "] tensor");
    }
    params.push_back(p);
  }
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, params[0], x->ours));
  layer->mutable_batch_norm()->set_epsilon(epsilon);
  layer->mutable_batch_norm()->set_momentum(momentum);
  for (int k = 0; k < 4; ++k) AddWeight(*layer, kNames[k], {c}, params[k]->f);
  return SetOutput(node, {layer->name(), x->dims, x->ours}, /*extra_outputs_ok=*/training != 0);
}

absl::Status Importer::TakeConcat(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {"axis"}));
  ASSIGN_OR_RETURN(int64_t axis, IntAttr(node, "axis", 1));
  if (node.input_size() < 2) return Error(node, "has fewer than two inputs");
  std::vector<const Value*> inputs;
  for (int k = 0; k < node.input_size(); ++k) {
    ASSIGN_OR_RETURN(const Value* v, ValueInput(node, k));
    inputs.push_back(v);
  }
  const size_t rank = inputs[0]->dims.size();
  // The channels of an image, the features of a vector: Downpour's last axis.
  const bool channels = (rank == 3 && (axis == 1 || axis == -3)) ||
                        (rank == 1 && (axis == 1 || axis == -1));
  if (!channels) {
    return Error(node, "joins ", OnnxShapeText(inputs[0]->dims), " along axis ", axis,
                 "; only along the channels of images or the features of vectors");
  }
  std::vector<int64_t> dims = inputs[0]->dims, ours = inputs[0]->ours;
  for (size_t k = 1; k < inputs.size(); ++k) {
    const std::vector<int64_t>& d = inputs[k]->dims;
    if (d.size() != rank || (rank == 3 && (d[1] != dims[1] || d[2] != dims[2]))) {
      return Error(node, "joins ", OnnxShapeText(inputs[0]->dims), " and ", OnnxShapeText(d),
                   ", which differ beyond the joined axis");
    }
    dims[0] += d[0];
  }
  ours.back() = dims[0];
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, inputs, nullptr, ours));
  layer->mutable_concat();
  return SetOutput(node, {layer->name(), dims, ours});
}

absl::Status Importer::TakeGather(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {"axis"}));
  ASSIGN_OR_RETURN(int64_t axis, IntAttr(node, "axis", 0));
  ASSIGN_OR_RETURN(const Const* table, ConstInput(node, 0));
  ASSIGN_OR_RETURN(const Value* ids, ValueInput(node, 1));
  if (axis != 0 || table->integer || table->dims.size() != 2) {
    return Error(node, "only a Gather of rows (axis 0) from a float [vocabulary, dim] weight is "
                       "taken, as an embedding");
  }
  if (!ids->ids) return Error(node, "its indices are not integer ids from a graph input");
  const int64_t vocab = table->dims[0], dim = table->dims[1];
  std::vector<int64_t> dims = ids->dims;
  dims.push_back(dim);
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {ids}, table, dims));
  layer->mutable_embedding()->set_vocab_size(vocab);
  layer->mutable_embedding()->set_dim(static_cast<int32_t>(dim));
  AddWeight(*layer, "weight", table->dims, table->f);
  return SetOutput(node, {layer->name(), dims, dims});
}

// Shape arithmetic over constants (how exporters spell view(x.size(0), -1)).
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
    return FileError("the graph's output \"", name, "\" is ", OnnxShapeText(logits.dims),
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
      return FileError("layer \"", l.name, "\": the graph gives ", OnnxShapeText(want->second),
                       " (HWC), Downpour infers ", OnnxShapeText(l.output_shape));
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

}  // namespace

absl::StatusOr<ImportedModel> ImportOnnx(absl::string_view bytes, absl::string_view name) {
  const std::string file(name.empty() ? "the ONNX model" : name);
  if (bytes.size() > kMaxOnnxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", bytes.size(),
                                                   " bytes is more than an ONNX file holds"));
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
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": ", opset < 0 ? "no opset of the default domain is named"
                              : absl::StrCat("opset ", opset, " is not supported"),
        "; Downpour reads opsets ", kMinOnnxOpset, " to ", kMaxOnnxOpset,
        " (export with opset_version in that range)"));
  }
  return Importer(model.graph(), file, opset).Run();
}

}  // namespace downpour
