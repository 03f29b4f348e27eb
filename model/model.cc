#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "kernels/factory.h"
#include "model/arena.h"
#include "model/devices.h"
#include "model/layers.h"
#include "model/model_storage.h"
#include "model/precision.h"

namespace downpour {
namespace {

// Says why the model computes in fp32 though `options` asked for another
// precision: a job's user reads it in the job's log.
void LogPrecisionChange(const ModelOptions& options, absl::string_view why) {
  Log(options.job_id.empty() ? std::string(why) : absl::StrCat("job ", options.job_id, ": ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec, uint64_t seed,
                                                     const ModelOptions& options) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec));
  return CreateFromShape(std::move(shape), seed, options, StageOptions());
}

absl::StatusOr<std::unique_ptr<Model>> Model::CreateStage(ModelShape shape, uint64_t seed,
                                                          const ModelOptions& options,
                                                          const StageOptions& stage) {
  if (stage.activation_sets < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stage needs activation_sets >= 1, got ", stage.activation_sets));
  }
  if (!stage.init_params.empty() && stage.init_params.size() != shape.params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a stage of ", shape.params.size(),
                                                   " parameters was given ",
                                                   stage.init_params.size(), " to initialise"));
  }
  return CreateFromShape(std::move(shape), seed, options, stage);
}

absl::StatusOr<std::unique_ptr<Model>> Model::CreateFromShape(ModelShape shape, uint64_t seed,
                                                              const ModelOptions& options,
                                                              StageOptions stage) {
  ASSIGN_OR_RETURN(std::string name, DescribeDevice(options.device));
  Precision precision = options.precision;
  if (!Precision_IsValid(precision)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown precision ", precision));
  }
  if (options.device < 0) {
    // FP32 allows TF32 and FP32_STRICT forbids it: the CPU's full fp32
    // satisfies both.
    if (precision != FP32 && precision != FP32_STRICT) {
      LogPrecisionChange(options, absl::StrCat("model on the cpu: precision ",
                                               Precision_Name(precision), " runs in fp32 there"));
    }
    precision = FP32;
  } else {
    // An embedding's ids are floats; fed by another layer they would be
    // activations, which a reduced type cannot hold exactly.
    if (IsReducedPrecision(precision) && !shape.sparse_tables.empty()) {
      LogPrecisionChange(options,
                         absl::StrCat("model: sparse embeddings exchange their pooled rows in "
                                      "fp32; precision ",
                                      Precision_Name(precision), " runs in fp32"));
      precision = FP32;
    }
    for (const LayerShape& layer : shape.layers) {
      if (IsReducedPrecision(precision) && layer.kind == LayerKind::kEmbedding &&
          layer.inputs[0] >= 0) {
        LogPrecisionChange(options, absl::StrCat("model: embedding \"", layer.name,
                                                 "\" reads ids from another layer; precision ",
                                                 Precision_Name(precision), " runs in fp32"));
        precision = FP32;
      }
    }
  }
  kernels::BackendOptions backend_options;
  backend_options.device = options.device;
  backend_options.conv_layout = options.conv_layout;
  backend_options.conv_graph = options.conv_graph;
  const GpuPrecision gpu_precision = GpuPrecisionOf(precision);
  backend_options.precision = gpu_precision.compute;
  backend_options.tf32 = gpu_precision.tf32;
  backend_options.memory_limit = options.memory_limit;
  backend_options.shared_caps = options.memory_caps;
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::ComputeBackend> backend,
                   kernels::CreateBackend(backend_options));
  if (!(options.initial_loss_scale >= 1.0) || !std::isfinite(options.initial_loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial loss scale must be finite and >= 1, got ", options.initial_loss_scale));
  }
  std::unique_ptr<Model> model(new Model(std::move(shape), seed, std::max(options.device, -1),
                                         std::move(name), precision, options.initial_loss_scale,
                                         std::move(stage)));
  RETURN_IF_ERROR(model->Init(std::move(backend)));
  return model;
}

namespace {

// The index of `shape`'s kStageOutput layer (its last), or -1.
int OutputLayerOf(const ModelShape& shape) {
  if (shape.layers.empty() || shape.layers.back().kind != LayerKind::kStageOutput) return -1;
  return static_cast<int>(shape.layers.size()) - 1;
}

}  // namespace

Model::Model(ModelShape shape, uint64_t seed, int device, std::string device_name,
             Precision precision, double initial_loss_scale, StageOptions stage)
    : shape_(std::move(shape)),
      stage_(std::move(stage)),
      output_layer_(OutputLayerOf(shape_)),
      seed_(seed),
      device_(device),
      device_name_(std::move(device_name)),
      precision_(precision),
      loss_scaling_(precision == FP16),
      loss_scale_(initial_loss_scale),
      storage_(std::make_unique<model_internal::Storage>()) {}

absl::Status Model::RestoreLocalState(double loss_scale) {
  if (loss_scaling_ && loss_scale > 0) loss_scale_.Restore(loss_scale);
  if (state_host_ == state_compute_) return absl::OkStatus();
  RETURN_IF_ERROR(backend_->ToDevice(state_compute_, state_host_, sizeof(float) * state_total_));
  return backend_->Synchronize();
}

