// One function a layer op of the ONNX importer (spec/onnx_importer.h).
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

absl::Status Importer::TakeFlatten(const NodeProto& node, const Value& x) {
  const int64_t n = CheckedProduct(x.dims);  // Bounded: SetOutput checked it.
  if (x.ours.size() == 1) {                  // Already one vector in Downpour (e.g. a global pool).
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

absl::Status Importer::TakeGlobalPool(const NodeProto& node, const Value& x, bool keepdims) {
  if (!x.image()) return Error(node, "input is ", ShapeString(x.dims), ", not an image [C, H, W]");
  const int64_t c = x.dims[0];
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {&x}, nullptr, {c}));
  layer->mutable_global_avg_pool();
  return SetOutput(
      node,
      {layer->name(), keepdims ? std::vector<int64_t>{c, 1, 1} : std::vector<int64_t>{c}, {c}});
}

absl::StatusOr<Importer::Window> Importer::ReadWindow(const NodeProto& node, const Value& x,
                                                      std::vector<int64_t> kernel) const {
  if (!x.image()) return Error(node, "input is ", ShapeString(x.dims), ", not an image [C, H, W]");
  Window w;
  ASSIGN_OR_RETURN(w.kernel, IntsAttr(node, "kernel_shape", kernel));
  if (w.kernel.size() != 2 || w.kernel[0] <= 0 || w.kernel[1] <= 0) {
    return Error(node, "kernel_shape ", ShapeString(w.kernel), " is not a 2-D window");
  }
  if (!kernel.empty() && w.kernel != kernel) {
    return Error(node, "kernel_shape ", ShapeString(w.kernel), " disagrees with the weight's ",
                 ShapeString(kernel));
  }
  ASSIGN_OR_RETURN(w.stride, IntsAttr(node, "strides", {1, 1}));
  ASSIGN_OR_RETURN(std::vector<int64_t> dilations, IntsAttr(node, "dilations", {1, 1}));
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntsAttr(node, "pads", {0, 0, 0, 0}));
  // Bounded before any arithmetic (the file's numbers are anyone's).
  constexpr int64_t kMaxWindow = int64_t{1} << 24;
  for (const std::vector<int64_t>* v : {&w.kernel, &w.stride, &pads}) {
    for (int64_t k : *v) {
      if (k > kMaxWindow) return Error(node, "a window, stride or pad of ", k, " is too large");
    }
  }
  if (w.stride.size() != 2 || w.stride[0] <= 0 || w.stride[1] <= 0) {
    return Error(node, "strides ", ShapeString(w.stride), " are not two positive numbers");
  }
  if (dilations != std::vector<int64_t>{1, 1}) {
    return Error(node, "dilations ", ShapeString(dilations), " are not supported (only 1)");
  }
  if (pads.size() != 4 || *std::min_element(pads.begin(), pads.end()) < 0) {
    return Error(node, "pads ", ShapeString(pads), " are not four numbers >= 0");
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
    return Error(node, "window ", ShapeString(w.kernel), " is larger than its padded input ",
                 ShapeString(x.dims));
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
  RETURN_IF_ERROR(
      CheckAttributes(node, {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}));
  ASSIGN_OR_RETURN(const Value* x, ValueInput(node, 0));
  ASSIGN_OR_RETURN(const Const* w, ConstInput(node, 1));
  ASSIGN_OR_RETURN(int64_t group, IntAttr(node, "group", 1));
  if (group != 1) return Error(node, "group ", group, " is not supported (grouped convolution)");
  if (w->integer || w->dims.size() != 4) {
    return Error(node, "weight \"", w->name, "\" is not a float [out, in, kh, kw] tensor");
  }
  if (x->image() && w->dims[1] != x->dims[0]) {
    return Error(node, "weight \"", w->name, "\" ", ShapeString(w->dims), " takes ", w->dims[1],
                 " channels; the input ", ShapeString(x->dims), " has ", x->dims[0]);
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
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, w, {win.out_h, win.out_w, filters}));
  Conv2dLayer* conv = layer->mutable_conv2d();
  conv->set_filters(static_cast<int32_t>(filters));
  for (int64_t k : win.kernel) conv->add_kernel_size(static_cast<int32_t>(k));
  SetWindow(conv, win.stride, win.pads);
  conv->set_no_bias(b == nullptr);
  AddWeight(*layer, "weight", w->dims, w->f);
  if (b != nullptr) AddWeight(*layer, "bias", b->dims, b->f);
  return SetOutput(
      node, {layer->name(), {filters, win.out_h, win.out_w}, {win.out_h, win.out_w, filters}});
}

absl::Status Importer::TakePool(const NodeProto& node) {
  const bool avg = node.op_type() == "AveragePool";
  std::set<std::string> known = {"auto_pad",     "ceil_mode", "dilations",
                                 "kernel_shape", "pads",      "strides"};
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
    return Error(node,
                 "count_include_pad 1 with padding is not supported (Downpour's average "
                 "pooling counts only the input under the window)");
  }
  const int64_t c = x->dims[0];
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {x}, nullptr, {win.out_h, win.out_w, c}));
  PoolLayer* pool = avg ? layer->mutable_avg_pool() : layer->mutable_max_pool();
  for (int64_t k : win.kernel) pool->add_window(static_cast<int32_t>(k));
  SetWindow(pool, win.stride, win.pads);
  return SetOutput(node, {layer->name(), {c, win.out_h, win.out_w}, {win.out_h, win.out_w, c}});
}

