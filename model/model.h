// The model of a job on one device: a Model owns one replica's parameters,
// gradients and activations and runs a training step (forward, then
// backward) or an evaluation on a batch. Its graph is the ModelShape that
// spec/model_shape.h derives from the job's ModelSpec (the same parameter
// list the coordinator places and the shards initialise).
//
// Layers form a DAG: each reads the outputs named in LayerSpec.inputs (by
// default the previous layer's output). The gradient of an output read by
// several layers is the sum of their contributions.
//
// A Model computes on a compute backend (kernels/backend.h), the CPU's or one
// CUDA device's, chosen by ModelOptions::device and created through
// kernels/factory.h. On a GPU its parameters, gradients, activations and
// batch-norm statistics live in device memory; param(id), grad(id) and
// local_state_data(id) are page-locked host copies, and TrainStep / Evaluate
// move them: parameters host->device before the step, gradients (and the
// statistics) device->host after it, the batch beside the compute
// (ComputeBackend::UploadAside). The *OnDevice methods skip those copies,
// for loops that keep everything on the GPU (benchmarks, a local optimizer).
//
// Memory: every activation's values and gradient share one arena, placed by
// their lifetimes in the step. On a GPU every call also measures each
// layer's scratch (cuDNN workspace and the like); after the first training
// step since the capacity grew, and after any step in which some call
// outgrew its planned block, the arena is placed again with every layer's
// scratch in it, live only during that layer's call. In bf16/fp16 the
// activations are stored in that type.
//
// Pipeline stages (model/pipeline.h): a Model may be one stage of a model
// split over devices (CreateStage), which runs a step's micro-batches one
// pass at a time (the Stage* methods), keeps several micro-batches'
// activations at once (each in an activation set of its own: arena, layer
// scratch, boundary buffers), takes earlier stages' outputs as its input and
// hands their gradients back, and adds up its micro-batches' gradients.
//
// Thread safety: Model is thread-compatible: const methods may run
// concurrently; TrainStep and Evaluate mutate internal buffers and need
// external synchronisation. Model owns every buffer it returns pointers to
// and its backend; they stay valid for the Model's lifetime.
#ifndef DOWNPOUR_MODEL_MODEL_H_
#define DOWNPOUR_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/memory_cap.h"
#include "kernels/optimizer.h"
#include "model/loss_scale.h"
#include "proto/job.pb.h"
#include "spec/model_shape.h"
#include "spec/params.h"

