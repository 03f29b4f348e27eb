// PipelineModel: model parallelism inside one worker. The model's layers
// are split into stages (ModelSpec.pipeline; model/pipeline_stages.h), stage
// i a Model on the i-th device given, and each step's batch is cut into
// micro-batches that run through the stages in a pipelined schedule
// (model/pipeline_schedule.h), so the devices compute at once.
//
// A step, from the host: each stage's parameters go up from its host copy
// (unless options say otherwise), the features go to the first stage's
// device and the labels to the last's, and then one thread per stage
// queues that stage's passes in its schedule's order. A forward pass first
// copies its inputs from the earlier stages' outputs (a peer copy on the
// consuming GPU's stream, after an event of the producing one), and a
// backward pass sends the gradient of its inputs back the same way, into
// the producer's buffer for them, before the producer's backward pass for
// that micro-batch runs (kernels/stream_link.h). The host threads hand each
// other "queued" under a mutex; the GPUs wait for each other on events, so
// no thread waits for a device until the step's end. On the CPU the stages
// run on their threads at once and the copies are memcpy.
//
// What a step computes is the unsplit model's over the same micro-batches:
// each micro-batch's loss gradient is weighted by its share of the batch,
// its parameter gradients added up in micro-batch order, so grad(id) is the
// gradient of the batch's mean loss; batch norm normalises each micro-batch
// (as the unsplit model run in the same micro-batches would), dropout draws
// each micro-batch's masks from (seed, layer, step * micro-batches + j).
//
// Parameters keep the whole model's ids (InferModel's), so the parameter
// exchange and the shards see the parameter list of the unsplit model:
// param(id) and grad(id) are the host copies of the stage holding `id`.
//
// Thread safety: thread-compatible (one thread calls TrainStep, Evaluate
// and the rest at a time; TrainStep starts and joins its own threads),
// except UploadParam and WaitGradient, which are safe against each other
// as Model's. Owns its stages and the link between them.
#ifndef DOWNPOUR_MODEL_PIPELINE_H_
#define DOWNPOUR_MODEL_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/stream_link.h"
#include "model/model.h"
#include "model/pipeline_stages.h"
#include "proto/job.pb.h"
#include "spec/model_shape.h"

namespace downpour {

class PipelineModel {
 public:
  // The stages of `spec` (with ModelSpec.pipeline; without, the whole model
  // is one stage, still run in micro-batches), stage s on devices[s] (-1:
  // the CPU; several stages may share a device, the CPU's included), each
  // created with `options` but for its device. Parameters start as
  // Model::Create's with `seed`. InvalidArgument when devices has not one
  // entry per stage or mixes the CPU and GPUs, or for FP16 on a GPU (loss
  // scaling across stages is not offered: use BF16); the stages' errors
  // otherwise (ResourceExhausted past options.memory_limit or the
  // options.memory_caps every stage shares, naming the device).
  static absl::StatusOr<std::unique_ptr<PipelineModel>> Create(const ModelSpec& spec, uint64_t seed,
                                                               const std::vector<int>& devices,
                                                               const ModelOptions& options = {});
  ~PipelineModel();
  PipelineModel(const PipelineModel&) = delete;
  PipelineModel& operator=(const PipelineModel&) = delete;

  // The whole model's shape (InferModel's), parameters and local state.
  const ModelShape& shape() const { return shape_; }
  const std::vector<ParamInfo>& params() const { return shape_.params; }
  const std::vector<ParamInfo>& local_state() const { return shape_.local_state; }
  int64_t input_size() const { return shape_.input_size; }
  int32_t num_classes() const { return shape_.num_classes; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  int micro_batches() const { return micro_batches_; }
  PipelineSpec::Schedule schedule() const { return schedule_; }
  // REQUIRES: 0 <= s < num_stages().
  Model* stage(int s) const { return stages_[s].get(); }
  // The stage holding param `id` (local state `id`).
  int stage_of_param(int id) const { return param_stage_[id]; }
  int stage_of_state(int id) const { return state_stage_[id]; }
  // The first stage's device (-1: the CPU), and every stage's, as
  // "stage 0 on cuda:0 NVIDIA H100 80GB HBM3, stage 1 on cuda:1 ...".
  int device() const { return stages_[0]->device(); }
  std::string device_name() const;
  Precision precision() const { return stages_[0]->precision(); }
  double loss_scale() const { return 1.0; }

  // Host copies, as Model's (the stage holding `id`): the parameter, the
  // gradient of the last TrainStep's mean loss, and the local state.
  // REQUIRES: 0 <= id < params().size() (local_state().size()).
  float* param(int id) { return Locate(id).first->param(Locate(id).second); }
  const float* param(int id) const { return Locate(id).first->param(Locate(id).second); }
  float* grad(int id) { return Locate(id).first->grad(Locate(id).second); }
  const float* grad(int id) const { return Locate(id).first->grad(Locate(id).second); }
  float* local_state_data(int id);
  const float* local_state_data(int id) const;
  // Copies every stage's local state to its device and waits (after the
  // caller wrote local_state_data); FP16's scale does not apply.
  absl::Status RestoreLocalState(double loss_scale);

  // One training step on `batch` examples (features [batch, input_size()]
  // slot-major as Model::TrainStep takes them, labels [batch], host
  // memory), in min(micro_batches(), batch) micro-batches of about equal
  // size; dropout masks from `step`. Overwrites every grad(id) with the
  // gradient of the batch's mean loss; the loss is the batch mean and
  // `correct` the batch's count. Errors as Model::TrainStep's, or the first
  // failing stage's.
  // `options` as Model::TrainStep takes them, for the whole model:
  // params_from_host and grads_to_host for every stage; gradient_queued
  // announces each parameter (whole-model id) once its stage's last
  // backward pass is queued, last stage first (wait with WaitGradient);
  // await_layer_params is called with whole-model layer indices, from the
  // stages' threads, one call at a time, before each layer's first forward
  // pass of the step; before_backward once, before the first backward
  // pass of any stage.
  absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels, int64_t batch,
                                       int64_t step, const TrainStepOptions& options = {});
  // Inference on `batch` examples as Model::Evaluate (parameters from the
  // host copies), in micro-batches of the size training used (or of
  // batch / micro_batches() before any training), one after another.
  absl::StatusOr<EvalResult> Evaluate(const float* features, const int32_t* labels, int64_t batch,
                                      std::vector<float>* logits = nullptr);

