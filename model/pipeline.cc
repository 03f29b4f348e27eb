#include "model/pipeline.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "kernels/factory.h"
#include "model/pipeline_schedule.h"

namespace downpour {

// What the stages' threads of one training step share: the step's
// micro-batches, where every stage's boundary buffers are, and how far
// each stage has queued its passes (the host's half of the handover; the
// devices' half is the link's signals).
struct PipelineModel::Step {
  const TrainStepOptions* options = nullptr;
  int64_t step = 0;
  int64_t batch = 0;
  std::vector<int64_t> sizes, begins;  // Of each micro-batch.
  int micro_batches() const { return static_cast<int>(sizes.size()); }
  std::vector<std::vector<Model::StageBuffers>> buffers;  // [stage][set]

  absl::Mutex mu;
  absl::CondVar changed;
  // Per stage: forward passes queued (and signalled), input gradients sent.
  std::vector<int> forwarded ABSL_GUARDED_BY(mu), sent ABSL_GUARDED_BY(mu);
  bool backward_begun ABSL_GUARDED_BY(mu) = false;
  absl::Status failed ABSL_GUARDED_BY(mu);

  // Waits until `ready` (read under the lock) holds; the first failure of
  // any stage instead.
  absl::Status WaitUntil(const std::function<bool()>& ready) {
    absl::MutexLock lock(&mu);
    while (failed.ok() && !ready()) changed.Wait(&mu);
    return failed.ok()
               ? absl::OkStatus()
               : absl::AbortedError(absl::StrCat("another stage failed: ", failed.message()));
  }
  void Update(const std::function<void()>& update) {
    absl::MutexLock lock(&mu);
    update();
    changed.SignalAll();
  }
  void Fail(const absl::Status& status) {
    Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (failed.ok()) failed = status;
    });
  }
};

namespace {

// Every stage reading stage `s`'s outputs, once each.
std::vector<int> ConsumersOf(const StageShape& stage) {
  std::set<int> consumers;
  for (const StageShape::Destination& d : stage.outputs) consumers.insert(d.stage);
  return {consumers.begin(), consumers.end()};
}

std::vector<int> ProducersOf(const StageShape& stage) {
  std::set<int> producers;
  for (const StageShape::Source& source : stage.inputs) producers.insert(source.stage);
  return {producers.begin(), producers.end()};
}

// `p` advanced by `elements` of `bytes` each.
kernels::Act Advance(kernels::Act p, int64_t elements, size_t bytes) {
  return kernels::Act(static_cast<char*>(p) + elements * static_cast<int64_t>(bytes));
}

// `count` about equal parts of `batch`.
std::vector<int64_t> Parts(int64_t batch, int64_t count) {
  std::vector<int64_t> sizes;
  for (int64_t j = 0; j < count; ++j) {
    sizes.push_back(batch * (j + 1) / count - batch * j / count);
  }
  return sizes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineModel>> PipelineModel::Create(
    const ModelSpec& spec, uint64_t seed, const std::vector<int>& devices,
    const ModelOptions& options) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec));
  ASSIGN_OR_RETURN(std::vector<StageShape> split, SplitModel(shape));
  const int stages = static_cast<int>(split.size());
  if (static_cast<int>(devices.size()) != stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model has ", stages, " pipeline stage", stages == 1 ? "" : "s", " but ",
                     devices.size(), " device", devices.size() == 1 ? " was" : "s were",
                     " given (--devices): stage i runs on the i-th device"));
  }
  const bool cpu = devices[0] < 0;
  for (int d : devices) {
    if ((d < 0) != cpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline stages run all on the CPU or all on GPUs, got devices [",
                       absl::StrJoin(devices, ","), "]"));
    }
  }
  if (!cpu && options.precision == FP16) {
    return absl::InvalidArgumentError(
        "pipeline stages do not offer FP16 (its loss scaling would span the stages): use BF16");
  }
  const int micro = shape.pipeline.num_stages() > 0 ? shape.pipeline.micro_batches : 1;
  const PipelineSpec::Schedule schedule = shape.pipeline.schedule;
  std::vector<std::unique_ptr<Model>> models;
  for (int s = 0; s < stages; ++s) {
    ModelOptions stage_options = options;
    stage_options.device = devices[s];
    StageOptions stage;
    stage.activation_sets = InFlight(schedule, stages, s, micro);
    stage.boundary_input = s > 0;
    stage.first_layer = split[s].first_layer;
    stage.init_params = split[s].init_params;
    absl::StatusOr<std::unique_ptr<Model>> created =
        Model::CreateStage(split[s].shape, seed, stage_options, stage);
    if (!created.ok()) return Annotate(created.status(), absl::StrCat("pipeline stage ", s));
    std::unique_ptr<Model> model = std::move(created).value();
    if (s > 0 && model->backend().activation_bytes() != models[0]->backend().activation_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline stage ", s, " computes in ", Precision_Name(model->precision()),
                       " but stage 0 in ", Precision_Name(models[0]->precision()),
                       " (a layer there cannot take it): set the job's precision to FP32"));
    }
    models.push_back(std::move(model));
  }
  std::unique_ptr<PipelineModel> pipeline(
      new PipelineModel(std::move(shape), std::move(split), std::move(models)));
  std::vector<kernels::ComputeBackend*> backends;
  for (const auto& model : pipeline->stages_) backends.push_back(&model->backend());
  ASSIGN_OR_RETURN(pipeline->link_, kernels::CreateStreamLink(backends, 2 * std::max(micro, 1)));
  return pipeline;
}