absl::Status Model::Init(std::unique_ptr<kernels::ComputeBackend> backend) {
  using model_internal::Buffer;
  backend_ = std::move(backend);
  model_internal::Storage& st = *storage_;
  const bool gpu = backend_->gpu();
  int64_t& param_total = param_total_;
  int64_t& state_total = state_total_;
  for (const ParamInfo& p : shape_.params) {
    param_offset_.push_back(param_total);
    param_total += p.num_elements;
  }
  for (const ParamInfo& p : shape_.local_state) {
    state_offset_.push_back(state_total);
    state_total += p.num_elements;
  }
  const size_t param_bytes = sizeof(float) * param_total;
  const size_t state_bytes = sizeof(float) * state_total;
  ASSIGN_OR_RETURN(st.params, backend_->Allocate(param_bytes));
  ASSIGN_OR_RETURN(st.grads, backend_->Allocate(param_bytes));
  ASSIGN_OR_RETURN(st.state, backend_->Allocate(state_bytes));
  param_compute_ = st.params.as<float>();
  grad_compute_ = st.grads.as<float>();
  state_compute_ = st.state.as<float>();
  if (gpu) {
    ASSIGN_OR_RETURN(st.params_host, backend_->AllocateHost(param_bytes));
    ASSIGN_OR_RETURN(st.grads_host, backend_->AllocateHost(param_bytes));
    ASSIGN_OR_RETURN(st.state_host, backend_->AllocateHost(state_bytes));
    param_host_ = st.params_host.as<float>();
    grad_host_ = st.grads_host.as<float>();
    state_host_ = st.state_host.as<float>();
  } else {
    param_host_ = param_compute_;
    grad_host_ = grad_compute_;
    state_host_ = state_compute_;
  }
  for (const ParamInfo& p : shape_.params) {
    // A stage's values are the whole model's (whose ids seed them).
    const ParamInfo& init = stage_.init_params.empty() ? p : stage_.init_params[p.id];
    InitParamRange(init, seed_, 0, p.num_elements, param(p.id));
  }
  if (param_total > 0) std::memset(grad_host_, 0, param_bytes);
  for (const ParamInfo& p : shape_.local_state) {
    InitParamRange(p, seed_, 0, p.num_elements, local_state_data(p.id));
  }
  RETURN_IF_ERROR(backend_->ToDevice(param_compute_, param_host_, param_bytes));
  RETURN_IF_ERROR(backend_->ToDevice(grad_compute_, grad_host_, param_bytes));
  RETURN_IF_ERROR(backend_->ToDevice(state_compute_, state_host_, state_bytes));
  RETURN_IF_ERROR(backend_->Synchronize());
  if (gpu && IsReducedPrecision(precision_)) {
    std::vector<std::pair<const float*, int64_t>> weights;
    for (const LayerShape& layer : shape_.layers) {
      if ((layer.kind == LayerKind::kDense || layer.kind == LayerKind::kConv2d) &&
          !layer.param_ids.empty()) {
        const int id = layer.param_ids[0];
        weights.emplace_back(param_compute_ + param_offset_[id], shape_.params[id].num_elements);
        reduced_weight_params_.push_back(id);
      }
    }
    std::sort(reduced_weight_params_.begin(), reduced_weight_params_.end());
    reduced_weight_params_.erase(
        std::unique(reduced_weight_params_.begin(), reduced_weight_params_.end()),
        reduced_weight_params_.end());
    RETURN_IF_ERROR(backend_->RegisterReducedWeights(weights));
  }

  std::vector<Buffer>& buffers = st.buffers;
  std::vector<int>& buffer_of_layer = st.buffer_of_layer;
  // Reduced activations: layers other than embeddings read a converted copy
  // of the input (a stage's boundary input comes in that type).
  if (backend_->activation_bytes() != sizeof(float) && !stage_.boundary_input) {
    for (const LayerShape& layer : shape_.layers) {
      for (int input : layer.inputs) {
        input_to_activations_ |= input < 0 && layer.kind != LayerKind::kEmbedding;
      }
    }
  }

  buffers.emplace_back();
  buffers[0].elements = shape_.input_size;
  for (size_t i = 0; i < shape_.layers.size(); ++i) {
    const LayerShape& layer = shape_.layers[i];
    const int input = layer.inputs[0];
    const int in_buffer = input < 0 ? 0 : buffer_of_layer[input];
    const int64_t elements = CheckedProduct(layer.output_shape);
    int buffer = -1;
    if (layer.kind == LayerKind::kFlatten) {
      buffer = in_buffer;
    } else if (layer.kind != LayerKind::kSoftmaxCrossEntropy &&
               layer.kind != LayerKind::kStageOutput) {
      buffer = static_cast<int>(buffers.size());
      buffers.emplace_back();
      buffers.back().elements = elements;
    }
    buffer_of_layer.push_back(buffer);
  }
  // A ReLU that is the only reader of its input overwrites it (its backward
  // needs only its output).
  std::vector<int> readers(buffers.size(), 0);
  for (const LayerShape& layer : shape_.layers) {
    if (layer.kind == LayerKind::kFlatten) continue;
    for (int input : layer.inputs) {
      if (input >= 0) ++readers[buffer_of_layer[input]];
    }
  }
  // (convolution, ReLU) pairs that fuse.
  std::vector<std::pair<int, int>> fused;
  for (size_t i = 0; i < shape_.layers.size(); ++i) {
    const LayerShape& layer = shape_.layers[i];
    if (layer.kind != LayerKind::kRelu || layer.inputs[0] < 0) continue;
    const int input = layer.inputs[0];
    const int in_buffer = buffer_of_layer[input];
    if (in_buffer <= 0 || readers[in_buffer] != 1) continue;
    // The input's own producer: a flatten's is further up; keep it simple.
    const LayerKind producer = shape_.layers[input].kind;
    if (producer == LayerKind::kRelu || producer == LayerKind::kFlatten) continue;
    buffers[buffer_of_layer[i]].value_alias = in_buffer;
    // Nothing else reads the convolution's output before the ReLU: the
    // convolution applies it in the pass that writes its output (one pass
    // over the activation fewer; the ReLU's backward is unchanged).
    if (producer == LayerKind::kConv2d) fused.emplace_back(input, static_cast<int>(i));
  }
  // Every set has layers of its own (their scratch is per micro-batch).
  st.sets.resize(static_cast<size_t>(stage_.activation_sets));
  for (int set = stage_.activation_sets - 1; set >= 0; --set) {
    UseSet(set);
    MakeLayers(fused);
  }
  return absl::OkStatus();
}