  // As Model's, routed to the stage holding param `id` (whole-model id).
  absl::Status UploadParam(int id, int64_t offset, int64_t count);
  absl::Status WaitGradient(int id, int64_t ticket);
  // Every stage's gradients to its host copies (after a step that left them
  // on the devices); waits.
  absl::Status GradsToHost();
  // Device-resident training (benchmarks, tests): every stage's optimizer
  // update, queued, as Model::ApplyOptimizerOnDevice.
  absl::Status ApplyOptimizerOnDevice(OptimizerKind kind, const OptimizerHyperparams& hp);
  // Waits for every stage's queued work.
  absl::Status Synchronize();
  // Compute memory of each stage (Model::compute_memory).
  std::vector<Model::ComputeMemory> compute_memory() const;

 private:
  // What one step's threads share (pipeline.cc).
  struct Step;

  PipelineModel(ModelShape shape, std::vector<StageShape> stage_shapes,
                std::vector<std::unique_ptr<Model>> stages);
  std::pair<Model*, int> Locate(int id) const {
    const int s = param_stage_[id];
    return {stages_[s].get(), id - stage_shapes_[s].first_param};
  }
  // The micro-batches' sizes for `batch` examples: m about equal parts.
  std::vector<int64_t> MicroBatches(int64_t batch) const;
  // InvalidArgument, saying what `call` ("a step") needs, unless `batch` is
  // positive and the features and labels fit the first and last stages.
  absl::Status CheckBatch(absl::string_view call, const float* features, const int32_t* labels,
                          int64_t batch) const;
  // Puts the labels of a step's micro-batches on the last stage's device
  // (queued) and readies StageFeatures for `features`.
  absl::Status StageInputs(const float* features, const int32_t* labels,
                           const std::vector<int64_t>& sizes);
  // Queues the features of the micro-batch of `size` examples from example
  // `begin` (slot-major on their own) to the first stage's device, beside
  // its compute; its next forward pass waits for them. On the first
  // stage's thread.
  absl::Status StageFeatures(int64_t begin, int64_t size);
  // Stage s's part of a training step, on its own thread.
  absl::Status RunStage(Step& step, int s);
  // Copies micro-batch j's inputs of stage s (set `set`) from the stages
  // producing them: on stage s's stream, after their forward passes.
  absl::Status PullInputs(Step& step, int s, int j);
  // Sends micro-batch j's input gradients of stage s back to its
  // producers, on stage s's stream.
  absl::Status PushInputGrads(Step& step, int s, int j);

  const ModelShape shape_;
  const std::vector<StageShape> stage_shapes_;
  const std::vector<std::unique_ptr<Model>> stages_;
  const int micro_batches_;
  const PipelineSpec::Schedule schedule_;
  std::vector<int> param_stage_, state_stage_;
  // Signals per rank: forward pass j done (j), input gradients j sent
  // (micro_batches_ + j); Evaluate's two (forward done, inputs taken) reuse
  // 0 and 1.
  std::unique_ptr<kernels::StreamLink> link_;
  // The micro-batches' features (first stage) and labels (last), in the
  // compute memory, and their host staging.
  kernels::DeviceMemory features_, labels_, host_features_;
  const float* staged_features_ = nullptr;  // The step's, as given.
  int64_t staged_batch_ = 0;
  int64_t capacity_ = 0;  // The largest micro-batch trained so far.
  // Held around the caller's callbacks, which the stages' threads call.
  absl::Mutex callbacks_mu_;
};

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_PIPELINE_H_
