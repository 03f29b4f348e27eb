#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace downpour {
namespace model_internal {

namespace cpu = kernels::cpu;
using kernels::Write;

// One activation tensor: per-example size, values and (in training) the
// gradient of the loss with respect to them.
struct Buffer {
  int64_t elements = 0;
  std::vector<float> value;
  std::vector<float> grad;
};

struct ForwardArgs {
  int64_t batch = 0;
  bool training = false;
  uint64_t step = 0;
  std::vector<const float*> x;  // One per LayerShape::inputs entry.
  float* y = nullptr;           // Null for the loss and for aliasing layers.
  const int32_t* labels = nullptr;
  kernels::LossStats* loss = nullptr;
};

struct BackwardArgs {
  int64_t batch = 0;
  std::vector<const float*> x;
  const float* y = nullptr;
  const float* dy = nullptr;    // Null for the loss.
  std::vector<float*> dx;       // Null entries: no gradient wanted (model input).
  std::vector<Write> dx_write;  // Overwrite for the first contribution, then add.
};

// A layer's computation over the kernels. Owns its scratch (dropout mask,
// dlogits); parameters and activations belong to the Model.
class Layer {
 public:
  virtual ~Layer() = default;
  // Grows per-batch scratch to hold `batch` examples.
  virtual void Reserve(int64_t /*batch*/) {}
  // True for layers that only reinterpret their input's shape: they share the
  // input's buffer and do nothing in forward or backward.
  virtual bool aliases_input() const { return false; }
  virtual void Forward(const cpu::CpuContext& ctx, const ForwardArgs& args) = 0;
  virtual void Backward(const cpu::CpuContext& ctx, const BackwardArgs& args) = 0;
};

namespace {

class DenseLayer : public Layer {
 public:
  DenseLayer(int64_t in, int64_t out, const float* w, const float* b, float* dw, float* db)
      : in_(in), out_(out), w_(w), b_(b), dw_(dw), db_(db) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    cpu::DenseForward(ctx, a.batch, in_, out_, a.x[0], w_, b_, a.y);
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    cpu::DenseBackward(ctx, a.batch, in_, out_, a.x[0], w_, a.dy, a.dx[0], a.dx_write[0], dw_, db_,
                       Write::kOverwrite);
  }

 private:
  const int64_t in_, out_;
  const float* const w_;
  const float* const b_;  // Null without bias.
  float* const dw_;
  float* const db_;
};

class ReluLayer : public Layer {
 public:
  explicit ReluLayer(int64_t elements) : elements_(elements) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    cpu::ReluForward(ctx, a.batch * elements_, a.x[0], a.y);
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return;
    cpu::ReluBackward(ctx, a.batch * elements_, a.x[0], a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t elements_;
};

class FlattenLayer : public Layer {
 public:
  bool aliases_input() const override { return true; }
  void Forward(const cpu::CpuContext&, const ForwardArgs&) override {}
  void Backward(const cpu::CpuContext&, const BackwardArgs&) override {}
};

class DropoutLayer : public Layer {
 public:
  DropoutLayer(int64_t elements, float rate, uint64_t seed)
      : elements_(elements), rate_(rate), seed_(seed) {}

  void Reserve(int64_t batch) override { mask_.resize(batch * elements_); }
  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    const int64_t n = a.batch * elements_;
    if (a.training) {
      cpu::DropoutForward(ctx, n, rate_, seed_, a.step, a.x[0], a.y, mask_.data());
    } else {
      cpu::CopyOrAdd(ctx, n, a.x[0], a.y, Write::kOverwrite);
    }
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return;
    cpu::DropoutBackward(ctx, a.batch * elements_, rate_, mask_.data(), a.dy, a.dx[0],
                         a.dx_write[0]);
  }

 private:
  const int64_t elements_;
  const float rate_;
  const uint64_t seed_;
  std::vector<uint8_t> mask_;
};

class SoftmaxCrossEntropyLayer : public Layer {
 public:
  explicit SoftmaxCrossEntropyLayer(int64_t classes) : classes_(classes) {}