// A weight [in, out] as PyTorch's [out, in].
std::vector<float> OutByIn(const std::vector<float>& in_by_out, int64_t in, int64_t out) {
  std::vector<float> weight(in_by_out.size());
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < out; ++o) weight[o * in + i] = in_by_out[i * out + o];
  }
  return weight;
}

// A [out] or [1, out] bias.
bool IsBias(const Const& b, int64_t out) {
  return !b.integer &&
         (b.dims == std::vector<int64_t>{out} || b.dims == std::vector<int64_t>{1, out});
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
    return Error(node, "input is ", ShapeString(a->dims), "; a Gemm takes [batch, features]");
  }
  if (b->integer || b->dims.size() != 2) return Error(node, "weight is not a float matrix");
  const int64_t in = a->dims[0];
  const int64_t out = trans_b ? b->dims[0] : b->dims[1];
  if ((trans_b ? b->dims[1] : b->dims[0]) != in) {
    return Error(node, "weight \"", b->name, "\" ", ShapeString(b->dims), " (transB ", trans_b,
                 ") does not take ", in, " inputs");
  }
  const Const* c = nullptr;
  if (node.input_size() > 2 && !node.input(2).empty()) {
    ASSIGN_OR_RETURN(c, ConstInput(node, 2));
    if (!IsBias(*c, out)) {
      return Error(node, "bias \"", c->name, "\" ", ShapeString(c->dims), " is not [", out, "]");
    }
    if (beta != 1.f) return Error(node, "beta ", beta, " is not supported (1)");
  }
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {a}, b, {out}));
  layer->mutable_dense()->set_units(static_cast<int32_t>(out));
  layer->mutable_dense()->set_no_bias(c == nullptr);
  AddWeight(*layer, "weight", {out, in}, trans_b ? b->f : OutByIn(b->f, in, out));
  if (c != nullptr) AddWeight(*layer, "bias", {out}, c->f);
  return SetOutput(node, {layer->name(), {out}, {out}});
}

absl::Status Importer::TakeMatMul(const NodeProto& node) {
  RETURN_IF_ERROR(CheckAttributes(node, {}));
  ASSIGN_OR_RETURN(const Value* a, ValueInput(node, 0, /*flattened_image_ok=*/true));
  ASSIGN_OR_RETURN(const Const* b, ConstInput(node, 1));
  if (a->dims.size() != 1) {
    return Error(node, "input is ", ShapeString(a->dims),
                 "; a MatMul is taken as a dense layer over [batch, features]");
  }
  const int64_t in = a->dims[0];
  if (b->integer || b->dims.size() != 2 || b->dims[0] != in) {
    return Error(node, "weight \"", b->name, "\" ", ShapeString(b->dims), " is not a float [", in,
                 ", out] matrix");
  }
  const int64_t out = b->dims[1];
  ASSIGN_OR_RETURN(LayerSpec * layer, AddLayer(node, {a}, b, {out}));
  layer->mutable_dense()->set_units(static_cast<int32_t>(out));
  layer->mutable_dense()->set_no_bias(true);
  AddWeight(*layer, "weight", {out, in}, OutByIn(b->f, in, out));
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
    if (x->bias_layer >= 0 && uses_[node.input(1 - c)] != 1) {
      return Error(node, "adds a bias to \"", node.input(1 - c),
                   "\", which other nodes read without it; a MatMul's bias is taken only "
                   "where the Add is its one reader");
    }
    if (x->bias_layer < 0 || !IsBias(*bias, x->dims[0])) {
      return Error(node, "adds the constant \"", bias->name, "\" ", ShapeString(bias->dims),
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
    return Error(node, "adds ", ShapeString(a->dims), " and ", ShapeString(b->dims),
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
    return Error(node, "input is ", ShapeString(x->dims), "; batch norm takes [C, H, W] or [C]");
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
  const bool channels =
      (rank == 3 && (axis == 1 || axis == -3)) || (rank == 1 && (axis == 1 || axis == -1));
  if (!channels) {
    return Error(node, "joins ", ShapeString(inputs[0]->dims), " along axis ", axis,
                 "; only along the channels of images or the features of vectors");
  }
  std::vector<int64_t> dims = inputs[0]->dims, ours = inputs[0]->ours;
  for (size_t k = 1; k < inputs.size(); ++k) {
    const std::vector<int64_t>& d = inputs[k]->dims;
    if (d.size() != rank || (rank == 3 && (d[1] != dims[1] || d[2] != dims[2]))) {
      return Error(node, "joins ", ShapeString(inputs[0]->dims), " and ", ShapeString(d),
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
    return Error(node,
                 "only a Gather of rows (axis 0) from a float [vocabulary, dim] weight is "
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
}  // namespace onnx_import_internal
}  // namespace downpour