void Model::MakeLayers(const std::vector<std::pair<int, int>>& fused) {
  layers_.clear();
  for (size_t i = 0; i < shape_.layers.size(); ++i) {
    const LayerShape& layer = shape_.layers[i];
    model_internal::LayerTensors tensors;
    for (int32_t id : layer.param_ids) {
      tensors.params.push_back(param_compute_ + param_offset_[id]);
      tensors.grads.push_back(grad_compute_ + param_offset_[id]);
    }
    for (int32_t id : layer.local_state_ids) {
      tensors.state.push_back(state_compute_ + state_offset_[id]);
    }
    layers_.push_back(model_internal::MakeLayer(shape_, i, seed_, tensors,
                                                stage_.first_layer + static_cast<int64_t>(i)));
  }
  for (const auto& [conv, relu] : fused) {
    if (layers_[conv]->FuseFollowingRelu()) layers_[relu]->ForwardDoneByInput();
  }
}

void Model::SwapCurrentSet(model_internal::ActivationSet& other) {
  model_internal::Storage& st = *storage_;
  std::swap(st.arena, other.arena);
  other.value.resize(st.buffers.size(), nullptr);
  other.grad.resize(st.buffers.size(), nullptr);
  for (size_t b = 0; b < st.buffers.size(); ++b) {
    std::swap(st.buffers[b].value_data, other.value[b]);
    std::swap(st.buffers[b].grad_data, other.grad[b]);
  }
  std::swap(scratch_at_, other.scratch_at);
  std::swap(layers_, other.layers);
  std::swap(st.input_activations, other.input_activations);
  std::swap(st.boundary_grad, other.boundary_grad);
  std::swap(st.output_grad, other.output_grad);
  std::swap(input_, other.input);
  std::swap(labels_, other.labels);
}

void Model::UseSet(int set) {
  if (set == current_set_) return;
  model_internal::Storage& st = *storage_;
  SwapCurrentSet(st.sets[current_set_]);
  SwapCurrentSet(st.sets[set]);
  current_set_ = set;
}

Model::~Model() {
  if (backend_ != nullptr) backend_->Synchronize().IgnoreError();
  // Layers and storage free compute memory; the backend (and the GPU
  // context) goes last.
  layers_.clear();
  storage_.reset();
}

float* Model::device_param(int id) { return param_compute_ + param_offset_[id]; }
float* Model::device_grad(int id) { return grad_compute_ + param_offset_[id]; }

absl::Status Model::CheckBatch(const float* features, const int32_t* labels, int64_t batch) const {
  if (batch <= 0)
    return absl::InvalidArgumentError(absl::StrCat("batch must be positive, got ", batch));
  if (features == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("features and labels must not be null");
  }
  return CheckStageBatch(features, labels, batch);
}