  void Reserve(int64_t batch) override { dlogits_.resize(batch * classes_); }
  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    cpu::SoftmaxCrossEntropy(ctx, a.batch, classes_, a.x[0], a.labels,
                             a.training ? dlogits_.data() : nullptr, a.loss);
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return;
    cpu::CopyOrAdd(ctx, a.batch * classes_, dlogits_.data(), a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t classes_;
  std::vector<float> dlogits_;  // Written by a training forward, read by backward.
};

// Conv2d over NHWC images; im2col scratch for one image.
class Conv2dLayer : public Layer {
 public:
  Conv2dLayer(const kernels::WindowShape& window, const float* w, const float* b, float* dw,
              float* db)
      : window_(window),
        w_(w),
        b_(b),
        dw_(dw),
        db_(db),
        workspace_(cpu::Conv2dWorkspaceElements(window)) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    cpu::Conv2dForward(ctx, Batched(a.batch), a.x[0], w_, b_, a.y, workspace_.data());
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    cpu::Conv2dBackward(ctx, Batched(a.batch), a.x[0], w_, a.dy, a.dx[0], a.dx_write[0], dw_, db_,
                        Write::kOverwrite, workspace_.data());
  }

 private:
  kernels::WindowShape Batched(int64_t batch) const {
    kernels::WindowShape s = window_;
    s.batch = batch;
    return s;
  }

  const kernels::WindowShape window_;
  const float* const w_;
  const float* const b_;  // Null without bias.
  float* const dw_;
  float* const db_;
  std::vector<float> workspace_;
};

class PoolLayer : public Layer {
 public:
  PoolLayer(const kernels::WindowShape& window, bool max) : window_(window), max_(max) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    kernels::WindowShape s = window_;
    s.batch = a.batch;
    if (max_) {
      cpu::MaxPoolForward(ctx, s, a.x[0], a.y);
    } else {
      cpu::AvgPoolForward(ctx, s, a.x[0], a.y);
    }
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return;
    kernels::WindowShape s = window_;
    s.batch = a.batch;
    if (max_) {
      cpu::MaxPoolBackward(ctx, s, a.x[0], a.dy, a.dx[0], a.dx_write[0]);
    } else {
      cpu::AvgPoolBackward(ctx, s, a.dy, a.dx[0], a.dx_write[0]);
    }
  }

 private:
  const kernels::WindowShape window_;
  const bool max_;
};

class GlobalAvgPoolLayer : public Layer {
 public:
  GlobalAvgPoolLayer(int64_t spatial, int64_t channels) : spatial_(spatial), channels_(channels) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    cpu::GlobalAvgPoolForward(ctx, a.batch, spatial_, channels_, a.x[0], a.y);
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return;
    cpu::GlobalAvgPoolBackward(ctx, a.batch, spatial_, channels_, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t spatial_, channels_;
};

// Normalises over the last axis; rows = batch * (elements / channels).
class BatchNormLayer : public Layer {
 public:
  BatchNormLayer(int64_t elements, int64_t channels, float momentum, float epsilon,
                 const float* gamma, const float* beta, float* dgamma, float* dbeta,
                 float* running_mean, float* running_var)
      : positions_(elements / channels),
        channels_(channels),
        momentum_(momentum),
        epsilon_(epsilon),
        gamma_(gamma),
        beta_(beta),
        dgamma_(dgamma),
        dbeta_(dbeta),
        running_mean_(running_mean),
        running_var_(running_var),
        save_mean_(channels),
        save_inv_std_(channels) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    const int64_t rows = a.batch * positions_;
    if (a.training) {
      cpu::BatchNormForwardTraining(ctx, rows, channels_, a.x[0], gamma_, beta_, epsilon_,
                                    momentum_, a.y, running_mean_, running_var_, save_mean_.data(),
                                    save_inv_std_.data());
    } else {
      cpu::BatchNormForwardInference(ctx, rows, channels_, a.x[0], gamma_, beta_, running_mean_,
                                     running_var_, epsilon_, a.y);
    }
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    cpu::BatchNormBackward(ctx, a.batch * positions_, channels_, a.x[0], a.dy, gamma_,
                           save_mean_.data(), save_inv_std_.data(), a.dx[0], a.dx_write[0], dgamma_,
                           dbeta_, Write::kOverwrite);
  }

