// What the tests of model/ share: model specs from text, a CPU model made
// from one, a spec cut into pipeline stages by layer name, and random
// batches of a model's inputs. Test-only (testonly in BUILD); a failure to
// parse or create fails the calling test through gtest's EXPECT.
// Functions only; thread-safe.
#ifndef DOWNPOUR_MODEL_MODEL_TESTING_H_
#define DOWNPOUR_MODEL_MODEL_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "proto/job.pb.h"
#include "spec/model_shape.h"

namespace downpour {

// A dense input "d" of 2 and a sparse input "c" read by two sparse tables
// ("sum": SUM of 3 over an exact vocabulary of 100; "mean": MEAN of 2 over
// hashed ids), concatenated under a small MLP: the click model in miniature.
inline constexpr char kTwoSparseTablesSpec[] = R"pb(
  num_classes: 2
  inputs { name: "d" shape: 2 }
  inputs { name: "c" kind: SPARSE }
  layer {
    name: "sum"
    inputs: "c"
    embedding { sparse: true vocab_size: 100 dim: 3 }
  }
  layer {
    name: "mean"
    inputs: "c"
    embedding { sparse: true hash_ids: true dim: 2 combiner: MEAN }
  }
  layer {
    name: "j"
    inputs: [ "d", "sum", "mean" ]
    concat {}
  }
  layer {
    name: "fc"
    dense { units: 4 }
  }
  layer { relu {} }
  layer { dense { units: 2 } }
  layer { softmax_cross_entropy {} }
)pb";

// `text`, a ModelSpec in text format.
ModelSpec ParseModelSpec(const std::string& text);

// The model of `text` on the CPU, initialised from `seed`; null when it
// cannot be created.
std::unique_ptr<Model> MakeModel(const std::string& text, uint64_t seed);

// The model of `base` cut into `stages` (each a list of layer names) run in
// `micro` micro-batches in `schedule`'s order.
ModelSpec WithPipeline(const std::string& base, const std::vector<std::vector<std::string>>& stages,
                       int micro, PipelineSpec::Schedule schedule = PipelineSpec::ONE_F_ONE_B);
// Every layer of `base` in one stage.
ModelSpec OneStage(const std::string& base, int micro);

struct TestBatch {
  std::vector<float> features;  // size * shape.input_size, slot-major.
  std::vector<int32_t> labels;
  int64_t size = 0;
};

// `size` examples of `shape`'s input: standard normal features, labels
// uniform over its classes; the same for the same seed.
TestBatch RandomBatch(const ModelShape& shape, int64_t size, uint64_t seed);

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_MODEL_TESTING_H_
