#include "model/layers.h"

#include <utility>

#include "common/splitmix64.h"
#include "common/status.h"

namespace downpour {
namespace model_internal {
namespace {

class DenseLayer : public Layer {
 public:
  DenseLayer(int64_t in, int64_t out, const float* w, const float* b, float* dw, float* db)
      : in_(in), out_(out), w_(w), b_(b), dw_(dw), db_(db) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    return ops.DenseForward(a.batch, in_, out_, a.x[0], w_, b_, a.y);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    return ops.DenseBackward(a.batch, in_, out_, a.x[0], w_, a.dy, a.dx[0], a.dx_write[0], dw_, db_,
                             a.param_write);
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

  void ForwardDoneByInput() override { forward_fused_ = true; }
  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    if (forward_fused_) return absl::OkStatus();
    return ops.ReluForward(a.batch * elements_, a.x[0], a.y);
  }
  // From the output (y > 0 exactly where x > 0), so the forward may run in
  // place.
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.ReluBackward(a.batch * elements_, a.y, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t elements_;
  bool forward_fused_ = false;
};

class FlattenLayer : public Layer {
 public:
  bool aliases_input() const override { return true; }
  absl::Status Forward(ComputeBackend&, const ForwardArgs&) override { return absl::OkStatus(); }
  absl::Status Backward(ComputeBackend&, const BackwardArgs&) override { return absl::OkStatus(); }
};

class DropoutLayer : public Layer {
 public:
  DropoutLayer(int64_t elements, float rate, uint64_t seed)
      : elements_(elements), rate_(rate), seed_(seed) {}

  absl::Status Reserve(ComputeBackend& ops, int64_t batch) override {
    ASSIGN_OR_RETURN(mask_, ops.Allocate(batch * elements_));
    return absl::OkStatus();
  }
  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    const int64_t n = a.batch * elements_;
    if (a.training) {
      return ops.DropoutForward(n, rate_, seed_, a.step, a.x[0], a.y, mask_.as<uint8_t>());
    }
    return ops.CopyOrAdd(n, a.x[0], a.y, kernels::Write::kOverwrite);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.DropoutBackward(a.batch * elements_, rate_, mask_.as<uint8_t>(), a.dy, a.dx[0],
                               a.dx_write[0]);
  }

 private:
  const int64_t elements_;
  const float rate_;
  const uint64_t seed_;
  kernels::DeviceMemory mask_;
};

class SoftmaxCrossEntropyLayer : public Layer {
 public:
  explicit SoftmaxCrossEntropyLayer(int64_t classes) : classes_(classes) {}

  absl::Status Reserve(ComputeBackend& ops, int64_t batch) override {
    ASSIGN_OR_RETURN(dlogits_, ops.Allocate(ops.activation_bytes() * batch * classes_));
    return absl::OkStatus();
  }
  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    return ops.SoftmaxCrossEntropy(a.batch, classes_, a.x[0], a.labels,
                                   a.training ? Act(dlogits_.as<void>()) : nullptr, a.loss_scale);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.CopyOrAdd(a.batch * classes_, Act(dlogits_.as<void>()), a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t classes_;
  kernels::DeviceMemory dlogits_;  // Written by a training forward, read by backward.
};

WindowShape Batched(WindowShape s, int64_t batch) {
  s.batch = batch;
  return s;
}

class Conv2dLayer : public Layer {
 public:
  Conv2dLayer(const WindowShape& window, const float* w, const float* b, float* dw, float* db)
      : window_(window), w_(w), b_(b), dw_(dw), db_(db) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    return ops.Conv2dForward(Batched(window_, a.batch), a.x[0], w_, b_, a.y, fused_relu_);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    return ops.Conv2dBackward(Batched(window_, a.batch), a.x[0], w_, a.dy, a.dx[0], a.dx_write[0],
                              dw_, db_, a.param_write);
  }

  bool FuseFollowingRelu() override {
    fused_relu_ = true;
    return true;
  }