 private:
  const int64_t positions_, channels_;
  const float momentum_, epsilon_;
  const float* const gamma_;
  const float* const beta_;
  float* const dgamma_;
  float* const dbeta_;
  float* const running_mean_;
  float* const running_var_;
  // The last training forward's batch statistics, read by backward.
  std::vector<float> save_mean_, save_inv_std_;
};

class AddLayer : public Layer {
 public:
  explicit AddLayer(int64_t elements) : elements_(elements) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    const int64_t n = a.batch * elements_;
    cpu::Add(ctx, n, a.x[0], a.x[1], a.y);
    for (size_t i = 2; i < a.x.size(); ++i) cpu::Add(ctx, n, a.y, a.x[i], a.y);
  }
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    for (size_t i = 0; i < a.dx.size(); ++i) {
      if (a.dx[i] != nullptr)
        cpu::CopyOrAdd(ctx, a.batch * elements_, a.dy, a.dx[i], a.dx_write[i]);
    }
  }

 private:
  const int64_t elements_;
};

class EmbeddingLayer : public Layer {
 public:
  EmbeddingLayer(int64_t ids_per_example, int64_t vocab, int64_t dim, const float* table,
                 float* dtable)
      : ids_per_example_(ids_per_example),
        vocab_(vocab),
        dim_(dim),
        table_(table),
        dtable_(dtable) {}

  void Forward(const cpu::CpuContext& ctx, const ForwardArgs& a) override {
    cpu::EmbeddingForward(ctx, a.batch * ids_per_example_, vocab_, dim_, a.x[0], table_, a.y);
  }
  // Ids have no gradient: dx is left alone.
  void Backward(const cpu::CpuContext& ctx, const BackwardArgs& a) override {
    cpu::EmbeddingBackward(ctx, a.batch * ids_per_example_, vocab_, dim_, a.x[0], a.dy, dtable_,
                           Write::kOverwrite);
    if (a.dx[0] != nullptr && a.dx_write[0] == Write::kOverwrite) {
      cpu::Zero(ctx, a.batch * ids_per_example_, a.dx[0]);
    }
  }

 private:
  const int64_t ids_per_example_, vocab_, dim_;
  const float* const table_;
  float* const dtable_;
};

}  // namespace
}  // namespace model_internal

namespace {

// Largest tensor the kernels take (BLAS sizes are 32-bit ints).
constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The product of `dims`, or -1 when it exceeds kMaxElements.
int64_t CheckedProduct(const std::vector<int64_t>& dims) {
  int64_t product = 1;
  for (int64_t d : dims) {
    if (d != 0 && product > kMaxElements / d) return -1;
    product *= d;
  }
  return product;
}

// SplitMix64, to give each dropout layer its own mask stream.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

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
                           int64_t out_c, bool pool, kernels::WindowShape* s) {
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
  }
  return "unknown";
}