PipelineModel::PipelineModel(ModelShape shape, std::vector<StageShape> stage_shapes,
                             std::vector<std::unique_ptr<Model>> stages)
    : shape_(std::move(shape)),
      stage_shapes_(std::move(stage_shapes)),
      stages_(std::move(stages)),
      micro_batches_(shape_.pipeline.num_stages() > 0 ? shape_.pipeline.micro_batches : 1),
      schedule_(shape_.pipeline.schedule) {
  param_stage_.assign(shape_.params.size(), 0);
  state_stage_.assign(shape_.local_state.size(), 0);
  for (int s = 0; s < num_stages(); ++s) {
    const StageShape& stage = stage_shapes_[s];
    for (size_t k = 0; k < stage.shape.params.size(); ++k) param_stage_[stage.first_param + k] = s;
    for (size_t k = 0; k < stage.shape.local_state.size(); ++k) {
      state_stage_[stage.first_state + k] = s;
    }
  }
}

PipelineModel::~PipelineModel() {
  // Queued copies may still read or write the batch buffers.
  Synchronize().IgnoreError();
}

std::string PipelineModel::device_name() const {
  std::vector<std::string> names;
  for (int s = 0; s < num_stages(); ++s) {
    names.push_back(absl::StrCat("stage ", s, " on ", stages_[s]->device_name()));
  }
  return absl::StrJoin(names, ", ");
}

float* PipelineModel::local_state_data(int id) {
  const int s = state_stage_[id];
  return stages_[s]->local_state_data(id - stage_shapes_[s].first_state);
}

const float* PipelineModel::local_state_data(int id) const {
  const int s = state_stage_[id];
  return stages_[s]->local_state_data(id - stage_shapes_[s].first_state);
}

absl::Status PipelineModel::RestoreLocalState(double loss_scale) {
  for (const auto& stage : stages_) {
    RETURN_IF_ERROR(stage->backend().MakeCurrent());
    RETURN_IF_ERROR(stage->RestoreLocalState(loss_scale));
  }
  return absl::OkStatus();
}

std::vector<int64_t> PipelineModel::MicroBatches(int64_t batch) const {
  return Parts(batch, std::min<int64_t>(micro_batches_, batch));
}

absl::Status PipelineModel::StageInputs(const float* features, const int32_t* labels,
                                        const std::vector<int64_t>& sizes) {
  int64_t batch = 0;
  for (int64_t size : sizes) batch += size;
  Model& first = *stages_.front();
  Model& last = *stages_.back();
  const size_t feature_bytes = sizeof(float) * batch * shape_.input_size;
  const size_t label_bytes = sizeof(int32_t) * batch;
  RETURN_IF_ERROR(first.backend().MakeCurrent());
  // Page-locked staging, so that each upload is a DMA queued beside the
  // compute (the last step or evaluation waited for its own).
  if (host_features_.bytes() < feature_bytes) {
    host_features_ = {};
    ASSIGN_OR_RETURN(host_features_, first.backend().AllocateHost(feature_bytes));
  }
  if (features_.bytes() < feature_bytes) {
    RETURN_IF_ERROR(first.Synchronize());
    features_ = {};
    ASSIGN_OR_RETURN(features_, first.backend().Allocate(feature_bytes));
  }
  staged_features_ = features;
  staged_batch_ = batch;
  RETURN_IF_ERROR(last.backend().MakeCurrent());
  if (labels_.bytes() < label_bytes) {
    RETURN_IF_ERROR(last.Synchronize());
    labels_ = {};
    ASSIGN_OR_RETURN(labels_, last.backend().Allocate(label_bytes));
  }
  return last.backend().ToDevice(labels_.as<void>(), labels, label_bytes);
}