 private:
  const WindowShape window_;
  const float* const w_;
  const float* const b_;  // Null without bias.
  float* const dw_;
  float* const db_;
  bool fused_relu_ = false;
};

class PoolLayer : public Layer {
 public:
  PoolLayer(const WindowShape& window, bool max) : window_(window), max_(max) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    const WindowShape s = Batched(window_, a.batch);
    return max_ ? ops.MaxPoolForward(s, a.x[0], a.y) : ops.AvgPoolForward(s, a.x[0], a.y);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    const WindowShape s = Batched(window_, a.batch);
    return max_ ? ops.MaxPoolBackward(s, a.x[0], a.dy, a.dx[0], a.dx_write[0])
                : ops.AvgPoolBackward(s, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const WindowShape window_;
  const bool max_;
};

class GlobalAvgPoolLayer : public Layer {
 public:
  GlobalAvgPoolLayer(int64_t spatial, int64_t channels) : spatial_(spatial), channels_(channels) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    return ops.GlobalAvgPoolForward(a.batch, spatial_, channels_, a.x[0], a.y);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.GlobalAvgPoolBackward(a.batch, spatial_, channels_, a.dy, a.dx[0], a.dx_write[0]);
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
        running_var_(running_var) {}

  absl::Status Reserve(ComputeBackend& ops, int64_t /*batch*/) override {
    if (saved_.bytes() != 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(saved_, ops.Allocate(2 * sizeof(float) * channels_));
    return absl::OkStatus();
  }
  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    const int64_t rows = a.batch * positions_;
    if (a.training) {
      return ops.BatchNormForwardTraining(rows, channels_, a.x[0], gamma_, beta_, epsilon_,
                                          momentum_, a.y, running_mean_, running_var_, save_mean(),
                                          save_inv_std());
    }
    return ops.BatchNormForwardInference(rows, channels_, a.x[0], gamma_, beta_, running_mean_,
                                         running_var_, epsilon_, a.y);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    return ops.BatchNormBackward(a.batch * positions_, channels_, a.x[0], a.dy, gamma_, save_mean(),
                                 save_inv_std(), a.dx[0], a.dx_write[0], dgamma_, dbeta_,
                                 a.param_write);
  }

 private:
  float* save_mean() const { return saved_.as<float>(); }
  float* save_inv_std() const { return saved_.as<float>() + channels_; }

  const int64_t positions_, channels_;
  const float momentum_, epsilon_;
  const float* const gamma_;
  const float* const beta_;
  float* const dgamma_;
  float* const dbeta_;
  float* const running_mean_;
  float* const running_var_;
  // The last training forward's batch mean and inverse std, read by backward.
  kernels::DeviceMemory saved_;
};

class AddLayer : public Layer {
 public:
  explicit AddLayer(int64_t elements) : elements_(elements) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    const int64_t n = a.batch * elements_;
    RETURN_IF_ERROR(ops.Add(n, a.x[0], a.x[1], a.y));
    for (size_t i = 2; i < a.x.size(); ++i) RETURN_IF_ERROR(ops.Add(n, a.y, a.x[i], a.y));
    return absl::OkStatus();
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    for (size_t i = 0; i < a.dx.size(); ++i) {
      if (a.dx[i] != nullptr) {
        RETURN_IF_ERROR(ops.CopyOrAdd(a.batch * elements_, a.dy, a.dx[i], a.dx_write[i]));
      }
    }
    return absl::OkStatus();
  }

 private:
  const int64_t elements_;
};

class ConcatLayer : public Layer {
 public:
  // rows: examples times the product of every axis but the last.
  ConcatLayer(int64_t rows_per_example, std::vector<int64_t> widths)
      : rows_per_example_(rows_per_example), widths_(std::move(widths)) {
    for (int64_t w : widths_) width_ += w;
  }

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    const int64_t rows = a.batch * rows_per_example_;
    int64_t offset = 0;
    for (size_t k = 0; k < widths_.size(); ++k) {
      RETURN_IF_ERROR(ops.CopyBlock(rows, widths_[k], a.x[k], widths_[k], 0, a.y, width_, offset,
                                    kernels::Write::kOverwrite));
      offset += widths_[k];
    }
    return absl::OkStatus();
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    const int64_t rows = a.batch * rows_per_example_;
    int64_t offset = 0;
    for (size_t k = 0; k < widths_.size(); ++k) {
      if (a.dx[k] != nullptr) {
        RETURN_IF_ERROR(ops.CopyBlock(rows, widths_[k], a.dy, width_, offset, a.dx[k], widths_[k],
                                      0, a.dx_write[k]));
      }
      offset += widths_[k];
    }
    return absl::OkStatus();
  }

 private:
  const int64_t rows_per_example_;
  const std::vector<int64_t> widths_;
  int64_t width_ = 0;
};

// DLRM's interaction: the k inputs ([dim] each) packed into one [batch, k,
// dim] scratch, every pair's dot product out; backward unpacks the packed
// gradient into each input's.
class DotInteractionLayer : public Layer {
 public:
  DotInteractionLayer(int64_t vectors, int64_t dim) : vectors_(vectors), dim_(dim) {}