absl::StatusOr<ModelShape> InferModel(const ModelSpec& spec) {
  ModelShape model;
  if (spec.input_shape_size() == 0) {
    return absl::InvalidArgumentError("model.input_shape is required");
  }
  for (int i = 0; i < spec.input_shape_size(); ++i) {
    if (spec.input_shape(i) <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model.input_shape[%d] must be positive, got %d", i, spec.input_shape(i)));
    }
  }
  model.input_shape.assign(spec.input_shape().begin(), spec.input_shape().end());
  model.input_size = CheckedProduct(model.input_shape);
  if (model.input_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.input_shape ", ShapeString(model.input_shape), " has more than 2^31-1 elements"));
  }
  if (spec.num_classes() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model.num_classes must be positive, got %d", spec.num_classes()));
  }
  model.num_classes = spec.num_classes();
  if (spec.layer_size() == 0) {
    return absl::InvalidArgumentError(
        "model.layer is empty: a model needs at least a softmax_cross_entropy layer");
  }

  std::unordered_map<std::string, int> index_of_name;
  const int last = spec.layer_size() - 1;
  for (int i = 0; i <= last; ++i) {
    const LayerSpec& ls = spec.layer(i);
    LayerShape layer;
    switch (ls.kind_case()) {
      case LayerSpec::kDense:
        layer.kind = LayerKind::kDense;
        break;
      case LayerSpec::kRelu:
        layer.kind = LayerKind::kRelu;
        break;
      case LayerSpec::kFlatten:
        layer.kind = LayerKind::kFlatten;
        break;
      case LayerSpec::kDropout:
        layer.kind = LayerKind::kDropout;
        break;
      case LayerSpec::kSoftmaxCrossEntropy:
        layer.kind = LayerKind::kSoftmaxCrossEntropy;
        break;
      case LayerSpec::kConv2D:
        layer.kind = LayerKind::kConv2d;
        break;
      case LayerSpec::kMaxPool:
        layer.kind = LayerKind::kMaxPool;
        break;
      case LayerSpec::kAvgPool:
        layer.kind = LayerKind::kAvgPool;
        break;
      case LayerSpec::kGlobalAvgPool:
        layer.kind = LayerKind::kGlobalAvgPool;
        break;
      case LayerSpec::kBatchNorm:
        layer.kind = LayerKind::kBatchNorm;
        break;
      case LayerSpec::kAdd:
        layer.kind = LayerKind::kAdd;
        break;
      case LayerSpec::kEmbedding:
        layer.kind = LayerKind::kEmbedding;
        break;
      case LayerSpec::KIND_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrFormat("model.layer[%d]%s: no layer type set", i,
                            ls.name().empty() ? "" : absl::StrCat(" (\"", ls.name(), "\")")));
    }
    const char* kind = LayerKindName(layer.kind);
    layer.name = ls.name().empty() ? absl::StrCat(kind, i) : ls.name();
    const std::string where = absl::StrFormat("model.layer[%d] (\"%s\")", i, layer.name);
    auto error = [&where](auto&&... parts) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
    };

    if (auto it = index_of_name.find(layer.name); it != index_of_name.end()) {
      return error("duplicate layer name (model.layer[", it->second, "] has it too)");
    }
    if (ls.inputs_size() == 0) {
      layer.inputs.push_back(i == 0 ? LayerShape::kModelInput : i - 1);
    }
    for (const std::string& input : ls.inputs()) {
      auto it = index_of_name.find(input);
      if (it == index_of_name.end()) {
        return error("input \"", input, "\" is not an earlier layer");
      }
      layer.inputs.push_back(it->second);
    }
    auto shape_of = [&model](int input) -> const std::vector<int64_t>& {
      return input == LayerShape::kModelInput ? model.input_shape
                                              : model.layers[input].output_shape;
    };
    // Add sums two or more tensors; every other layer type reads one.
    if (layer.kind == LayerKind::kAdd) {
      if (layer.inputs.size() < 2) {
        return error("add takes at least 2 inputs (set inputs), got ", layer.inputs.size());
      }
    } else if (layer.inputs.size() != 1) {
      return error(kind, " takes exactly 1 input, got ", layer.inputs.size());
    }
    const std::vector<int64_t>& in_shape = shape_of(layer.inputs[0]);

    switch (layer.kind) {
      case LayerKind::kDense: {
        const int64_t units = ls.dense().units();
        if (units <= 0) return error("dense.units must be positive, got ", units);
        if (in_shape.size() != 1) {
          return error("dense needs a rank-1 input, got ", ShapeString(in_shape),
                       "; add a flatten layer before it");
        }
        const int64_t in = in_shape[0];
        if (CheckedProduct({in, units}) < 0) {
          return error("dense.units = ", units, " makes a weight of [", in, ", ", units,
                       "], more than 2^31-1 elements");
        }
        layer.units = units;
        layer.output_shape = {units};
        const int32_t weight_id = static_cast<int32_t>(model.params.size());
        model.params.push_back(MakeParam(weight_id, absl::StrCat(layer.name, "/weight"),
                                         {in, units}, ParamInit::kHeUniform, in, units));
        layer.param_ids.push_back(weight_id);
        if (!ls.dense().no_bias()) {
          const int32_t bias_id = weight_id + 1;
          model.params.push_back(MakeParam(bias_id, absl::StrCat(layer.name, "/bias"), {units},
                                           ParamInit::kZeros, in, units));
          layer.param_ids.push_back(bias_id);
        }
        break;
      }
      case LayerKind::kRelu:
        layer.output_shape = in_shape;
        break;
      case LayerKind::kFlatten:
        layer.output_shape = {CheckedProduct(in_shape)};
        break;
      case LayerKind::kDropout: {
        const float rate = ls.dropout().rate();
        if (!(rate >= 0.f && rate < 1.f)) {
          return error("dropout.rate must be in [0, 1), got ", rate);
        }
        layer.dropout_rate = rate;
        layer.output_shape = in_shape;
        break;
      }
      case LayerKind::kConv2d: {
        const Conv2dLayer& conv = ls.conv2d();
        if (conv.filters() <= 0)
          return error("conv2d.filters must be positive, got ", conv.filters());
        if (in_shape.size() != 3) {
          return error("conv2d needs a [height, width, channels] input, got ",
                       ShapeString(in_shape));
        }
        RETURN_IF_ERROR(ResolveWindow(where, "conv2d", in_shape, conv.kernel_size(), conv.stride(),
                                      conv.padding(), conv.explicit_padding(), conv.filters(),
                                      /*pool=*/false, &layer.window));
        const kernels::WindowShape& w = layer.window;
        layer.output_shape = {w.out_h, w.out_w, w.out_c};
        if (CheckedProduct(layer.output_shape) < 0 ||
            CheckedProduct({w.out_c, w.patch_elements()}) < 0) {
          return error("conv2d output ", ShapeString(layer.output_shape),
                       " or weight has more than 2^31-1 elements");
        }
        const int32_t weight_id = static_cast<int32_t>(model.params.size());
        model.params.push_back(MakeParam(weight_id, absl::StrCat(layer.name, "/weight"),
                                         {w.out_c, w.kernel_h, w.kernel_w, w.in_c},
                                         ParamInit::kHeUniform, w.patch_elements(),
                                         w.kernel_h * w.kernel_w * w.out_c));
        layer.param_ids.push_back(weight_id);
        if (!conv.no_bias()) {
          model.params.push_back(MakeParam(weight_id + 1, absl::StrCat(layer.name, "/bias"),
                                           {w.out_c}, ParamInit::kZeros, w.patch_elements(),
                                           w.kernel_h * w.kernel_w * w.out_c));
          layer.param_ids.push_back(weight_id + 1);
        }
        break;
      }
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool: {
        const PoolLayer& pool = layer.kind == LayerKind::kMaxPool ? ls.max_pool() : ls.avg_pool();
        if (in_shape.size() != 3) {
          return error(kind, " needs a [height, width, channels] input, got ",
                       ShapeString(in_shape));
        }
        RETURN_IF_ERROR(ResolveWindow(where, kind, in_shape, pool.window(), pool.stride(),
                                      pool.padding(), pool.explicit_padding(), in_shape[2],
                                      /*pool=*/true, &layer.window));
        layer.output_shape = {layer.window.out_h, layer.window.out_w, layer.window.out_c};
        break;
      }
      case LayerKind::kGlobalAvgPool:
        if (in_shape.size() != 3) {
          return error("global_avg_pool needs a [height, width, channels] input, got ",
                       ShapeString(in_shape));
        }
        layer.output_shape = {in_shape[2]};
        break;
      case LayerKind::kBatchNorm: {
        const BatchNormLayer& bn = ls.batch_norm();
        layer.bn_momentum = bn.momentum() == 0.f ? 0.99f : bn.momentum();
        layer.bn_epsilon = bn.epsilon() == 0.f ? 1e-3f : bn.epsilon();
        if (!(layer.bn_momentum > 0.f && layer.bn_momentum < 1.f)) {
          return error("batch_norm.momentum must be in (0, 1), got ", bn.momentum());
        }
        if (!(layer.bn_epsilon >= 1e-5f && std::isfinite(layer.bn_epsilon))) {
          return error("batch_norm.epsilon must be at least 1e-5, got ", bn.epsilon());
        }
        const int64_t channels = in_shape.back();
        layer.output_shape = in_shape;
        const int32_t gamma_id = static_cast<int32_t>(model.params.size());
        model.params.push_back(MakeParam(gamma_id, absl::StrCat(layer.name, "/gamma"), {channels},
                                         ParamInit::kOnes, channels, channels));
        model.params.push_back(MakeParam(gamma_id + 1, absl::StrCat(layer.name, "/beta"),
                                         {channels}, ParamInit::kZeros, channels, channels));
        layer.param_ids = {gamma_id, gamma_id + 1};
        const int32_t mean_id = static_cast<int32_t>(model.local_state.size());
        model.local_state.push_back(MakeParam(mean_id, absl::StrCat(layer.name, "/running_mean"),
                                              {channels}, ParamInit::kZeros, channels, channels));
        model.local_state.push_back(MakeParam(mean_id + 1, absl::StrCat(layer.name, "/running_var"),
                                              {channels}, ParamInit::kOnes, channels, channels));
        layer.local_state_ids = {mean_id, mean_id + 1};
        break;
      }
      case LayerKind::kAdd:
        for (size_t k = 1; k < layer.inputs.size(); ++k) {
          if (shape_of(layer.inputs[k]) != in_shape) {
            return error("add inputs must have the same shape; \"", ls.inputs(0), "\" is ",
                         ShapeString(in_shape), " but \"", ls.inputs(k), "\" is ",
                         ShapeString(shape_of(layer.inputs[k])));
          }
        }
        layer.output_shape = in_shape;
        break;
      case LayerKind::kEmbedding: {
        const EmbeddingLayer& emb = ls.embedding();
        if (emb.vocab_size() <= 0) {
          return error("embedding.vocab_size must be positive, got ", emb.vocab_size());
        }
        if (emb.dim() <= 0) return error("embedding.dim must be positive, got ", emb.dim());
        layer.vocab_size = emb.vocab_size();
        layer.embedding_dim = emb.dim();
        layer.output_shape = in_shape;
        layer.output_shape.push_back(emb.dim());
        if (CheckedProduct(layer.output_shape) < 0 ||
            CheckedProduct({layer.vocab_size, layer.embedding_dim}) < 0) {
          return error("embedding output ", ShapeString(layer.output_shape),
                       " or table has more than 2^31-1 elements");
        }
        const int32_t table_id = static_cast<int32_t>(model.params.size());
        model.params.push_back(MakeParam(
            table_id, absl::StrCat(layer.name, "/table"), {layer.vocab_size, layer.embedding_dim},
            ParamInit::kGlorotUniform, layer.vocab_size, layer.embedding_dim));
        layer.param_ids.push_back(table_id);
        break;
      }
      case LayerKind::kSoftmaxCrossEntropy:
        if (i != last) {
          return error("softmax_cross_entropy must be the last layer (model.layer[", last,
                       "] follows it)");
        }
        if (in_shape != std::vector<int64_t>{model.num_classes}) {
          return error("softmax_cross_entropy expects [num_classes=", model.num_classes,
                       "] logits, got ", ShapeString(in_shape));
        }
        break;
    }
    if (i == last && layer.kind != LayerKind::kSoftmaxCrossEntropy) {
      return error("the last layer must be softmax_cross_entropy, got ", kind);
    }
    index_of_name.emplace(layer.name, i);
    model.layers.push_back(std::move(layer));
  }
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec, uint64_t seed) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec));
  return std::unique_ptr<Model>(new Model(std::move(shape), seed));
}