absl::Status Model::CheckStageBatch(const float* features, const int32_t* labels,
                                    int64_t batch) const {
  if (batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be positive, got ", batch));
  }
  int64_t widest = 0;
  for (const model_internal::Buffer& b : storage_->buffers) widest = std::max(widest, b.elements);
  if (batch > kMaxTensorElements / std::max<int64_t>(widest, shape_.num_classes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " examples is too large for this model"));
  }
  for (int64_t i = 0; labels != nullptr && i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= shape_.num_classes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("labels[%d] = %d is outside [0, %d)", i, labels[i], shape_.num_classes));
    }
  }
  // Ids read straight from the features; an embedding fed by another layer
  // reads an id that is not in its table as zeros.
  for (const LayerShape& layer : shape_.layers) {
    if (features == nullptr || layer.kind != LayerKind::kEmbedding || layer.inputs[0] >= 0 ||
        layer.sparse_table >= 0) {
      continue;
    }
    const InputSlot& slot = shape_.input_slots[LayerShape::SlotOf(layer.inputs[0])];
    for (int64_t i = batch * slot.offset; i < batch * (slot.offset + slot.width); ++i) {
      if (kernels::EmbeddingRow(features[i], layer.vocab_size) < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "features[%d] = %g is not an id of embedding \"%s\" (an integer in [0, %d))", i,
            features[i], layer.name, layer.vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Reserve(int64_t batch) {
  model_internal::Storage& st = *storage_;
  if (batch <= st.capacity) return absl::OkStatus();
  // A failure below leaves no capacity (nothing half-placed is used).
  st.capacity = 0;
  // The layers' scratch needs depend on the batch: measured again.
  scratch_need_.assign(2 * layers_.size(), 0);
  scratch_planned_ = false;
  RETURN_IF_ERROR(PlanArena(batch));
  const size_t input_bytes = backend_->activation_bytes() * batch * shape_.input_size;
  int64_t output_elements = 0;  // Per example, of every kStageOutput input.
  if (output_layer_ >= 0) {
    for (int input : shape_.layers[output_layer_].inputs) {
      output_elements += CheckedProduct(shape_.layers[input].output_shape);
    }
  }
  const int current = current_set_;
  for (int set = 0; set < stage_.activation_sets; ++set) {
    UseSet(set);
    if (input_to_activations_ || stage_.boundary_input) {
      st.input_activations = {};
      ASSIGN_OR_RETURN(st.input_activations, backend_->Allocate(input_bytes));
    }
    if (stage_.boundary_input) {
      st.boundary_grad = {};
      ASSIGN_OR_RETURN(st.boundary_grad, backend_->Allocate(input_bytes));
      // Every slot's readers write it; zeros all the same.
      RETURN_IF_ERROR(
          backend_->Zero(batch * shape_.input_size, kernels::Act(st.boundary_grad.as<void>())));
    }
    if (output_layer_ >= 0) {
      st.output_grad = {};
      ASSIGN_OR_RETURN(st.output_grad,
                       backend_->Allocate(backend_->activation_bytes() * batch * output_elements));
    }
    for (auto& layer : layers_) RETURN_IF_ERROR(layer->Reserve(*backend_, batch));
  }
  UseSet(current);
  if (!shape_.sparse_tables.empty()) {
    const size_t bytes = sizeof(float) * batch * shape_.input_size;
    st.input_grad = {};
    st.input_grad_host = {};
    ASSIGN_OR_RETURN(st.input_grad, backend_->Allocate(bytes));
    if (backend_->gpu()) {
      ASSIGN_OR_RETURN(st.input_grad_host, backend_->AllocateHost(bytes));
      std::memset(st.input_grad_host.as<void>(), 0, bytes);  // The dense slots stay so.
    }
    // Slots no layer writes (dense inputs) read as zeros.
    RETURN_IF_ERROR(backend_->ZeroFloats(batch * shape_.input_size, st.input_grad.as<float>()));
  }
  st.capacity = batch;
  return absl::OkStatus();
}

absl::Status Model::PlanScratch() {
  model_internal::Storage& st = *storage_;
  const int64_t batch = st.capacity;
  // Until the arena is placed again nothing points anywhere valid: a
  // failure here leaves the next step to Reserve from scratch.
  st.capacity = 0;
  scratch_planned_ = false;
  // The calls measured now take their scratch from the arena; the backend's
  // own goes first, so the two are never held together.
  RETURN_IF_ERROR(backend_->ReleaseWorkspace());
  RETURN_IF_ERROR(PlanArena(batch));
  st.capacity = batch;
  scratch_planned_ = true;
  return absl::OkStatus();
}

bool Model::ScratchToPlan() const {
  // The first training step of a capacity measured every layer; later, a
  // call that outgrew its planned block (another batch size, an Evaluate)
  // grew the backend's own scratch back, and the arena takes its need too.
  return backend_->gpu() && !profiling_ && (!scratch_planned_ || backend_->workspace_bytes() > 0);
}

absl::Status Model::PlanArena(int64_t batch) {
  model_internal::Storage& st = *storage_;
  // Outstanding work may still read the old buffers.
  RETURN_IF_ERROR(backend_->Synchronize());
  std::vector<model_internal::ArenaBuffer> buffers;
  for (const model_internal::Buffer& b : st.buffers) buffers.push_back({b.elements, b.value_alias});
  const model_internal::ArenaPlan plan = model_internal::PlanArena(
      shape_, buffers, st.buffer_of_layer, scratch_need_, backend_->activation_bytes(), batch);
  // The sets' arenas, freed first (they are replaced, not grown).
  for (model_internal::ActivationSet& set : st.sets) set.arena = {};
  st.arena = {};
  const int current = current_set_;
  for (int set = 0; set < stage_.activation_sets; ++set) {
    UseSet(set);
    ASSIGN_OR_RETURN(st.arena, backend_->Allocate(plan.bytes));
    char* base = st.arena.as<char>();
    for (size_t b = 1; b < st.buffers.size(); ++b) {
      st.buffers[b].value_data = base + plan.value_offset[b];
      st.buffers[b].grad_data = base + plan.grad_offset[b];
    }
    scratch_at_.assign(plan.scratch_offset.size(), nullptr);
    for (size_t i = 0; i < plan.scratch_offset.size(); ++i) {
      scratch_at_[i] = plan.scratch_offset[i] < 0 ? nullptr : base + plan.scratch_offset[i];
    }
  }
  UseSet(current);
  return absl::OkStatus();
}

absl::Status Model::RunLayer(size_t i, bool forward, const model_internal::ForwardArgs* f,
                             const model_internal::BackwardArgs* b) {
  const size_t slot = 2 * i + (forward ? 0 : 1);
  backend_->ResetWorkspacePeak();
  if (scratch_planned_ && scratch_at_[slot] != nullptr) {
    backend_->LendWorkspace(scratch_at_[slot], static_cast<size_t>(scratch_need_[slot]));
  }
  absl::Status s =
      forward ? layers_[i]->Forward(*backend_, *f) : layers_[i]->Backward(*backend_, *b);
  backend_->ReturnWorkspace();
  scratch_need_[slot] = std::max(scratch_need_[slot], backend_->WorkspacePeak());
  return s;
}

absl::Status Model::GrowStaging(int64_t batch) {
  model_internal::Storage& st = *storage_;
  if (batch <= st.staged_capacity) return absl::OkStatus();
  const size_t feature_bytes = sizeof(float) * batch * shape_.input_size;
  const size_t label_bytes = sizeof(int32_t) * batch;
  RETURN_IF_ERROR(backend_->Synchronize());
  st.features = {};
  st.labels = {};
  ASSIGN_OR_RETURN(st.features, backend_->Allocate(feature_bytes));
  ASSIGN_OR_RETURN(st.labels, backend_->Allocate(label_bytes));
  ASSIGN_OR_RETURN(st.features_host, backend_->AllocateHost(feature_bytes));
  ASSIGN_OR_RETURN(st.labels_host, backend_->AllocateHost(label_bytes));
  st.staged_capacity = batch;
  return absl::OkStatus();
}

absl::StatusOr<float*> Model::FeatureStaging(int64_t batch) {
  if (!backend_->gpu()) return nullptr;
  RETURN_IF_ERROR(GrowStaging(batch));
  return storage_->features_host.as<float>();
}

int64_t Model::DenseInputFloats() const {
  return shape_.sparse_tables.empty() ? shape_.input_size
                                      : shape_.input_slots[shape_.sparse_tables[0].slot].offset;
}

absl::Status Model::StageBatch(const float* features, const int32_t* labels, int64_t batch,
                               bool pooled) {
  if (!backend_->gpu()) {
    input_ = features;
    labels_ = labels;
    return absl::OkStatus();
  }
  model_internal::Storage& st = *storage_;
  // With pooled rows only the dense slots go up; the step pools the rest.
  const size_t feature_bytes =
      sizeof(float) * batch * (pooled ? DenseInputFloats() : shape_.input_size);
  const size_t label_bytes = sizeof(int32_t) * batch;
  // Features already in the staging buffer (FeatureStaging) leave it as it
  // is: it holds the batch.
  const bool staged = batch <= st.staged_capacity && features == st.features_host.as<float>();
  RETURN_IF_ERROR(GrowStaging(batch));
  // The staging buffers are free: the previous step waited for its copies.
  if (!staged) std::memcpy(st.features_host.as<void>(), features, feature_bytes);
  std::memcpy(st.labels_host.as<void>(), labels, label_bytes);
  // The batch goes up beside the parameters' copy on the compute stream; the
  // forward waits for both.
  RETURN_IF_ERROR(
      backend_->UploadAside(st.features.as<void>(), st.features_host.as<void>(), feature_bytes));
  RETURN_IF_ERROR(
      backend_->UploadAside(st.labels.as<void>(), st.labels_host.as<void>(), label_bytes));
  if (pooled) {
    RETURN_IF_ERROR(
        backend_->UploadAside(st.pooled.as<void>(), st.pooled_host.as<void>(), pooled_bytes_));
  }
  RETURN_IF_ERROR(backend_->JoinUploads());
  if (pooled) RETURN_IF_ERROR(PoolStagedRows(batch));
  input_ = st.features.as<float>();
  labels_ = st.labels.as<int32_t>();
  return absl::OkStatus();
}

kernels::Act Model::Activation(int buffer) const {
  if (buffer != 0) return storage_->buffers[buffer].value_ptr();
  return SlotInput(0, 0);
}

kernels::Act Model::SlotInput(int slot, int64_t batch) const {
  const int64_t at = batch * shape_.input_slots[slot].offset;
  if (input_to_activations_ || stage_.boundary_input) {
    return kernels::Act(storage_->input_activations.as<char>() + at * backend_->activation_bytes());
  }
  return kernels::Act(static_cast<const void*>(input_ + at));
}

kernels::Act Model::InputOf(int input, int64_t batch) const {
  if (input >= 0) return Activation(storage_->buffer_of_layer[input]);
  return SlotInput(LayerShape::SlotOf(input), batch);
}

const float* Model::ModelInputOf(int layer, int64_t batch) const {
  const int input = shape_.layers[layer].inputs[0];
  if (input >= 0) return nullptr;
  return input_ + batch * shape_.input_slots[LayerShape::SlotOf(input)].offset;
}

absl::Status Model::Forward(int64_t batch, bool training, int64_t step,
                            const std::function<absl::Status(int)>* await,
                            const model_internal::PassOptions& pass) {
  const model_internal::Storage& st = *storage_;
  model_internal::ForwardArgs args;
  args.batch = batch;
  args.training = training;
  args.step = static_cast<uint64_t>(step);
  args.labels = labels_;
  if (training && loss_scaling_) args.loss_scale = static_cast<float>(step_scale_);
  args.loss_scale *= pass.loss_weight;
  if (pass.first) RETURN_IF_ERROR(backend_->ResetLoss());
  if (input_to_activations_) {
    RETURN_IF_ERROR(backend_->ToActivations(batch * shape_.input_size, input_,
                                            kernels::Act(st.input_activations.as<void>())));
  }
  // The weights changed since the last pass (shards' values or the device
  // optimizer): one cast for the whole step instead of one per op, or one
  // per layer as its weights arrive.
  const bool gated = await != nullptr && *await != nullptr;
  if (!gated && pass.first) RETURN_IF_ERROR(backend_->CastReducedWeights());
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->aliases_input()) continue;
    const std::vector<int32_t>& ids = shape_.layers[i].param_ids;
    if (gated && !ids.empty()) {
      RETURN_IF_ERROR((*await)(static_cast<int>(i)));
      RETURN_IF_ERROR(backend_->JoinUploads());
      RETURN_IF_ERROR(backend_->CastReducedWeight(param_compute_ + param_offset_[ids[0]]));
    }
    args.x.clear();
    for (int input : shape_.layers[i].inputs) args.x.push_back(InputOf(input, batch));
    args.model_input = ModelInputOf(static_cast<int>(i), batch);
    const int out = st.buffer_of_layer[i];
    args.y = out > 0 ? st.buffers[out].value_ptr() : nullptr;
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i));
    RETURN_IF_ERROR(RunLayer(i, /*forward=*/true, &args, nullptr));
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i + 1));
  }
  return absl::OkStatus();
}