  absl::Status Reserve(ComputeBackend& ops, int64_t batch) override {
    const size_t bytes = ops.activation_bytes() * batch * vectors_ * dim_;
    ASSIGN_OR_RETURN(packed_, ops.Allocate(bytes));
    ASSIGN_OR_RETURN(dpacked_, ops.Allocate(bytes));
    return absl::OkStatus();
  }
  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    RETURN_IF_ERROR(Pack(ops, a.batch, a.x));
    return ops.PairwiseDotForward(a.batch, vectors_, dim_, kernels::Act(packed_.as<void>()), a.y);
  }
  // Packs the inputs again (several micro-batches may be in flight between
  // a forward and its backward; the inputs are kept, the scratch is not).
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    RETURN_IF_ERROR(Pack(ops, a.batch, a.x));
    const kernels::Act packed(packed_.as<void>()), dpacked(dpacked_.as<void>());
    RETURN_IF_ERROR(ops.PairwiseDotBackward(a.batch, vectors_, dim_, packed, a.dy, dpacked));
    for (int64_t i = 0; i < vectors_; ++i) {
      if (a.dx[i] == nullptr) continue;
      RETURN_IF_ERROR(ops.CopyBlock(a.batch, dim_, dpacked, vectors_ * dim_, i * dim_, a.dx[i],
                                    dim_, 0, a.dx_write[i]));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Pack(ComputeBackend& ops, int64_t batch, const std::vector<Act>& x) {
    for (int64_t i = 0; i < vectors_; ++i) {
      RETURN_IF_ERROR(ops.CopyBlock(batch, dim_, x[i], dim_, 0, kernels::Act(packed_.as<void>()),
                                    vectors_ * dim_, i * dim_, kernels::Write::kOverwrite));
    }
    return absl::OkStatus();
  }

  const int64_t vectors_, dim_;
  kernels::DeviceMemory packed_, dpacked_;
};

// A sparse embedding's pooled rows, which the worker wrote into the layer's
// model-input slot: forward copies them to the output, backward hands the
// gradient to the slot of the input gradient (Model::input_grad), from which
// the worker derives the rows' gradients.
class SparseEmbeddingLayer : public Layer {
 public:
  explicit SparseEmbeddingLayer(int64_t dim) : dim_(dim) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    return ops.CopyOrAdd(a.batch * dim_, a.x[0], a.y, kernels::Write::kOverwrite);
  }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    if (a.dx[0] == nullptr) return absl::OkStatus();
    return ops.CopyOrAdd(a.batch * dim_, a.dy, a.dx[0], a.dx_write[0]);
  }

 private:
  const int64_t dim_;
};

class EmbeddingLayer : public Layer {
 public:
  // `ids_from_input`: the ids are the model input (read as given, never in
  // a reduced activation type); otherwise a float activation.
  EmbeddingLayer(int64_t ids_per_example, int64_t vocab, int64_t dim, const float* table,
                 float* dtable, bool ids_from_input)
      : ids_per_example_(ids_per_example),
        vocab_(vocab),
        dim_(dim),
        table_(table),
        dtable_(dtable),
        ids_from_input_(ids_from_input) {}

  absl::Status Forward(ComputeBackend& ops, const ForwardArgs& a) override {
    const float* ids = ids_from_input_ ? a.model_input : a.x[0];
    return ops.EmbeddingForward(a.batch * ids_per_example_, vocab_, dim_, ids, table_, a.y);
  }
  // Ids have no gradient: dx is left alone.
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    const float* ids = ids_from_input_ ? a.model_input : a.x[0];
    RETURN_IF_ERROR(ops.EmbeddingBackward(a.batch * ids_per_example_, vocab_, dim_, ids, a.dy,
                                          dtable_, a.param_write));
    if (a.dx[0] != nullptr && a.dx_write[0] == kernels::Write::kOverwrite) {
      return ops.Zero(a.batch * ids_per_example_, a.dx[0]);
    }
    return absl::OkStatus();
  }

 private:
  const int64_t ids_per_example_, vocab_, dim_;
  const float* const table_;
  float* const dtable_;
  const bool ids_from_input_;
};

// A pipeline stage's boundary (LayerKind::kStageOutput): its inputs leave
// for later stages after forward, which does nothing; backward hands each
// input the gradient that came back for it (BackwardArgs::stage_output_grad,
// one [batch, width] block per input).
class StageOutputLayer : public Layer {
 public:
  explicit StageOutputLayer(std::vector<int64_t> widths) : widths_(std::move(widths)) {}