absl::Status PipelineModel::StageFeatures(int64_t begin, int64_t size) {
  // The micro-batch's rows of every slot, slot-major on their own.
  const int64_t at = begin * shape_.input_size;
  float* out = host_features_.as<float>() + at;
  for (const InputSlot& slot : shape_.input_slots) {
    std::memcpy(out + size * slot.offset,
                staged_features_ + staged_batch_ * slot.offset + begin * slot.width,
                sizeof(float) * size * slot.width);
  }
  kernels::ComputeBackend& backend = stages_.front()->backend();
  RETURN_IF_ERROR(backend.UploadAside(features_.as<float>() + at, out,
                                      sizeof(float) * size * shape_.input_size));
  return backend.JoinUploads();
}

absl::Status PipelineModel::PullInputs(Step& step, int s, int j) {
  const StageShape& me = stage_shapes_[s];
  if (me.inputs.empty()) return absl::OkStatus();
  for (int producer : ProducersOf(me)) {
    RETURN_IF_ERROR(step.WaitUntil(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return step.forwarded[producer] > j; }));
    RETURN_IF_ERROR(link_->Wait(s, producer, j));
  }
  const size_t bytes = stages_[s]->backend().activation_bytes();
  const int64_t size = step.sizes[j];
  const Model::StageBuffers& mine = step.buffers[s][j % stages_[s]->activation_sets()];
  for (size_t k = 0; k < me.inputs.size(); ++k) {
    const StageShape::Source& source = me.inputs[k];
    const int set = j % stages_[source.stage]->activation_sets();
    const kernels::Act from = step.buffers[source.stage][set].outputs[source.output];
    const kernels::Act to = Advance(mine.input, size * me.shape.input_slots[k].offset, bytes);
    RETURN_IF_ERROR(link_->Copy(s, to, s, from, source.stage, bytes * size * me.input_widths[k]));
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::PushInputGrads(Step& step, int s, int j) {
  const StageShape& me = stage_shapes_[s];
  const size_t bytes = stages_[s]->backend().activation_bytes();
  const int64_t size = step.sizes[j];
  const Model::StageBuffers& mine = step.buffers[s][j % stages_[s]->activation_sets()];
  for (size_t k = 0; k < me.inputs.size(); ++k) {
    const StageShape::Source& source = me.inputs[k];
    const StageShape& producer = stage_shapes_[source.stage];
    int64_t block = 0;  // Elements per example before this output's gradient.
    for (int o = 0; o < source.output; ++o) block += producer.output_widths[o];
    const int set = j % stages_[source.stage]->activation_sets();
    const kernels::Act to =
        Advance(step.buffers[source.stage][set].output_grad, size * block, bytes);
    const kernels::Act from =
        Advance(mine.input_grad, size * me.shape.input_slots[k].offset, bytes);
    RETURN_IF_ERROR(link_->Copy(s, to, source.stage, from, s, bytes * size * me.input_widths[k]));
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::RunStage(Step& step, int s) {
  Model& model = *stages_[s];
  const StageShape& me = stage_shapes_[s];
  const TrainStepOptions& options = *step.options;
  const int m = step.micro_batches();
  const bool last = s == num_stages() - 1;
  RETURN_IF_ERROR(model.backend().MakeCurrent());
  std::function<absl::Status(int)> await;
  if (options.await_layer_params != nullptr) {
    await = [&](int layer) {
      absl::MutexLock lock(&callbacks_mu_);
      return options.await_layer_params(me.first_layer + layer);
    };
  }
  const std::vector<int> consumers = ConsumersOf(me);
  for (const StagePass& pass : StageSchedule(schedule_, num_stages(), s, m)) {
    const int j = pass.micro_batch;
    const int set = j % model.activation_sets();
    const int64_t size = step.sizes[j];
    if (pass.forward) {
      if (s == 0) RETURN_IF_ERROR(StageFeatures(step.begins[j], size));
      RETURN_IF_ERROR(PullInputs(step, s, j));
      const float* features =
          s == 0 ? features_.as<float>() + step.begins[j] * shape_.input_size : nullptr;
      const int32_t* labels = last ? labels_.as<int32_t>() + step.begins[j] : nullptr;
      RETURN_IF_ERROR(model.StageForward(
          set, features, labels, size, step.step * m + j,
          static_cast<float>(static_cast<double>(size) / static_cast<double>(step.batch)),
          /*training=*/true, /*first=*/j == 0, &await));
      RETURN_IF_ERROR(link_->Mark(s, j));
      step.Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { step.forwarded[s] = j + 1; });
      continue;
    }
    if (last && j == 0) {
      if (options.before_backward != nullptr) {
        absl::MutexLock lock(&callbacks_mu_);
        RETURN_IF_ERROR(options.before_backward());
      }
      step.Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { step.backward_begun = true; });
    }
    RETURN_IF_ERROR(
        step.WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return step.backward_begun; }));
    for (int consumer : consumers) {
      RETURN_IF_ERROR(
          step.WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return step.sent[consumer] > j; }));
      RETURN_IF_ERROR(link_->Wait(s, consumer, m + j));
    }
    RETURN_IF_ERROR(model.StageBackward(set, size, /*first=*/j == 0));
    RETURN_IF_ERROR(PushInputGrads(step, s, j));
    RETURN_IF_ERROR(link_->Mark(s, m + j));
    step.Update([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { step.sent[s] = j + 1; });
  }
  std::function<void(int, int64_t)> queued;
  if (options.gradient_queued != nullptr) {
    queued = [&](int id, int64_t ticket) {
      absl::MutexLock lock(&callbacks_mu_);
      options.gradient_queued(me.first_param + id, ticket);
    };
  }
  return model.EndStageStep(options.grads_to_host, &queued);
}

