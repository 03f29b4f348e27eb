// Parameter tensors of a model and their deterministic initialisation.
//
// The worker, the coordinator (placement) and the parameter server (initial
// values) all derive the same list from a ModelSpec, so it is computed in one
// place (InferModel, spec/model_shape.h) and described here. Thread-compatible
// values.
#ifndef DOWNPOUR_SPEC_PARAMS_H_
#define DOWNPOUR_SPEC_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace downpour {

enum class ParamInit {
  kZeros,
  kOnes,
  // Uniform in [-sqrt(6 / fan_in), sqrt(6 / fan_in)] (He et al., for ReLU nets).
  kHeUniform,
  // Uniform in [-sqrt(6 / (fan_in + fan_out)), +...] (Glorot and Bengio).
  kGlorotUniform,
  // Uniform in [-1 / sqrt(fan_in), 1 / sqrt(fan_in)] (PyTorch's default for
  // nn.Linear and nn.Conv2d weights and biases).
  kFanInUniform,
};

struct ParamInfo {
  int32_t id = 0;    // Index in the model's parameter list (= tensor_id).
  std::string name;  // "<layer>/<weight|bias|...>"
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  ParamInit init = ParamInit::kZeros;
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};

// Writes elements [offset, offset + count) of parameter `param`'s initial
// value to `out`. Each element depends only on (seed, param.id, element
// index), so initialising partitions separately gives the same tensor as
// initialising it whole.
void InitParamRange(const ParamInfo& param, uint64_t seed, int64_t offset, int64_t count,
                    float* out);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_PARAMS_H_