Model::Model(ModelShape shape, uint64_t seed) : shape_(std::move(shape)), seed_(seed) {
  using model_internal::Buffer;
  params_.resize(shape_.params.size());
  grads_.resize(shape_.params.size());
  for (const ParamInfo& p : shape_.params) {
    params_[p.id].resize(p.num_elements);
    InitParamRange(p, seed_, 0, p.num_elements, params_[p.id].data());
    grads_[p.id].assign(p.num_elements, 0.f);
  }
  local_state_.resize(shape_.local_state.size());
  for (const ParamInfo& p : shape_.local_state) {
    local_state_[p.id].resize(p.num_elements);
    InitParamRange(p, seed_, 0, p.num_elements, local_state_[p.id].data());
  }

  buffers_.emplace_back();
  buffers_[0].elements = shape_.input_size;
  for (size_t i = 0; i < shape_.layers.size(); ++i) {
    const LayerShape& layer = shape_.layers[i];
    const int input = layer.inputs[0];
    const int in_buffer = input == LayerShape::kModelInput ? 0 : buffer_of_layer_[input];
    const int64_t elements = CheckedProduct(layer.output_shape);
    int buffer = -1;
    if (layer.kind == LayerKind::kFlatten) {
      buffer = in_buffer;
    } else if (layer.kind != LayerKind::kSoftmaxCrossEntropy) {
      buffer = static_cast<int>(buffers_.size());
      buffers_.emplace_back();
      buffers_.back().elements = elements;
    }
    buffer_of_layer_.push_back(buffer);

    std::unique_ptr<model_internal::Layer> impl;
    switch (layer.kind) {
      case LayerKind::kDense: {
        const int64_t in = shape_.params[layer.param_ids[0]].shape[0];
        const bool has_bias = layer.param_ids.size() > 1;
        impl = std::make_unique<model_internal::DenseLayer>(
            in, layer.units, param(layer.param_ids[0]),
            has_bias ? param(layer.param_ids[1]) : nullptr, grad(layer.param_ids[0]),
            has_bias ? grad(layer.param_ids[1]) : nullptr);
        break;
      }
      case LayerKind::kRelu:
        impl = std::make_unique<model_internal::ReluLayer>(elements);
        break;
      case LayerKind::kFlatten:
        impl = std::make_unique<model_internal::FlattenLayer>();
        break;
      case LayerKind::kDropout:
        impl = std::make_unique<model_internal::DropoutLayer>(elements, layer.dropout_rate,
                                                              Mix(seed_ ^ Mix(i + 1)));
        break;
      case LayerKind::kSoftmaxCrossEntropy:
        impl = std::make_unique<model_internal::SoftmaxCrossEntropyLayer>(shape_.num_classes);
        break;
      case LayerKind::kConv2d: {
        const bool has_bias = layer.param_ids.size() > 1;
        impl = std::make_unique<model_internal::Conv2dLayer>(
            layer.window, param(layer.param_ids[0]), has_bias ? param(layer.param_ids[1]) : nullptr,
            grad(layer.param_ids[0]), has_bias ? grad(layer.param_ids[1]) : nullptr);
        break;
      }
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
        impl = std::make_unique<model_internal::PoolLayer>(layer.window,
                                                           layer.kind == LayerKind::kMaxPool);
        break;
      case LayerKind::kGlobalAvgPool: {
        const std::vector<int64_t>& in = input == LayerShape::kModelInput
                                             ? shape_.input_shape
                                             : shape_.layers[input].output_shape;
        impl = std::make_unique<model_internal::GlobalAvgPoolLayer>(in[0] * in[1], in[2]);
        break;
      }
      case LayerKind::kBatchNorm:
        impl = std::make_unique<model_internal::BatchNormLayer>(
            elements, layer.output_shape.back(), layer.bn_momentum, layer.bn_epsilon,
            param(layer.param_ids[0]), param(layer.param_ids[1]), grad(layer.param_ids[0]),
            grad(layer.param_ids[1]), local_state_data(layer.local_state_ids[0]),
            local_state_data(layer.local_state_ids[1]));
        break;
      case LayerKind::kAdd:
        impl = std::make_unique<model_internal::AddLayer>(elements);
        break;
      case LayerKind::kEmbedding:
        impl = std::make_unique<model_internal::EmbeddingLayer>(
            elements / layer.embedding_dim, layer.vocab_size, layer.embedding_dim,
            param(layer.param_ids[0]), grad(layer.param_ids[0]));
        break;
    }
    layers_.push_back(std::move(impl));
  }
}