absl::Status PipelineModel::CheckBatch(absl::string_view call, const float* features,
                                       const int32_t* labels, int64_t batch) const {
  if (batch <= 0 || features == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, " needs a positive batch, its features and labels; got ", batch, " examples"));
  }
  RETURN_IF_ERROR(stages_.front()->CheckStageBatch(features, nullptr, batch));
  return stages_.back()->CheckStageBatch(nullptr, labels, batch);
}

absl::StatusOr<StepResult> PipelineModel::TrainStep(const float* features, const int32_t* labels,
                                                    int64_t batch, int64_t step_number,
                                                    const TrainStepOptions& options) {
  RETURN_IF_ERROR(CheckBatch("a step", features, labels, batch));
  Step step;
  step.options = &options;
  step.step = step_number;
  step.batch = batch;
  step.sizes = MicroBatches(batch);
  const int64_t capacity = *std::max_element(step.sizes.begin(), step.sizes.end());
  capacity_ = std::max(capacity_, capacity);
  for (int64_t j = 0, begin = 0; j < static_cast<int64_t>(step.sizes.size()); ++j) {
    step.begins.push_back(begin);
    begin += step.sizes[j];
  }
  for (const auto& stage : stages_) {
    RETURN_IF_ERROR(stage->BeginStageStep(capacity_, options.params_from_host,
                                          options.await_layer_params != nullptr));
  }
  RETURN_IF_ERROR(StageInputs(features, labels, step.sizes));
  for (const auto& stage : stages_) {
    step.buffers.emplace_back();
    for (int set = 0; set < stage->activation_sets(); ++set) {
      step.buffers.back().push_back(stage->stage_buffers(set));
    }
  }
  {
    absl::MutexLock lock(&step.mu);
    step.forwarded.assign(num_stages(), 0);
    step.sent.assign(num_stages(), 0);
  }
  std::vector<std::thread> threads;
  for (int s = 1; s < num_stages(); ++s) {
    threads.emplace_back([this, &step, s] {
      absl::Status status = RunStage(step, s);
      if (!status.ok()) step.Fail(Annotate(status, absl::StrCat("pipeline stage ", s)));
    });
  }
  absl::Status status = RunStage(step, 0);
  if (!status.ok()) step.Fail(Annotate(status, "pipeline stage 0"));
  for (std::thread& thread : threads) thread.join();
  {
    absl::MutexLock lock(&step.mu);
    RETURN_IF_ERROR(step.failed);
  }
  Model& last = *stages_.back();
  RETURN_IF_ERROR(last.backend().MakeCurrent());
  ASSIGN_OR_RETURN(kernels::LossStats loss, last.ReadStageLoss());
  // The host copies of the gradients (unless streamed) and local state.
  RETURN_IF_ERROR(Synchronize());
  StepResult result;
  result.loss = loss.loss_sum / static_cast<double>(batch);
  result.correct = loss.correct;
  return result;
}