absl::Status Model::StreamGradients(int first, int last,
                                    const std::function<void(int, int64_t)>& queued) {
  const int64_t begin = param_offset_[first];
  const int64_t end = param_offset_[last] + shape_.params[last].num_elements;
  ASSIGN_OR_RETURN(int64_t ticket,
                   backend_->DownloadAside(grad_host_ + begin, grad_compute_ + begin,
                                           sizeof(float) * (end - begin)));
  for (int id = last; id >= first; --id) queued(id, ticket);
  return absl::OkStatus();
}

absl::Status Model::Backward(int64_t batch, const std::function<void(int, int64_t)>* queued,
                             const std::function<void(int)>* on_device) {
  const model_internal::Storage& st = *storage_;
  // A buffer's gradient is overwritten by the first layer that contributes to
  // it (in reverse order) and added to by the others.
  std::vector<bool> written(st.buffers.size(), false);
  std::vector<bool> slot_written(shape_.input_slots.size(), false);
  model_internal::BackwardArgs args;
  args.batch = batch;
  args.param_write = param_write_;
  args.stage_output_grad = kernels::Act(st.output_grad.as<void>());
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    if (layers_[i]->aliases_input()) continue;
    const int out = st.buffer_of_layer[i];
    args.y = nullptr;
    args.dy = nullptr;
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i + 2));
    if (out > 0) {
      const model_internal::Buffer& b = st.buffers[out];
      if (!written[out]) {
        // Nothing reads this output: its gradient is zero.
        RETURN_IF_ERROR(backend_->Zero(batch * b.elements, b.grad_ptr()));
        written[out] = true;
      }
      args.y = b.value_ptr();
      args.dy = b.grad_ptr();
    }
    args.x.clear();
    args.dx.clear();
    args.dx_write.clear();
    args.model_input = ModelInputOf(i, batch);
    for (int input : shape_.layers[i].inputs) {
      args.x.push_back(InputOf(input, batch));
      if (input < 0 && stage_.boundary_input) {
        // An earlier stage's output: its gradient goes back there.
        const int k = LayerShape::SlotOf(input);
        args.dx.push_back(
            kernels::Act(st.boundary_grad.as<char>() +
                         batch * shape_.input_slots[k].offset * backend_->activation_bytes()));
        args.dx_write.push_back(slot_written[k] ? kernels::Write::kAccumulate
                                                : kernels::Write::kOverwrite);
        slot_written[k] = true;
        continue;
      }
      if (input < 0) {
        // Only a sparse embedding's slot has a gradient, and one reader.
        const InputSlot& slot = shape_.input_slots[LayerShape::SlotOf(input)];
        args.dx.push_back(slot.sparse_table < 0
                              ? kernels::Act()
                              : kernels::Act(st.input_grad.as<float>() + batch * slot.offset));
        args.dx_write.push_back(kernels::Write::kOverwrite);
        continue;
      }
      const int in = st.buffer_of_layer[input];
      args.dx.push_back(in > 0 ? st.buffers[in].grad_ptr() : kernels::Act());
      args.dx_write.push_back(written[in] ? kernels::Write::kAccumulate
                                          : kernels::Write::kOverwrite);
      written[in] = true;
    }
    RETURN_IF_ERROR(RunLayer(i, /*forward=*/false, nullptr, &args));
    if (profiling_) RETURN_IF_ERROR(MarkLayer(4 * i + 3));
    const std::vector<int32_t>& ids = shape_.layers[i].param_ids;
    if (queued != nullptr && !ids.empty()) {
      RETURN_IF_ERROR(StreamGradients(ids.front(), ids.back(), *queued));
    }
    if (on_device != nullptr) {
      for (auto id = ids.rbegin(); id != ids.rend(); ++id) (*on_device)(*id);
    }
  }
  return absl::OkStatus();
}

