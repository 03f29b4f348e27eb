#include "worker/worker_state.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status.h"

namespace downpour {

absl::StatusOr<std::string> SaveWorkerState(const ModelRunner& model) {
  std::vector<TensorToWrite> tensors;
  for (const ParamInfo& state : model.local_state()) {
    tensors.push_back(
        {state.name, TensorDtype::kF32, state.shape, model.local_state_data(state.id)});
  }
  const double loss_scale = model.loss_scale();
  tensors.push_back({kLossScaleTensor, TensorDtype::kF64, {}, &loss_scale});
  return SerializeSafetensors(tensors, {});
}

absl::Status LoadWorkerState(const std::string& bytes, ModelRunner* model) {
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(bytes, "the workers' state"));
  ASSIGN_OR_RETURN(SafetensorsFile::Tensor scale, file.Get(kLossScaleTensor));
  if (scale.dtype != TensorDtype::kF64 || scale.data.size() != sizeof(double)) {
    return absl::DataLossError("the workers' state: loss_scale is not one F64");
  }
  double loss_scale = 0;
  std::memcpy(&loss_scale, scale.data.data(), sizeof(double));
  std::vector<const float*> values(model->local_state().size());
  for (const ParamInfo& state : model->local_state()) {
    absl::StatusOr<const float*> found = file.Floats(state.name, state.num_elements);
    if (!found.ok()) {
      return absl::DataLossError(
          absl::StrCat("the workers' state does not fit the model: ", found.status().message()));
    }
    values[state.id] = *found;
  }
  return model->RestoreLocalState(values, loss_scale);
}

}  // namespace downpour
