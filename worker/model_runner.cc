#include "worker/model_runner.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "model/pipeline.h"
#include "model/replica_set.h"

namespace downpour {
namespace {

// Sets the host copy of `model`'s local state (a Model's, or a
// PipelineModel's, by whole-model id) to `values`.
template <typename M>
void CopyLocalState(const std::vector<const float*>& values, M* model) {
  for (const ParamInfo& state : model->local_state()) {
    std::memcpy(model->local_state_data(state.id), values[state.id],
                sizeof(float) * state.num_elements);
  }
}

// Data parallelism: a replica per device; replica 0 holds the host copies
// the trainer reads and writes.
class ReplicaRunner : public ModelRunner {
 public:
  explicit ReplicaRunner(std::unique_ptr<ReplicaSet> replicas)
      : replicas_(std::move(replicas)), primary_(replicas_->primary()) {}

  std::vector<std::string> Describe() const override {
    std::vector<std::string> lines;
    for (int r = 0; r < replicas_->size(); ++r) {
      const Model& replica = *replicas_->replica(r);
      lines.push_back(absl::StrCat("model replica on ", replica.device_name(), ", ",
                                   Precision_Name(replica.precision())));
    }
    return lines;
  }
  const ModelShape& shape() const override { return primary_->shape(); }
  float* param(int id) override { return primary_->param(id); }
  const float* grad(int id) const override { return primary_->grad(id); }
  const float* local_state_data(int id) const override { return primary_->local_state_data(id); }
  int device() const override { return primary_->device(); }
  Precision precision() const override { return primary_->precision(); }
  double loss_scale() const override { return primary_->loss_scale(); }
  bool uploads_pulled_params() const override {
    return primary_->device() >= 0 && (replicas_->size() == 1 || replicas_->reduces_with_nccl());
  }
  bool reads_host_params() const override {
    return replicas_->size() == 1 && primary_->device() < 0;
  }
  std::vector<int32_t> reduced_weight_params() const override {
    // Replicas of one model in one precision register the same weights,
    // a CPU replica none.
    for (int r = 0; r < replicas_->size(); ++r) {
      if (replicas_->replica(r)->reduced_weight_params().empty()) return {};
    }
    return primary_->reduced_weight_params();
  }
  absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels, int64_t batch,
                                       int64_t step, const TrainStepOptions& options) override {
    return replicas_->TrainStep(features, labels, batch, step, options);
  }
  absl::StatusOr<EvalResult> Evaluate(const float* features, const int32_t* labels, int64_t batch,
                                      std::vector<float>* logits, bool pooled_rows) override {
    return primary_->Evaluate(features, labels, batch, logits, pooled_rows);
  }
  int64_t EvaluateBatch(int64_t batch) const override {
    // ReplicaSet's largest slice.
    return (batch + replicas_->size() - 1) / replicas_->size();
  }
  absl::Status UploadParam(int id, int64_t offset, int64_t count) override {
    return replicas_->UploadParam(id, offset, count);
  }
  absl::Status WaitGradient(int id, int64_t ticket) override {
    return replicas_->WaitGradient(id, ticket);
  }
  absl::Status RestoreLocalState(const std::vector<const float*>& values,
                                 double loss_scale) override {
    for (int r = 0; r < replicas_->size(); ++r) {
      Model* replica = replicas_->replica(r);
      CopyLocalState(values, replica);
      RETURN_IF_ERROR(replica->RestoreLocalState(loss_scale));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<float*> FeatureStaging(int64_t batch) override {
    if (replicas_->size() != 1) return nullptr;
    return primary_->FeatureStaging(batch);
  }
  absl::StatusOr<std::vector<PooledRows>*> PooledStaging(
      int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
      const std::vector<StoredRows>& stored) override {
    if (replicas_->size() != 1) return nullptr;
    return primary_->PooledStaging(batch, rows, ids, stored);
  }
  const Model* whole_model() const override { return primary_; }

 private:
  const std::unique_ptr<ReplicaSet> replicas_;
  Model* const primary_;
};

// Model parallelism: the stages of one model, which routes every id to the
// stage holding it.
class PipelineRunner : public ModelRunner {
 public:
  explicit PipelineRunner(std::unique_ptr<PipelineModel> pipeline)
      : pipeline_(std::move(pipeline)) {}

  std::vector<std::string> Describe() const override {
    const int stages = pipeline_->num_stages();
    return {absl::StrCat("pipeline of ", stages, stages == 1 ? " stage" : " stages", " in ",
                         pipeline_->micro_batches(), " micro-batches (",
                         PipelineSpec::Schedule_Name(pipeline_->schedule()), "): ",
                         pipeline_->device_name(), ", ", Precision_Name(pipeline_->precision()))};
  }
  const ModelShape& shape() const override { return pipeline_->shape(); }
  float* param(int id) override { return pipeline_->param(id); }
  const float* grad(int id) const override { return pipeline_->grad(id); }
  const float* local_state_data(int id) const override { return pipeline_->local_state_data(id); }
  int device() const override { return pipeline_->device(); }
  Precision precision() const override { return pipeline_->precision(); }
  double loss_scale() const override { return pipeline_->loss_scale(); }
  // Each stage's parameters go up to its own device (the stages are all on
  // the CPU or all on GPUs).
  bool uploads_pulled_params() const override { return pipeline_->device() >= 0; }
  bool reads_host_params() const override { return pipeline_->device() < 0; }
  // Stages number their parameters apart from the whole model's.
  std::vector<int32_t> reduced_weight_params() const override { return {}; }
  absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels, int64_t batch,
                                       int64_t step, const TrainStepOptions& options) override {
    return pipeline_->TrainStep(features, labels, batch, step, options);
  }
  absl::StatusOr<EvalResult> Evaluate(const float* features, const int32_t* labels, int64_t batch,
                                      std::vector<float>* logits, bool pooled_rows) override {
    // PooledStaging gives a pipeline no block.
    if (pooled_rows) return absl::InternalError("a pipeline's evaluation with pooled rows");
    return pipeline_->Evaluate(features, labels, batch, logits);
  }
  int64_t EvaluateBatch(int64_t batch) const override { return batch; }
  absl::Status UploadParam(int id, int64_t offset, int64_t count) override {
    return pipeline_->UploadParam(id, offset, count);
  }
  absl::Status WaitGradient(int id, int64_t ticket) override {
    return pipeline_->WaitGradient(id, ticket);
  }
  absl::Status RestoreLocalState(const std::vector<const float*>& values,
                                 double loss_scale) override {
    CopyLocalState(values, pipeline_.get());
    return pipeline_->RestoreLocalState(loss_scale);
  }
  absl::StatusOr<float*> FeatureStaging(int64_t) override { return nullptr; }
  absl::StatusOr<std::vector<PooledRows>*> PooledStaging(int64_t, const std::vector<int32_t>&,
                                                         const std::vector<int32_t>&,
                                                         const std::vector<StoredRows>&) override {
    return nullptr;
  }
  const Model* whole_model() const override { return nullptr; }

 private:
  const std::unique_ptr<PipelineModel> pipeline_;
};

std::string Count(int64_t n, const char* what) {
  return absl::StrCat(n, " ", what, n == 1 ? "" : "s");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const JobSpec& spec,
                                                                 const std::vector<int>& devices,
                                                                 const ModelOptions& options) {
  ModelOptions model_options = options;
  model_options.precision = spec.precision();
  if (spec.model().has_pipeline()) {
    const int stages = spec.model().pipeline().stage_size();
    if (stages > 0 && !devices.empty() && static_cast<int>(devices.size()) != stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("the job's pipeline has ", Count(stages, "stage"), "; this worker has ",
                       Count(static_cast<int64_t>(devices.size()), "device"), " (--devices)"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> pipeline,
                     PipelineModel::Create(spec.model(), spec.seed(),
                                           devices.empty() ? std::vector<int>(stages, -1) : devices,
                                           model_options));
    return std::make_unique<PipelineRunner>(std::move(pipeline));
  }
  std::vector<std::unique_ptr<Model>> replicas;
  for (int device : devices.empty() ? std::vector<int>{-1} : devices) {
    model_options.device = device;
    ASSIGN_OR_RETURN(std::unique_ptr<Model> replica,
                     Model::Create(spec.model(), spec.seed(), model_options));
    const bool sparse = !replica->shape().sparse_tables.empty();
    replicas.push_back(std::move(replica));
    // A model with sparse embeddings trains on one device: its rows are
    // pulled, pooled and pushed once per step for the one batch (a worker
    // of several GPUs gives it the first; `Describe` names it).
    if (sparse) break;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ReplicaSet> replica_set,
                   ReplicaSet::Create(std::move(replicas)));
  return std::make_unique<ReplicaRunner>(std::move(replica_set));
}

}  // namespace downpour