namespace downpour {
namespace model_internal {
struct ActivationSet;
struct BackwardArgs;
struct ForwardArgs;
class Layer;
struct Buffer;
struct Storage;

// The part of Model's forward passes that differs between a whole step and
// a stage's micro-batch.
struct PassOptions {
  bool first = true;        // Resets the loss counters and casts reduced weights.
  float loss_weight = 1.f;  // Multiplies the loss's gradient.
};
}  // namespace model_internal

struct StepResult {
  double loss = 0.0;    // Mean over the batch.
  int64_t correct = 0;  // Examples whose argmax is the label.
  // FP16 loss scaling found an inf or NaN gradient: the step's gradients are
  // zeros (never to be applied or pushed) and the scale was lowered.
  bool skipped = false;
  double loss_scale = 1.0;  // The scale the step ran with (1 without scaling).
};

struct EvalResult {
  double loss_sum = 0.0;  // Sum over the batch.
  int64_t correct = 0;
};

// One layer's share of a profiled step (Model::ProfileStepOnDevice).
struct LayerTime {
  std::string name;
  double forward_ms = 0.0;  // Device time (CUDA events) on a GPU.
  double backward_ms = 0.0;
  // Host time spent queueing the layer's work (the same as the above on the
  // CPU, where nothing is queued).
  double host_forward_ms = 0.0;
  double host_backward_ms = 0.0;
  // Scratch (GPU workspace) the layer's forward and backward ask for, as
  // measured and planned into the activation arena.
  int64_t forward_scratch_bytes = 0;
  int64_t backward_scratch_bytes = 0;
};

// What TrainStep moves between the host and the device (a GPU model; the CPU
// computes in place). Multi-GPU replicas move parameters and gradients
// between their devices instead (model/replica_set.h).
struct TrainStepOptions {
  bool params_from_host = true;  // Copy param(id) to the device first.
  bool grads_to_host = true;     // Copy the gradients to grad(id) after.
  // Streams the gradients out during backward: once a layer's backward is
  // queued, its parameters' gradients are queued to grad(id) beside the
  // compute (ComputeBackend::DownloadAside) and gradient_queued(id, ticket)
  // is called for each, in the order backward finishes them (last layer
  // first); Model::WaitGradient(ticket) blocks until grad(id) holds it, on
  // any thread. Each gradient goes to the host once (grads_to_host is
  // moot). With FP16 loss scaling they go after the step's verdict,
  // unscaled (zeros for a skipped step). Called on the TrainStep thread.
  std::function<void(int param_id, int64_t ticket)> gradient_queued;
  // Gradients staying on the device (grads_to_host false, no
  // gradient_queued): once a layer's backward is queued,
  // gradient_on_device(id) is called for each of its parameters, last layer
  // first, so that work behind it on the same stream (a collective) can be
  // queued at once. Not with FP16 loss scaling (the verdict comes after).
  // Called on the TrainStep thread.
  std::function<void(int param_id)> gradient_on_device;
  // Parameters arriving during the step: before the forward of each layer
  // with parameters, await_layer_params(layer) is called (on the TrainStep
  // thread) and returns once that layer's parameters are in param(id) and
  // queued to the device (UploadParam); the layer then waits for those
  // uploads, so the first layers compute while the later ones' parameters
  // are still coming. An error ends the step. With params_from_host false.
  std::function<absl::Status(int layer)> await_layer_params;
  // Called once the forward pass is queued, before the backward pass (the
  // overlapped worker finishes the last step's exchange and starts this
  // one's there); an error ends the step.
  std::function<absl::Status()> before_backward;
  // Sparse embeddings pooled on the device (Model::PooledStaging, written
  // for this batch): the features' sparse slots are not read, and the rows'
  // gradients come back instead of the input gradient.
  bool pooled_rows = false;
};

// One sparse table's part of the block Model::PooledStaging lays out, in
// page-locked host memory (kernels::PooledTable says what each array holds).
struct PooledRows {
  int32_t rows = 0, ids = 0;
  float* values = nullptr;       // rows * dim
  int32_t* offsets = nullptr;    // batch + 1
  int32_t* index = nullptr;      // ids
  int32_t* row_reads = nullptr;  // rows + 1
  int32_t* readers = nullptr;    // ids
  // After a TrainStep with pooled_rows: each row's gradient, rows * dim.
  const float* grads = nullptr;
  // A stored table's (StoredRows): no values; each row's place in the
  // store, and the rows to write there first (their places and values,
  // fresh * dim).
  int32_t* places = nullptr;  // rows
  int32_t fresh = 0;
  int32_t* fresh_places = nullptr;
  float* fresh_values = nullptr;
};

// A table whose rows stay on the device between steps (Model::PooledStaging):
// its store holds `places` rows (grown, keeping what it holds), of which a
// step writes `fresh` before pooling. places 0: the rows come in the block.
struct StoredRows {
  int64_t places = 0;
  int32_t fresh = 0;
};

struct ModelOptions {
  // -1: the CPU kernels. d >= 0: CUDA device d, numbered as this process sees
  // them (after CUDA_VISIBLE_DEVICES).
  int device = -1;
  // GPU convolutions: the layout measured fastest per shape, or one forced
  // (diagnostics and tests).
  kernels::ConvLayout conv_layout = kernels::ConvLayout::kAuto;
  // GPU convolutions through cuDNN's graph API where faster (BackendOptions).
  bool conv_graph = true;
  // Compute precision on a GPU (see proto/job.proto and model/precision.h):
  // FP32 runs convolutions on TF32 tensor cores where cuDNN finds that
  // faster (PyTorch's default), TF32 GEMMs too, FP32_STRICT neither;
  // bf16/fp16 keep activations and their gradients in that type and
  // multiply on tensor cores; parameters, their gradients, statistics and
  // optimizer state stay fp32. The CPU path runs every precision in full
  // fp32 (and says so in the log once per model for TF32, BF16 and FP16).
  Precision precision = FP32;
  // FP16's first loss scale (tests force an overflow with a huge one).
  double initial_loss_scale = DynamicLossScale::kDefaultInitial;
  // > 0: the most compute memory the model's backend may hold, in bytes
  // (kernels::BackendOptions::memory_limit): past it, creation or a step fails with
  // ResourceExhausted naming the device, the size and the limit.
  int64_t memory_limit = 0;
  // Non-null: the caps the model's backends count against, shared with
  // every other model made with them (a worker's replicas of several ranks:
  // --device_memory_limit bounds what they hold together on each device);
  // memory_limit is then unused.
  std::shared_ptr<kernels::MemoryCaps> memory_caps;
  // The job the model trains, named in the lines it logs (common/log.h) so
  // that a worker's node agent forwards them to the job's log (downpourctl
  // logs): why it computes in another precision than asked. Empty: the
  // lines go to stderr only.
  std::string job_id;
};

// What makes a Model one stage of a model split over devices: the pipeline
// of model/pipeline.h builds each stage's shape (model/pipeline_stages.h)
// and drives the stages through the Stage* methods below. The defaults make
// a whole model.
struct StageOptions {
  // Micro-batches the stage holds at once (one forward ahead of its
  // backward each), every one with activations, layer scratch (dropout
  // masks, batch-norm statistics) and boundary buffers of its own.
  int activation_sets = 1;
  // The input slots are earlier stages' outputs: they arrive in the
  // activation type (StageBuffers::input) and their gradient is kept
  // (StageBuffers::input_grad).
  bool boundary_input = false;
  // The index in the whole model of this model's first layer: dropout draws
  // its masks as the whole model's layer would.
  int64_t first_layer = 0;
  // The whole model's ParamInfo of each parameter, by this model's id: their
  // ids seed the initial values. Empty: the model's own.
  std::vector<ParamInfo> init_params;
};

class Model {
 public:
  // Validates `spec` (spec/model_shape.h) and initialises every parameter with
  // InitParamRange(param, seed, ...), so a model built with the same seed holds
  // the same values as the parameter server. Dropout masks are drawn from
  // (seed, layer, step). FailedPrecondition when options.device names no
  // usable CUDA device; ResourceExhausted when memory runs out.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelSpec& spec, uint64_t seed,
                                                       const ModelOptions& options = {});