absl::Status Model::UploadParam(int id, int64_t offset, int64_t count) {
  if (!backend_->gpu()) return absl::OkStatus();
  RETURN_IF_ERROR(backend_->MakeCurrent());  // The calling thread's device.
  const int64_t at = param_offset_[id] + offset;
  return backend_->UploadAside(param_compute_ + at, param_host_ + at, sizeof(float) * count);
}

absl::Status Model::ParamsToDevice() {
  return backend_->ToDevice(param_compute_, param_host_, sizeof(float) * param_total_);
}

absl::Status Model::CheckPooled(int64_t batch, bool pooled_rows) const {
  if (!pooled_rows || (backend_->gpu() && pooled_batch_ == batch)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("a step of ", batch, " examples with pooled rows, but ",
                   backend_->gpu() ? "PooledStaging laid out no block for that batch"
                                   : "the model is on the CPU (it reads pooled features)"));
}

absl::StatusOr<StepResult> Model::TrainStep(const float* features, const int32_t* labels,
                                            int64_t batch, int64_t step,
                                            const TrainStepOptions& options) {
  RETURN_IF_ERROR(backend_->MakeCurrent());
  RETURN_IF_ERROR(CheckBatch(features, labels, batch));
  RETURN_IF_ERROR(CheckPooled(batch, options.pooled_rows));
  RETURN_IF_ERROR(Reserve(batch));
  RETURN_IF_ERROR(StageBatch(features, labels, batch, options.pooled_rows));
  if (options.params_from_host) RETURN_IF_ERROR(ParamsToDevice());
  RETURN_IF_ERROR(BeginLossScaling());
  RETURN_IF_ERROR(Forward(batch, /*training=*/true, step, &options.await_layer_params));
  if (options.before_backward) RETURN_IF_ERROR(options.before_backward());
  // FP16's gradients are final only after the step's verdict.
  const bool stream = options.gradient_queued != nullptr;
  const bool on_device = options.gradient_on_device != nullptr && !stream && !loss_scaling_;
  RETURN_IF_ERROR(Backward(batch, stream && !loss_scaling_ ? &options.gradient_queued : nullptr,
                           on_device ? &options.gradient_on_device : nullptr));
  if (ScratchToPlan()) RETURN_IF_ERROR(PlanScratch());
  RETURN_IF_ERROR(UnscaleGradients());
  bool skipped = false;
  if (loss_scaling_) {
    ASSIGN_OR_RETURN(skipped, FinishLossScaling());  // Waits; zeroes a skipped step's grads.
  }
  if (stream && loss_scaling_ && !params().empty()) {
    RETURN_IF_ERROR(
        StreamGradients(0, static_cast<int>(params().size()) - 1, options.gradient_queued));
  } else if (options.grads_to_host && !stream) {
    RETURN_IF_ERROR(backend_->ToHost(grad_host_, grad_compute_, sizeof(float) * param_total_));
  }
  RETURN_IF_ERROR(backend_->ToHost(state_host_, state_compute_, sizeof(float) * state_total_));
  if (options.pooled_rows) {
    model_internal::Storage& st = *storage_;
    RETURN_IF_ERROR(backend_->PoolRowsBackward(static_cast<int>(pooled_.size()),
                                               st.pooled.as<kernels::PooledTable>(),
                                               most_grad_work_, st.input_grad.as<float>()));
    RETURN_IF_ERROR(backend_->ToHost(st.pooled_grads_host.as<void>(), st.pooled_grads.as<void>(),
                                     pooled_grad_bytes_));
  } else if (backend_->gpu() && !shape_.sparse_tables.empty()) {
    model_internal::Storage& st = *storage_;
    // Only the sparse embeddings' slots have a gradient: they come after
    // the dense inputs' (spec/model_shape.h), so the copy is their span.
    const int64_t begin = batch * shape_.input_slots[shape_.sparse_tables[0].slot].offset;
    RETURN_IF_ERROR(backend_->ToHost(st.input_grad_host.as<float>() + begin,
                                     st.input_grad.as<float>() + begin,
                                     sizeof(float) * (batch * shape_.input_size - begin)));
  }
  ASSIGN_OR_RETURN(kernels::LossStats loss, backend_->ReadLoss());  // Waits.
  StepResult result{loss.loss_sum / static_cast<double>(batch), loss.correct};
  result.skipped = skipped;
  result.loss_scale = step_scale_;
  return result;
}

