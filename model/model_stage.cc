// Model's pipeline-stage methods (model.h, "Pipeline stages"): a stage's
// step in micro-batches, each in an activation set of its own, with its
// boundary buffers for the copies between stages (model/pipeline.h).
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/model_storage.h"

namespace downpour {

Model::StageBuffers Model::stage_buffers(int set) const {
  const model_internal::Storage& st = *storage_;
  const bool current = set == current_set_;
  const model_internal::ActivationSet& other = st.sets[set];
  auto memory = [&](const kernels::DeviceMemory& mine, const kernels::DeviceMemory& theirs) {
    return kernels::Act((current ? mine : theirs).as<void>());
  };
  StageBuffers buffers;
  if (stage_.boundary_input) {
    buffers.input = memory(st.input_activations, other.input_activations);
    buffers.input_grad = memory(st.boundary_grad, other.boundary_grad);
  }
  if (output_layer_ >= 0) {
    for (int input : shape_.layers[output_layer_].inputs) {
      const int b = st.buffer_of_layer[input];
      buffers.outputs.push_back(kernels::Act(current ? st.buffers[b].value_data : other.value[b]));
    }
    buffers.output_grad = memory(st.output_grad, other.output_grad);
  }
  return buffers;
}

absl::Status Model::BeginStageStep(int64_t capacity, bool params_from_host, bool weights_arrive) {
  RETURN_IF_ERROR(backend_->MakeCurrent());
  if (capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stage's micro-batches need a positive capacity, got ", capacity));
  }
  RETURN_IF_ERROR(Reserve(capacity));
  if (params_from_host) RETURN_IF_ERROR(ParamsToDevice());
  // Here rather than at the first forward pass, which waits for the earlier
  // stages: the cast runs while this stage has nothing else to do.
  if (!weights_arrive) RETURN_IF_ERROR(backend_->CastReducedWeights());
  RETURN_IF_ERROR(BeginLossScaling());
  return backend_->ResetLoss();
}

absl::Status Model::StageForward(int set, const float* features, const int32_t* labels,
                                 int64_t batch, int64_t mask_step, float loss_weight, bool training,
                                 bool first, const std::function<absl::Status(int)>* await) {
  if (set < 0 || set >= stage_.activation_sets || batch <= 0 || batch > storage_->capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a stage's forward pass of ", batch, " examples in activation set ", set, " of ",
        stage_.activation_sets, " does not fit its capacity of ", storage_->capacity));
  }
  UseSet(set);
  input_ = features;
  labels_ = labels;
  last_batch_ = batch;
  model_internal::PassOptions pass;
  pass.first = false;  // BeginStageStep reset the loss.
  pass.loss_weight = loss_weight;
  return Forward(batch, training, mask_step, first ? await : nullptr, pass);
}

absl::Status Model::StageBackward(int set, int64_t batch, bool first) {
  if (set < 0 || set >= stage_.activation_sets || batch <= 0 || batch > storage_->capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a stage's backward pass of ", batch, " examples in activation set ", set, " of ",
        stage_.activation_sets, " does not fit its capacity of ", storage_->capacity));
  }
  UseSet(set);
  param_write_ = first ? kernels::Write::kOverwrite : kernels::Write::kAccumulate;
  absl::Status s = Backward(batch);
  param_write_ = kernels::Write::kOverwrite;
  return s;
}

absl::Status Model::EndStageStep(bool grads_to_host,
                                 const std::function<void(int, int64_t)>* queued) {
  if (ScratchToPlan()) RETURN_IF_ERROR(PlanScratch());
  RETURN_IF_ERROR(UnscaleGradients());
  if (queued != nullptr && *queued != nullptr && !params().empty()) {
    RETURN_IF_ERROR(StreamGradients(0, static_cast<int>(params().size()) - 1, *queued));
  } else if (grads_to_host) {
    RETURN_IF_ERROR(backend_->ToHost(grad_host_, grad_compute_, sizeof(float) * param_total_));
  }
  return backend_->ToHost(state_host_, state_compute_, sizeof(float) * state_total_);
}

absl::StatusOr<kernels::LossStats> Model::ReadStageLoss() { return backend_->ReadLoss(); }

absl::Status Model::AppendStageLogits(int64_t batch, std::vector<float>* logits) {
  std::vector<float> these;
  RETURN_IF_ERROR(ReadLogits(batch, &these));
  RETURN_IF_ERROR(backend_->Synchronize());
  logits->insert(logits->end(), these.begin(), these.end());
  return absl::OkStatus();
}

}  // namespace downpour