  // -1 for the CPU, else the CUDA device.
  int device() const { return device_; }
  // As DescribeDevice (model/devices.h).
  const std::string& device_name() const { return device_name_; }
  // The precision the model computes in: options.precision on a GPU (FP32
  // where a graph cannot take BF16/FP16), FP32 on the CPU (whose fp32 is
  // strict).
  Precision precision() const { return precision_; }
  // FP16's current loss scale (1 for other precisions).
  double loss_scale() const { return loss_scaling_ ? loss_scale_.scale() : 1.0; }
  // The parameters this model reads only through their copy in precision()
  // (bf16/fp16 on a GPU: dense and convolution weights), in id order; empty
  // in fp32 and on the CPU. Values rounded to that type beforehand give
  // the same steps, so they may be pulled narrowed.
  const std::vector<int32_t>& reduced_weight_params() const { return reduced_weight_params_; }

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelShape& shape() const { return shape_; }
  const std::vector<ParamInfo>& params() const { return shape_.params; }
  // Elements of one example's features (the product of input_shape).
  int64_t input_size() const { return shape_.input_size; }
  int32_t num_classes() const { return shape_.num_classes; }

  // Contiguous buffers of params()[id].num_elements floats, row-major.
  // REQUIRES: 0 <= id < params().size().
  // Host memory (see the top of this file for a GPU model).
  float* param(int id) { return param_host_ + param_offset_[id]; }
  const float* param(int id) const { return param_host_ + param_offset_[id]; }
  // The gradient of the mean loss with respect to param(id), as of the last
  // TrainStep (zeros before the first).
  float* grad(int id) { return grad_host_ + param_offset_[id]; }
  const float* grad(int id) const { return grad_host_ + param_offset_[id]; }

