// Fuzzes the ONNX importer (spec/onnx_import.h), which the coordinator runs
// over the model file of a submit and downpourctl over `model import`: the
// bytes are an onnx.ModelProto from anyone.
//
// Invariants beyond "no crash": an error is InvalidArgument with a message;
// a model that imports is one Downpour's shape inference takes, and its
// weights are a well-formed safetensors file holding every parameter.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "fuzz/fuzz_check.h"
#include "spec/model_shape.h"
#include "spec/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;  // NOLINT(build/namespaces): one function.
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ImportedModel> imported = ImportOnnx(bytes, "fuzz.onnx");
  if (!imported.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(imported.status()) && !imported.status().message().empty(),
               imported.status().ToString());
    return 0;
  }
  absl::StatusOr<ModelShape> shape = InferModel(imported->model);
  FUZZ_CHECK(shape.ok(), "an imported model fails shape inference: ", shape.status().ToString());
  absl::StatusOr<SafetensorsFile> weights =
      SafetensorsFile::Parse(imported->weights, "the imported weights");
  FUZZ_CHECK(weights.ok(), weights.status().ToString());
  size_t tensors = shape->local_state.size();
  for (const ParamInfo& p : shape->params) tensors += p.num_elements > 0 ? 1 : 0;
  FUZZ_CHECK(weights->tensors().size() == tensors, "the imported weights have ",
             weights->tensors().size(), " tensors for ", tensors, " parameters and statistics");
  return 0;
}