  absl::Status Forward(ComputeBackend&, const ForwardArgs&) override { return absl::OkStatus(); }
  absl::Status Backward(ComputeBackend& ops, const BackwardArgs& a) override {
    const char* received = a.stage_output_grad;
    for (size_t k = 0; k < widths_.size(); ++k) {
      const int64_t n = a.batch * widths_[k];
      if (a.dx[k] != nullptr) {
        RETURN_IF_ERROR(ops.CopyOrAdd(n, Act(received), a.dx[k], a.dx_write[k]));
      }
      received += n * ops.activation_bytes();
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<int64_t> widths_;  // Elements per example of each input.
};

const std::vector<int64_t>& InputShape(const ModelShape& shape, int input) {
  return input < 0 ? shape.input_slots[LayerShape::SlotOf(input)].shape
                   : shape.layers[input].output_shape;
}

}  // namespace

std::unique_ptr<Layer> MakeLayer(const ModelShape& shape, size_t index, uint64_t seed,
                                 const LayerTensors& tensors, int64_t mask_index) {
  if (mask_index < 0) mask_index = static_cast<int64_t>(index);
  const LayerShape& layer = shape.layers[index];
  const int64_t elements = CheckedProduct(layer.output_shape);
  auto p = [&](size_t k) { return k < tensors.params.size() ? tensors.params[k] : nullptr; };
  auto g = [&](size_t k) { return k < tensors.grads.size() ? tensors.grads[k] : nullptr; };
  switch (layer.kind) {
    case LayerKind::kDense: {
      const int64_t in = shape.params[layer.param_ids[0]].shape[0];
      return std::make_unique<DenseLayer>(in, layer.units, p(0), p(1), g(0), g(1));
    }
    case LayerKind::kRelu:
      return std::make_unique<ReluLayer>(elements);
    case LayerKind::kFlatten:
      return std::make_unique<FlattenLayer>();
    case LayerKind::kDropout:
      return std::make_unique<DropoutLayer>(elements, layer.dropout_rate,
                                            SplitMix64(seed ^ SplitMix64(mask_index + 1)));
    case LayerKind::kSoftmaxCrossEntropy:
      return std::make_unique<SoftmaxCrossEntropyLayer>(shape.num_classes);
    case LayerKind::kConv2d:
      return std::make_unique<Conv2dLayer>(layer.window, p(0), p(1), g(0), g(1));
    case LayerKind::kMaxPool:
    case LayerKind::kAvgPool:
      return std::make_unique<PoolLayer>(layer.window, layer.kind == LayerKind::kMaxPool);
    case LayerKind::kGlobalAvgPool: {
      const std::vector<int64_t>& in = InputShape(shape, layer.inputs[0]);
      return std::make_unique<GlobalAvgPoolLayer>(in[0] * in[1], in[2]);
    }
    case LayerKind::kBatchNorm:
      return std::make_unique<BatchNormLayer>(elements, layer.output_shape.back(),
                                              layer.bn_momentum, layer.bn_epsilon, p(0), p(1), g(0),
                                              g(1), tensors.state[0], tensors.state[1]);
    case LayerKind::kAdd:
      return std::make_unique<AddLayer>(elements);
    case LayerKind::kEmbedding:
      if (layer.sparse_table >= 0) {
        return std::make_unique<SparseEmbeddingLayer>(layer.embedding_dim);
      }
      return std::make_unique<EmbeddingLayer>(elements / layer.embedding_dim, layer.vocab_size,
                                              layer.embedding_dim, p(0), g(0), layer.inputs[0] < 0);
    case LayerKind::kDotInteraction:
      return std::make_unique<DotInteractionLayer>(static_cast<int64_t>(layer.inputs.size()),
                                                   InputShape(shape, layer.inputs[0]).back());
    case LayerKind::kConcat: {
      std::vector<int64_t> widths;
      for (int input : layer.inputs) widths.push_back(InputShape(shape, input).back());
      return std::make_unique<ConcatLayer>(elements / layer.output_shape.back(), std::move(widths));
    }
    case LayerKind::kStageOutput: {
      std::vector<int64_t> widths;
      for (int input : layer.inputs) widths.push_back(CheckedProduct(InputShape(shape, input)));
      return std::make_unique<StageOutputLayer>(std::move(widths));
    }
  }
  return nullptr;
}

}  // namespace model_internal
}  // namespace downpour