  // Forward in training mode (dropout active, masks from seed and `step`;
  // batch norm normalises with the batch's statistics and moves its running
  // ones), then backward: overwrites every grad(id). `features` is
  // [batch, input_size()], `labels` is [batch].
  // InvalidArgument for batch <= 0, null pointers, a label outside
  // [0, num_classes()), or a feature read by an embedding that is not an
  // integer id in [0, vocab_size).
  absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels, int64_t batch,
                                       int64_t step, const TrainStepOptions& options = {});
  // Copies the device gradients to grad(id) and waits (after a TrainStep
  // that left them on the device).
  absl::Status GradsToHost();
  // Waits until the gradient TrainStepOptions::gradient_queued announced
  // with `ticket` is in grad(id); ticket < 0: it already is. Thread-safe.
  absl::Status WaitGradient(int64_t ticket) {
    return ticket < 0 ? absl::OkStatus() : backend_->WaitDownload(ticket);
  }
  // The backend the model computes on: work queued on it (a device group's
  // collectives, model/replica_set.h) runs after the model's work so far.
  kernels::ComputeBackend& backend() { return *backend_; }

  // Local state (see ModelShape::local_state): batch norm's running
  // statistics, updated by TrainStep and read by Evaluate.
  // REQUIRES: 0 <= id < local_state().size().
  const std::vector<ParamInfo>& local_state() const { return shape_.local_state; }
  // On a GPU model, a copy refreshed by each TrainStep; writes to it do not
  // reach the device.
  float* local_state_data(int id) { return state_host_ + state_offset_[id]; }
  const float* local_state_data(int id) const { return state_host_ + state_offset_[id]; }
  // Restores state a checkpoint saved: the caller writes local_state_data(id)
  // for every id, then this copies it to the device (a no-op on the CPU) and
  // sets FP16's loss scale (ignored for other precisions).
  absl::Status RestoreLocalState(double loss_scale);

  // Forward in inference mode (dropout is the identity, batch norm uses the
  // running statistics); grads untouched. With `logits`, also the loss
  // layer's input, [batch, num_classes()] (for AUC and the like). With
  // `pooled_rows`, the sparse slots are pooled on the device from
  // PooledStaging's block, as TrainStepOptions::pooled_rows has a step do.
  absl::StatusOr<EvalResult> Evaluate(const float* features, const int32_t* labels, int64_t batch,
                                      std::vector<float>* logits = nullptr,
                                      bool pooled_rows = false);

  // On a GPU: the page-locked host buffer a TrainStep or Evaluate of up to
  // `batch` examples copies its features into before they go up (grown to
  // hold `batch`), for a caller that writes them there itself: a step whose
  // `features` is this buffer skips that copy (7 MB a step for the click
  // model). Valid until a call with a larger batch; free to write once the
  // last TrainStep or Evaluate returned. Null on the CPU (its steps read the
  // features where they are).
  absl::StatusOr<float*> FeatureStaging(int64_t batch);

  // Sparse embeddings (shape().sparse_tables): after a TrainStep of `batch`
  // examples, the gradient of the mean loss with respect to the model input,
  // [batch * input_size()] slot-major as the features: a sparse embedding's
  // slot (shape().input_slots) holds the gradient of its pooled rows, from
  // which the rows' gradients follow. Host memory; null without sparse
  // embeddings.
  const float* input_grad() const;

  // Sparse embeddings pooled on the GPU: a caller holding a batch's rows
  // writes them, and which rows each example reads, into the block laid out
  // here for `batch` examples reading rows[t] distinct rows through ids[t]
  // ids of table t (shape().sparse_tables order), and trains with
  // TrainStepOptions::pooled_rows: the step uploads the features' dense
  // slots and the block, pools each table's slot on the device
  // (kernels::ComputeBackend::PoolRows, the host's sums bit for bit) and
  // brings each row's gradient back (PooledRows::grads, within rounding of
  // the host's sums) instead of input_grad: a quarter of the bytes both ways for the click model,
  // and no pooling on the host. Valid until the next call; free to write once the last TrainStep
  // returned. Null on the CPU and without sparse tables. With `stored`
  // (per table, or empty), a table with stored places keeps its rows in a
  // store on the device between steps: the block carries each row's place
  // there and the step's fresh rows, not every row's values.
  absl::StatusOr<std::vector<PooledRows>*> PooledStaging(
      int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
      const std::vector<StoredRows>& stored = {});

  // ---- Device-resident training: nothing is copied to or from the host.
  // The compute memory of param(id) / grad(id) (the same pointers on the CPU).
  float* device_param(int id);
  float* device_grad(int id);
  // Queues forward and backward on `features` and `labels` in the compute
  // memory and returns without waiting (on a GPU). Labels and ids are not
  // checked. REQUIRES: 0 < batch, valid labels (as TrainStep checks).
  absl::Status TrainStepOnDevice(const float* features, const int32_t* labels, int64_t batch,
                                 int64_t step);
  // As TrainStepOnDevice, timing every layer's forward and backward (device
  // events on a GPU, so each time is the layer's own queued work); waits.
  // For diagnostics: the events cost a little launch time.
  absl::StatusOr<std::vector<LayerTime>> ProfileStepOnDevice(const float* features,
                                                             const int32_t* labels, int64_t batch,
                                                             int64_t step);
  // Waits for the last TrainStepOnDevice and returns its loss. With FP16 it
  // also reads the non-finite flag and moves the loss scale, so it must be
  // called once per step before ApplyOptimizerOnDevice.
  absl::StatusOr<StepResult> LastStepResult();
  // Queues the optimizer update of every parameter with its gradient, in the
  // compute memory, in one fused launch on a GPU; the slots (momentum, Adam
  // moments) live beside the parameters, zeros at first. `hp.step` counts
  // from 1. Does nothing after a step LastStepResult reported skipped.
  absl::Status ApplyOptimizerOnDevice(OptimizerKind kind, const OptimizerHyperparams& hp);
  // Waits for everything queued.
  absl::Status Synchronize();
  // Copies param(id) (host) to the compute memory, queued.
  absl::Status ParamsToDevice();
  // Queues elements [offset, offset + count) of param(id) to the compute
  // memory beside the compute (ComputeBackend::UploadAside), so parameters
  // go up as they arrive; the next TrainStep with params_from_host = false
  // waits for them. Thread-safe against other UploadParam calls (not
  // against TrainStep or Evaluate). A no-op on the CPU.
  absl::Status UploadParam(int id, int64_t offset, int64_t count);
  // ---- Pipeline stages (model/pipeline.h drives them; a Model made by
  // Create needs none of this). A stage's step: BeginStageStep, then for
  // each micro-batch a StageForward and later a StageBackward in the same
  // activation set, then EndStageStep. The copies between stages go to and
  // from stage_buffers(set). All queued: nothing waits but where said.
  //
  // A model of `shape`, a stage's (its layers re-indexed, earlier stages'
  // outputs as its input slots, a kStageOutput last layer where later
  // stages read its outputs). Errors as Create's.
  static absl::StatusOr<std::unique_ptr<Model>> CreateStage(ModelShape shape, uint64_t seed,
                                                            const ModelOptions& options,
                                                            const StageOptions& stage);
  int activation_sets() const { return stage_.activation_sets; }
  // Where set `set`'s boundary tensors lie, in the compute memory and the
  // activation type, each [batch, width] example-major for the set's
  // micro-batch of `batch` examples: the input slot k at input + batch *
  // offset (shape().input_slots), its gradient likewise at input_grad; the
  // kStageOutput layer's input k at outputs[k], and the gradient that came
  // back for it at output_grad, block after block in input order. Null
  // where the stage has none. Valid until a BeginStageStep or Evaluate that
  // grows the capacity, or an EndStageStep that plans the scratch.
  // REQUIRES: 0 <= set < activation_sets().
  struct StageBuffers {
    kernels::Act input, input_grad;
    std::vector<kernels::Act> outputs;
    kernels::Act output_grad;
  };
  StageBuffers stage_buffers(int set) const;
  // Readies a step of micro-batches of at most `capacity` examples: grows
  // the buffers, queues param(id) to the device when params_from_host,
  // casts the bf16/fp16 weight copies (unless `weights_arrive`: the
  // parameters come during the step, and each layer's first forward pass
  // casts its own as they do), and resets the loss counters.
  absl::Status BeginStageStep(int64_t capacity, bool params_from_host, bool weights_arrive = false);
  // Queues a micro-batch's forward pass in set `set` (training: dropout
  // masks drawn from `mask_step`, batch norm's running statistics moved).
  // `features`: [batch, input_size()] floats in the compute memory, for a
  // stage reading the model input (the first); otherwise the set's input
  // buffer holds the micro-batch. `labels`: [batch] in the compute memory
  // for the stage with the loss, else null. The loss's gradient is
  // multiplied by `loss_weight` (the micro-batch's share of the step's
  // batch: the step's gradient is the batch mean). `first`: the step's
  // first forward pass (with `await`, TrainStepOptions::await_layer_params,
  // each layer awaits its parameters and casts its reduced copy then).
  // REQUIRES: batch <= the capacity; inputs checked (CheckStageBatch).
  absl::Status StageForward(int set, const float* features, const int32_t* labels, int64_t batch,
                            int64_t mask_step, float loss_weight, bool training, bool first,
                            const std::function<absl::Status(int)>* await = nullptr);
  // Queues the backward pass of set `set`'s micro-batch (its last training
  // StageForward), its parameter gradients overwriting the step's (`first`)
  // or added to them. REQUIRES: output_grad holds the gradients sent back.
  absl::Status StageBackward(int set, int64_t batch, bool first);
  // Ends a training step: measures and plans the scratch after the first
  // one (waits), then queues the gradients to grad(id) (grads_to_host), or
  // streams them announced to `queued` as TrainStepOptions::gradient_queued
  // says, and the local state to local_state_data(id).
  absl::Status EndStageStep(bool grads_to_host,
                            const std::function<void(int, int64_t)>* queued = nullptr);
  // The loss counters since BeginStageStep: the sum over the forward
  // passes' examples and the correct count (the stage with the loss). Waits.
  absl::StatusOr<kernels::LossStats> ReadStageLoss();
  // Appends the last forward pass's logits (the loss layer's input) as
  // floats. Waits.
  absl::Status AppendStageLogits(int64_t batch, std::vector<float>* logits);
  // As TrainStep checks its batch: the labels (a stage with the loss) and
  // ids read from the features (a stage reading the model input).
  absl::Status CheckStageBatch(const float* features, const int32_t* labels, int64_t batch) const;

  // Compute memory the model holds now, by use.
  struct ComputeMemory {
    int64_t parameters = 0;  // Parameters, gradients, optimizer slots, state.
    // The activation arena (with every layer's scratch, once measured; a
    // stage's, one per activation set, with its boundary buffers) and the
    // staged batch.
    int64_t activations = 0;
    int64_t workspace = 0;      // The GPU's scratch (cuDNN's and ours).
    int64_t weight_copies = 0;  // bf16/fp16 copies of the weights.
    int64_t total() const { return parameters + activations + workspace + weight_copies; }
  };
  ComputeMemory compute_memory() const;

 private:
  Model(ModelShape shape, uint64_t seed, int device, std::string device_name, Precision precision,
        double initial_loss_scale, StageOptions stage);

  // FP16: takes the step's scale and clears the non-finite flag.
  absl::Status BeginLossScaling();
  // FP16: after Backward, unscales the gradients and flags non-finite ones.
  absl::Status UnscaleGradients();
  // FP16: reads the flag (waits), moves the scale; true when the step is
  // skipped (its gradients are then zeroed on the device).
  absl::StatusOr<bool> FinishLossScaling();
  absl::Status Init(std::unique_ptr<kernels::ComputeBackend> backend);
  absl::Status CheckBatch(const float* features, const int32_t* labels, int64_t batch) const;
  // A step or evaluation of `batch` examples with pooled rows needs a GPU
  // and PooledStaging's block laid out for that batch.
  absl::Status CheckPooled(int64_t batch, bool pooled_rows) const;
  absl::Status Reserve(int64_t batch);
  // Places the activation arena for `batch` examples, with each layer's
  // measured scratch (scratch_need_) as blocks of their own.
  absl::Status PlanArena(int64_t batch);
  // After a measured training step: the arena again, with room for every
  // layer's scratch, which the layers then borrow instead of the backend's
  // own (freed).
  absl::Status PlanScratch();
  // Whether the step just run calls for PlanScratch.
  bool ScratchToPlan() const;
  // Runs layer i's forward (f) or backward (b), measuring or lending its
  // scratch.
  absl::Status RunLayer(size_t i, bool forward, const model_internal::ForwardArgs* f,
                        const model_internal::BackwardArgs* b);
  // Puts a host batch into the compute memory (a copy on the GPU) and points
  // input_/labels_ at it.
  absl::Status StageBatch(const float* features, const int32_t* labels, int64_t batch,
                          bool pooled = false);
  // Floats of an example's dense input slots (they precede the sparse ones).
  int64_t DenseInputFloats() const;
  // Table `table`'s row store (PooledStaging's StoredRows), grown to hold
  // at least `places` rows, keeping what it holds.
  absl::Status GrowRowStore(int table, int64_t places);
  // A pooled step: uploads PooledStaging's block and queues the pooling.
  absl::Status PoolStagedRows(int64_t batch);
  // GPU: grows the staging buffers (host and device) to hold `batch`.
  absl::Status GrowStaging(int64_t batch);
  // Runs every layer's forward, adding the loss to the backend's counters; dropout
  // is active only when training.
  // With `await` (TrainStepOptions::await_layer_params), each layer with
  // parameters waits for them, and bf16/fp16 casts its weights as it goes.
  absl::Status Forward(int64_t batch, bool training, int64_t step,
                       const std::function<absl::Status(int)>* await = nullptr,
                       const model_internal::PassOptions& pass = {});
  // Streams each layer's parameter gradients out as its backward is queued
  // when `queued` is set (TrainStepOptions::gradient_queued).
  // `on_device`: TrainStepOptions::gradient_on_device's, when set.
  absl::Status Backward(int64_t batch, const std::function<void(int, int64_t)>* queued = nullptr,
                        const std::function<void(int)>* on_device = nullptr);
  // Queues the gradients of params [first, last] (ids, contiguous) to the
  // host and announces each to `queued`, last id first.
  absl::Status StreamGradients(int first, int last,
                               const std::function<void(int, int64_t)>& queued);
  kernels::Act Activation(int buffer) const;
  // What a layer input (a layer index, or a model-input slot) reads.
  kernels::Act InputOf(int input, int64_t batch) const;
  // The model-input slot layer `layer` reads as given (floats), or null.
  const float* ModelInputOf(int layer, int64_t batch) const;
  // Copies the loss layer's input to `logits` as floats (waits).
  absl::Status ReadLogits(int64_t batch, std::vector<float>* logits);
  // Profiling: marks slot on the device and on the host.
  absl::Status MarkLayer(int slot);
  // Creates the current set's layers over the parameters (Init), fusing
  // each convolution of `fused` into the ReLU that follows it.
  void MakeLayers(const std::vector<std::pair<int, int>>& fused);
  // Makes set `set` the current one (the activations, layers and boundary
  // buffers the passes use), swapping the current one out.
  void UseSet(int set);
  void SwapCurrentSet(model_internal::ActivationSet& other);
  // The compute memory of model input slot `slot` for `batch` examples: the
  // floats given, or their copy in the activation type.
  kernels::Act SlotInput(int slot, int64_t batch) const;
  // Shared by Create and CreateStage.
  static absl::StatusOr<std::unique_ptr<Model>> CreateFromShape(ModelShape shape, uint64_t seed,
                                                                const ModelOptions& options,
                                                                StageOptions stage);

  const ModelShape shape_;
  const StageOptions stage_;
  // The kStageOutput layer (a stage whose outputs later stages read), or -1.
  const int output_layer_;
  int current_set_ = 0;  // The activation set the passes use.
  // How backward writes parameter gradients (a stage's later micro-batches
  // add theirs).
  kernels::Write param_write_ = kernels::Write::kOverwrite;
  const uint64_t seed_;
  const int device_;
  std::vector<int32_t> reduced_weight_params_;  // Set by Init.
  const std::string device_name_;
  const Precision precision_;
  const bool loss_scaling_;  // FP16 on a GPU.
  DynamicLossScale loss_scale_;
  double step_scale_ = 1.0;    // The scale the current step runs with.
  bool last_skipped_ = false;  // LastStepResult's verdict.
  std::unique_ptr<kernels::ComputeBackend> backend_;
  std::unique_ptr<model_internal::Storage> storage_;
  // Every parameter (gradient, state tensor) in one block, tensor `id` at
  // offset [id]. Host copies: the compute memory itself on the CPU.
  std::vector<int64_t> param_offset_, state_offset_;
  int64_t param_total_ = 0, state_total_ = 0;  // Elements.
  float* param_host_ = nullptr;
  float* grad_host_ = nullptr;
  float* state_host_ = nullptr;
  float* param_compute_ = nullptr;
  float* grad_compute_ = nullptr;
  float* state_compute_ = nullptr;
  // The current step's input, in the compute memory.
  const float* input_ = nullptr;
  const int32_t* labels_ = nullptr;
  int64_t last_batch_ = 0;
  std::vector<std::unique_ptr<model_internal::Layer>> layers_;
  bool profiling_ = false;          // Forward/Backward mark each layer.
  std::vector<double> host_marks_;  // Profiling: host seconds at each mark.
  // Activations are of a reduced type and some layer other than an
  // embedding reads the model input: Forward converts it first.
  bool input_to_activations_ = false;
  // Per layer, [2i] forward and [2i + 1] backward: the most scratch its
  // calls have asked for since the capacity last grew, and where the arena
  // keeps it once planned.
  std::vector<int64_t> scratch_need_;
  std::vector<char*> scratch_at_;
  bool scratch_planned_ = false;
  // PooledStaging's block: the tables' views, the batch it was laid out
  // for (-1: none), its bytes in use, its descriptors (kernels::PooledTable,
  // at the block's start) and the most work a table gives each kernel.
  std::vector<PooledRows> pooled_;
  int64_t pooled_batch_ = -1;
  size_t pooled_bytes_ = 0, pooled_grad_bytes_ = 0;
  int64_t most_pool_work_ = 0, most_grad_work_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_MODEL_H_
