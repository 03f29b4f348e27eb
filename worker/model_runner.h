// ModelRunner: the job's model as the trainer drives it, whichever way this
// worker's devices hold it — replicas of the whole model, one per device,
// each training a slice of the batch (data parallelism, model/replica_set.h;
// replica 0 exchanges and evaluates), or one model split into pipeline
// stages, stage i on the i-th device, each step's batch cut into
// micro-batches (model parallelism, model/pipeline.h; ModelSpec.pipeline).
//
// Both present the whole model's parameter list (InferModel's ids, the list
// the coordinator places and the shards hold) with host copies of its
// parameters and of the last step's batch-mean gradient: what the exchange
// pulls into and pushes from. The trainer needs nothing else of the model,
// so it never asks which way it is split.
//
// Thread safety: as the models underneath — thread-compatible (one thread
// trains, evaluates and restores at a time; TrainStep starts and joins its
// own threads and may call the options' hooks from them, one at a time),
// except UploadParam and WaitGradient, which are safe against each other.
// Owns the models.
#ifndef DOWNPOUR_WORKER_MODEL_RUNNER_H_
#define DOWNPOUR_WORKER_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"
#include "proto/job.pb.h"
#include "spec/model_shape.h"

namespace downpour {

class ModelRunner {
 public:
  // The job's model (spec.model(), initialised from spec.seed(), in
  // spec.precision()) on `devices`, CUDA device numbers (--devices; empty:
  // the CPU), each model created with `options` but for its device:
  // - without ModelSpec.pipeline, a replica per device (one on the CPU);
  //   sparse embeddings take one device (Unimplemented otherwise);
  // - with it, stage i on devices[i], or every stage on the CPU when
  //   `devices` is empty; InvalidArgument when the devices are not one per
  //   stage ("the job's pipeline has 4 stages; this worker has 2 devices
  //   (--devices)").
  // Every error is the job's (it would recur on another try): a bad spec,
  // a device that cannot hold the model (ResourceExhausted past
  // options.memory_limit or options.memory_caps, naming the device).
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const JobSpec& spec,
                                                             const std::vector<int>& devices,
                                                             const ModelOptions& options = {});

  virtual ~ModelRunner() = default;

  // Where the model computes, one line per replica ("model replica on cpu,
  // FP32") or one for the pipeline ("pipeline of 2 stages in 8
  // micro-batches (ONE_F_ONE_B): stage 0 on cpu, stage 1 on cpu, FP32").
  virtual std::vector<std::string> Describe() const = 0;

  // The whole model's shape, parameters and local state (batch norm's
  // running statistics).
  virtual const ModelShape& shape() const = 0;
  const std::vector<ParamInfo>& params() const { return shape().params; }
  const std::vector<ParamInfo>& local_state() const { return shape().local_state; }

  // Host copies, by whole-model id: the parameter (what the next step
  // trains from), the gradient of the last TrainStep's batch-mean loss, and
  // the local state (replica 0's with several).
  // REQUIRES: 0 <= id < params().size() (local_state().size()).
  virtual float* param(int id) = 0;
  virtual const float* grad(int id) const = 0;
  virtual const float* local_state_data(int id) const = 0;

  // The device the first replica or stage computes on (-1: the CPU), its
  // precision and FP16's loss scale (1 otherwise).
  virtual int device() const = 0;
  virtual Precision precision() const = 0;
  virtual double loss_scale() const = 0;

  // Whether parameters may go up to the devices as the exchange pulls them
  // in (UploadParam) for a step that then trains with params_from_host
  // false: a GPU model, and several replicas only where they reduce with
  // NCCL (the host path reads the host copy).
  virtual bool uploads_pulled_params() const = 0;
  // Whether a step's forward reads the parameters where the pull writes
  // them, param(id) in host memory: one replica, or every stage, on the
  // CPU. Such a step may start while the last step's pull is still landing,
  // awaiting each layer's parameters (TrainStepOptions::await_layer_params).
  virtual bool reads_host_params() const = 0;
  // The parameters every replica reads only through a copy in precision()
  // (Model::reduced_weight_params), which may be pulled narrowed; empty
  // where any replica reads them in fp32 (the CPU), and for a pipeline.
  virtual std::vector<int32_t> reduced_weight_params() const = 0;

  // One training step on `batch` examples (model/model.h's TrainStep, with
  // the options as ReplicaSet::TrainStep or PipelineModel::TrainStep takes
  // them): leaves the batch-mean gradient in grad(id).
  virtual absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels,
                                               int64_t batch, int64_t step,
                                               const TrainStepOptions& options) = 0;
  // Inference on `batch` examples from the host parameters (Model::Evaluate;
  // `pooled_rows` only after PooledStaging gave a block).
  virtual absl::StatusOr<EvalResult> Evaluate(const float* features, const int32_t* labels,
                                              int64_t batch, std::vector<float>* logits,
                                              bool pooled_rows) = 0;
  // The most examples an Evaluate may take and hold no more device memory
  // than a training step of `batch`: the slice one replica trains (replica 0
  // evaluates the whole batch), or the batch (a pipeline evaluates in
  // micro-batches).
  virtual int64_t EvaluateBatch(int64_t batch) const = 0;
  // Queues elements [offset, offset + count) of param(id) to the device
  // that reads them. Only where uploads_pulled_params().
  virtual absl::Status UploadParam(int id, int64_t offset, int64_t count) = 0;
  // Waits until the gradient TrainStepOptions::gradient_queued announced
  // with `ticket` is in grad(id).
  virtual absl::Status WaitGradient(int id, int64_t ticket) = 0;

  // Sets the local state of every replica or stage to `values` (by
  // local_state() id, num_elements floats each) and FP16's loss scale: a
  // checkpoint's (worker/worker_state.h).
  virtual absl::Status RestoreLocalState(const std::vector<const float*>& values,
                                         double loss_scale) = 0;

  // Where the caller may write a batch's features for TrainStep and
  // Evaluate to take without a copy (Model::FeatureStaging): one replica on
  // a GPU; null otherwise (the steps copy them, or read them in place).
  virtual absl::StatusOr<float*> FeatureStaging(int64_t batch) = 0;
  // One replica on a GPU: the block a step's sparse rows are pooled from on
  // the device (Model::PooledStaging, trained with
  // TrainStepOptions::pooled_rows); null otherwise (the caller pools them).
  virtual absl::StatusOr<std::vector<PooledRows>*> PooledStaging(
      int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
      const std::vector<StoredRows>& stored) = 0;

  // The whole model as one Model (replica 0), or null when it is split into
  // stages. Sparse embeddings read its input gradient; a pipeline has none
  // (refused at submit).
  virtual const Model* whole_model() const = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_MODEL_RUNNER_H_