absl::StatusOr<EvalResult> PipelineModel::Evaluate(const float* features, const int32_t* labels,
                                                   int64_t batch, std::vector<float>* logits) {
  RETURN_IF_ERROR(CheckBatch("an evaluation", features, labels, batch));
  const int64_t chunk = capacity_ > 0 ? capacity_ : (batch + micro_batches_ - 1) / micro_batches_;
  const std::vector<int64_t> sizes = Parts(batch, (batch + chunk - 1) / chunk);
  const int64_t capacity = std::max(capacity_, *std::max_element(sizes.begin(), sizes.end()));
  for (const auto& stage : stages_) {
    RETURN_IF_ERROR(stage->BeginStageStep(capacity, /*params_from_host=*/true));
  }
  RETURN_IF_ERROR(StageInputs(features, labels, sizes));
  // One micro-batch after another through set 0 of every stage, from this
  // thread: a stage's next forward pass waits until the stages reading its
  // outputs have taken the last (signal 1); they wait for its forward pass
  // (signal 0).
  Step step;
  step.sizes = sizes;
  step.batch = batch;
  for (const auto& stage : stages_) step.buffers.push_back({stage->stage_buffers(0)});
  if (logits != nullptr) logits->clear();
  for (int64_t j = 0, begin = 0; j < static_cast<int64_t>(sizes.size()); begin += sizes[j], ++j) {
    for (int s = 0; s < num_stages(); ++s) {
      Model& model = *stages_[s];
      const StageShape& me = stage_shapes_[s];
      const bool last = s == num_stages() - 1;
      RETURN_IF_ERROR(model.backend().MakeCurrent());
      if (j > 0) {
        for (int consumer : ConsumersOf(me)) RETURN_IF_ERROR(link_->Wait(s, consumer, 1));
      }
      if (!me.inputs.empty()) {
        for (int producer : ProducersOf(me)) RETURN_IF_ERROR(link_->Wait(s, producer, 0));
        const size_t bytes = model.backend().activation_bytes();
        for (size_t k = 0; k < me.inputs.size(); ++k) {
          const StageShape::Source& source = me.inputs[k];
          RETURN_IF_ERROR(link_->Copy(
              s,
              Advance(step.buffers[s][0].input, sizes[j] * me.shape.input_slots[k].offset, bytes),
              s, step.buffers[source.stage][0].outputs[source.output], source.stage,
              bytes * sizes[j] * me.input_widths[k]));
        }
        RETURN_IF_ERROR(link_->Mark(s, 1));
      }
      if (s == 0) RETURN_IF_ERROR(StageFeatures(begin, sizes[j]));
      const float* f = s == 0 ? features_.as<float>() + begin * shape_.input_size : nullptr;
      const int32_t* l = last ? labels_.as<int32_t>() + begin : nullptr;
      RETURN_IF_ERROR(model.StageForward(0, f, l, sizes[j], 0, 1.f, /*training=*/false,
                                         /*first=*/j == 0));
      RETURN_IF_ERROR(link_->Mark(s, 0));
      if (last && logits != nullptr) RETURN_IF_ERROR(model.AppendStageLogits(sizes[j], logits));
    }
  }
  Model& last = *stages_.back();
  RETURN_IF_ERROR(last.backend().MakeCurrent());
  ASSIGN_OR_RETURN(kernels::LossStats loss, last.ReadStageLoss());
  RETURN_IF_ERROR(Synchronize());
  return EvalResult{loss.loss_sum, loss.correct};
}

absl::Status PipelineModel::UploadParam(int id, int64_t offset, int64_t count) {
  const auto [stage, local] = Locate(id);
  return stage->UploadParam(local, offset, count);
}

absl::Status PipelineModel::WaitGradient(int id, int64_t ticket) {
  return Locate(id).first->WaitGradient(ticket);
}

absl::Status PipelineModel::GradsToHost() {
  for (const auto& stage : stages_) RETURN_IF_ERROR(stage->GradsToHost());
  return absl::OkStatus();
}

absl::Status PipelineModel::ApplyOptimizerOnDevice(OptimizerKind kind,
                                                   const OptimizerHyperparams& hp) {
  for (const auto& stage : stages_) {
    RETURN_IF_ERROR(stage->backend().MakeCurrent());
    RETURN_IF_ERROR(stage->ApplyOptimizerOnDevice(kind, hp));
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::Synchronize() {
  absl::Status first;
  for (const auto& stage : stages_) {
    absl::Status s = stage->backend().MakeCurrent();
    if (s.ok()) s = stage->Synchronize();
    if (first.ok()) first = s;
  }
  return first;
}

std::vector<Model::ComputeMemory> PipelineModel::compute_memory() const {
  std::vector<Model::ComputeMemory> memory;
  for (const auto& stage : stages_) memory.push_back(stage->compute_memory());
  return memory;
}

}  // namespace downpour