const float* Model::input_grad() const {
  if (shape_.sparse_tables.empty()) return nullptr;
  const model_internal::Storage& st = *storage_;
  return backend_->gpu() ? st.input_grad_host.as<float>() : st.input_grad.as<float>();
}

absl::Status Model::GradsToHost() {
  RETURN_IF_ERROR(backend_->MakeCurrent());
  RETURN_IF_ERROR(backend_->ToHost(grad_host_, grad_compute_, sizeof(float) * param_total_));
  return backend_->Synchronize();
}

absl::Status Model::BeginLossScaling() {
  if (!loss_scaling_) return absl::OkStatus();
  step_scale_ = loss_scale_.scale();
  return backend_->ResetNonFinite();
}

absl::Status Model::UnscaleGradients() {
  if (!loss_scaling_) return absl::OkStatus();
  return backend_->UnscaleCheckFinite(param_total_, static_cast<float>(1.0 / step_scale_),
                                      grad_compute_);
}

absl::StatusOr<bool> Model::FinishLossScaling() {
  ASSIGN_OR_RETURN(bool overflow, backend_->ReadNonFinite());
  loss_scale_.Update(overflow);
  if (overflow) RETURN_IF_ERROR(backend_->ZeroFloats(param_total_, grad_compute_));
  return overflow;
}

absl::StatusOr<EvalResult> Model::Evaluate(const float* features, const int32_t* labels,
                                           int64_t batch, std::vector<float>* logits,
                                           bool pooled_rows) {
  RETURN_IF_ERROR(backend_->MakeCurrent());
  RETURN_IF_ERROR(CheckBatch(features, labels, batch));
  RETURN_IF_ERROR(CheckPooled(batch, pooled_rows));
  RETURN_IF_ERROR(Reserve(batch));
  RETURN_IF_ERROR(StageBatch(features, labels, batch, pooled_rows));
  RETURN_IF_ERROR(ParamsToDevice());
  RETURN_IF_ERROR(Forward(batch, /*training=*/false, /*step=*/0));
  if (logits != nullptr) RETURN_IF_ERROR(ReadLogits(batch, logits));
  ASSIGN_OR_RETURN(kernels::LossStats loss, backend_->ReadLoss());
  return EvalResult{loss.loss_sum, loss.correct};
}