Model::~Model() = default;

absl::Status Model::CheckBatch(const float* features, const int32_t* labels, int64_t batch) const {
  if (batch <= 0)
    return absl::InvalidArgumentError(absl::StrCat("batch must be positive, got ", batch));
  if (features == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("features and labels must not be null");
  }
  int64_t widest = 0;
  for (const model_internal::Buffer& b : buffers_) widest = std::max(widest, b.elements);
  if (batch > kMaxElements / std::max<int64_t>(widest, shape_.num_classes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " examples is too large for this model"));
  }
  for (int64_t i = 0; i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= shape_.num_classes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("labels[%d] = %d is outside [0, %d)", i, labels[i], shape_.num_classes));
    }
  }
  // Ids read straight from the features; an embedding fed by another layer
  // reads an id that is not in its table as zeros.
  for (const LayerShape& layer : shape_.layers) {
    if (layer.kind != LayerKind::kEmbedding || layer.inputs[0] != LayerShape::kModelInput) {
      continue;
    }
    for (int64_t i = 0; i < batch * shape_.input_size; ++i) {
      if (kernels::cpu::EmbeddingRow(features[i], layer.vocab_size) < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "features[%d] = %g is not an id of embedding \"%s\" (an integer in [0, %d))", i,
            features[i], layer.name, layer.vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

void Model::Reserve(int64_t batch) {
  if (batch <= capacity_) return;
  for (size_t b = 1; b < buffers_.size(); ++b) {
    buffers_[b].value.resize(batch * buffers_[b].elements);
    buffers_[b].grad.resize(batch * buffers_[b].elements);
  }
  for (auto& layer : layers_) layer->Reserve(batch);
  capacity_ = batch;
}

const float* Model::Activation(int buffer, const float* features) const {
  return buffer == 0 ? features : buffers_[buffer].value.data();
}

void Model::Forward(const float* features, const int32_t* labels, int64_t batch, bool training,
                    int64_t step, kernels::LossStats* loss) {
  model_internal::ForwardArgs args;
  args.batch = batch;
  args.training = training;
  args.step = static_cast<uint64_t>(step);
  args.labels = labels;
  args.loss = loss;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->aliases_input()) continue;
    args.x.clear();
    for (int input : shape_.layers[i].inputs) {
      args.x.push_back(
          Activation(input == LayerShape::kModelInput ? 0 : buffer_of_layer_[input], features));
    }
    const int out = buffer_of_layer_[i];
    args.y = out > 0 ? buffers_[out].value.data() : nullptr;
    layers_[i]->Forward(ctx_, args);
  }
}

void Model::Backward(const float* features, int64_t batch) {
  // A buffer's gradient is overwritten by the first layer that contributes to
  // it (in reverse order) and added to by the others.
  std::vector<bool> written(buffers_.size(), false);
  model_internal::BackwardArgs args;
  args.batch = batch;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    if (layers_[i]->aliases_input()) continue;
    const int out = buffer_of_layer_[i];
    args.y = nullptr;
    args.dy = nullptr;
    if (out > 0) {
      model_internal::Buffer& b = buffers_[out];
      if (!written[out]) {
        // Nothing reads this output: its gradient is zero.
        kernels::cpu::Zero(ctx_, batch * b.elements, b.grad.data());
        written[out] = true;
      }
      args.y = b.value.data();
      args.dy = b.grad.data();
    }
    args.x.clear();
    args.dx.clear();
    args.dx_write.clear();
    for (int input : shape_.layers[i].inputs) {
      const int in = input == LayerShape::kModelInput ? 0 : buffer_of_layer_[input];
      args.x.push_back(Activation(in, features));
      args.dx.push_back(in > 0 ? buffers_[in].grad.data() : nullptr);
      args.dx_write.push_back(written[in] ? kernels::Write::kAccumulate
                                          : kernels::Write::kOverwrite);
      written[in] = true;
    }
    layers_[i]->Backward(ctx_, args);
  }
}

absl::StatusOr<StepResult> Model::TrainStep(const float* features, const int32_t* labels,
                                            int64_t batch, int64_t step) {
  RETURN_IF_ERROR(CheckBatch(features, labels, batch));
  Reserve(batch);
  kernels::LossStats loss;
  Forward(features, labels, batch, /*training=*/true, step, &loss);
  Backward(features, batch);
  return StepResult{loss.loss_sum / static_cast<double>(batch), loss.correct};
}

absl::StatusOr<EvalResult> Model::Evaluate(const float* features, const int32_t* labels,
                                           int64_t batch) {
  RETURN_IF_ERROR(CheckBatch(features, labels, batch));
  Reserve(batch);
  kernels::LossStats loss;
  Forward(features, labels, batch, /*training=*/false, /*step=*/0, &loss);
  return EvalResult{loss.loss_sum, loss.correct};
}

}  // namespace downpour