absl::Status Model::ReadLogits(int64_t batch, std::vector<float>* logits) {
  const int64_t n = batch * shape_.num_classes;
  logits->resize(n);
  const kernels::Act at = InputOf(shape_.layers.back().inputs[0], batch);
  const size_t bytes = backend_->activation_bytes();
  if (bytes == sizeof(float)) {
    return backend_->ToHost(logits->data(), at, sizeof(float) * n);
  }
  std::vector<char> reduced(bytes * n);
  RETURN_IF_ERROR(backend_->ToHost(reduced.data(), at, bytes * n));
  RETURN_IF_ERROR(backend_->Synchronize());
  DecodeFloats(precision_ == FP16 ? WireDtype::kFloat16 : WireDtype::kBfloat16, reduced.data(), n,
               logits->data());
  return absl::OkStatus();
}

absl::Status Model::TrainStepOnDevice(const float* features, const int32_t* labels, int64_t batch,
                                      int64_t step) {
  if (batch <= 0 || features == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("TrainStepOnDevice needs a batch and its labels");
  }
  RETURN_IF_ERROR(Reserve(batch));
  input_ = features;
  labels_ = labels;
  last_batch_ = batch;
  RETURN_IF_ERROR(BeginLossScaling());
  RETURN_IF_ERROR(Forward(batch, /*training=*/true, step));
  RETURN_IF_ERROR(Backward(batch));
  if (ScratchToPlan()) RETURN_IF_ERROR(PlanScratch());
  return UnscaleGradients();
}

absl::Status Model::MarkLayer(int slot) {
  if (static_cast<size_t>(slot) >= host_marks_.size()) host_marks_.resize(slot + 1);
  host_marks_[slot] =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return backend_->Mark(slot);
}

absl::StatusOr<std::vector<LayerTime>> Model::ProfileStepOnDevice(const float* features,
                                                                  const int32_t* labels,
                                                                  int64_t batch, int64_t step) {
  profiling_ = true;
  absl::Status s = TrainStepOnDevice(features, labels, batch, step);
  profiling_ = false;
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(backend_->Synchronize());
  std::vector<LayerTime> times;
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerTime t;
    t.name = shape_.layers[i].name;
    if (!layers_[i]->aliases_input()) {
      const int k = static_cast<int>(4 * i);
      ASSIGN_OR_RETURN(t.forward_ms, backend_->MarkMs(k, k + 1));
      ASSIGN_OR_RETURN(t.backward_ms, backend_->MarkMs(k + 2, k + 3));
      if (2 * i + 1 < scratch_need_.size()) {
        t.forward_scratch_bytes = scratch_need_[2 * i];
        t.backward_scratch_bytes = scratch_need_[2 * i + 1];
      }
      t.host_forward_ms = 1e3 * (host_marks_[k + 1] - host_marks_[k]);
      t.host_backward_ms = 1e3 * (host_marks_[k + 3] - host_marks_[k + 2]);
    }
    times.push_back(std::move(t));
  }
  return times;
}

absl::StatusOr<StepResult> Model::LastStepResult() {
  ASSIGN_OR_RETURN(kernels::LossStats loss, backend_->ReadLoss());
  StepResult result{loss.loss_sum / static_cast<double>(std::max<int64_t>(last_batch_, 1)),
                    loss.correct};
  result.loss_scale = step_scale_;
  if (loss_scaling_) {
    ASSIGN_OR_RETURN(result.skipped, FinishLossScaling());
    last_skipped_ = result.skipped;
  }
  return result;
}

absl::Status Model::ApplyOptimizerOnDevice(OptimizerKind kind, const OptimizerHyperparams& hp) {
  if (last_skipped_) {
    last_skipped_ = false;
    return absl::OkStatus();
  }
  model_internal::Storage& st = *storage_;
  const int slots = NumOptimizerSlots(kind);
  const int64_t total = param_total_;
  if (slots > st.num_slots) {
    RETURN_IF_ERROR(backend_->Synchronize());
    ASSIGN_OR_RETURN(st.slots, backend_->Allocate(sizeof(float) * slots * total));
    // Zeros: a zeroed host copy is sent up once.
    const std::vector<float> zeros(static_cast<size_t>(slots) * total, 0.f);
    RETURN_IF_ERROR(
        backend_->ToDevice(st.slots.as<void>(), zeros.data(), sizeof(float) * zeros.size()));
    RETURN_IF_ERROR(backend_->Synchronize());
    st.num_slots = slots;
  }
  std::vector<kernels::TensorUpdate> tensors;
  for (const ParamInfo& p : shape_.params) {
    kernels::TensorUpdate t;
    t.grad = device_grad(p.id);
    t.param = device_param(p.id);
    for (int k = 0; k < st.num_slots; ++k) {
      t.slots[k] = st.slots.as<float>() + k * total + param_offset_[p.id];
    }
    t.n = p.num_elements;
    tensors.push_back(t);
  }
  return backend_->ApplyOptimizer(kind, hp, tensors);
}

absl::Status Model::Synchronize() { return backend_->Synchronize(); }

Model::ComputeMemory Model::compute_memory() const {
  const model_internal::Storage& st = *storage_;
  ComputeMemory m;
  m.parameters = st.params.bytes() + st.grads.bytes() + st.state.bytes() + st.slots.bytes();
  m.activations = st.arena.bytes() + st.input_activations.bytes() + st.boundary_grad.bytes() +
                  st.output_grad.bytes() + st.features.bytes() + st.labels.bytes();
  // A stage's other activation sets.
  for (const model_internal::ActivationSet& set : st.sets) {
    m.activations += set.arena.bytes() + set.input_activations.bytes() + set.boundary_grad.bytes() +
                     set.output_grad.bytes();
  }
  m.workspace = backend_->workspace_bytes();
  m.weight_copies = backend_->weight_copy_bytes();
  return m;
}

}  // namespace downpour
