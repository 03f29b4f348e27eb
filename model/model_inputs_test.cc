// Models with named inputs (ModelSpec.inputs): dense inputs, sparse
// embeddings whose pooled rows the worker writes into the input, concat.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"
#include "model/model_testing.h"

namespace downpour {
namespace {

// A click model in miniature: 3 dense features, two sparse features of
// which one is pooled by two tables.
constexpr char kSpec[] = R"pb(
  num_classes: 2
  inputs {
    name: "counts"
    features: [ "I1", "I2", "I3" ]
  }
  inputs { name: "C1" kind: SPARSE max_ids: 4 }
  inputs { name: "C2" kind: SPARSE }
  layer {
    name: "e1"
    inputs: "C1"
    embedding { sparse: true vocab_size: 1000 dim: 4 }
  }
  layer {
    name: "e2"
    inputs: "C2"
    embedding {
      sparse: true
      hash_ids: true
      dim: 2
      combiner: MEAN
      optimizer { kind: ADAGRAD }
    }
  }
  layer {
    name: "e3"
    inputs: "C1"
    embedding { sparse: true vocab_size: 50 dim: 3 max_rows: 10 }
  }
  layer {
    name: "joined"
    inputs: [ "counts", "e1", "e2", "e3" ]
    concat {}
  }
  layer {
    name: "fc1"
    dense { units: 5 }
  }
  layer { relu {} }
  layer {
    name: "logits"
    dense { units: 2 }
  }
  layer {
    name: "loss"
    softmax_cross_entropy {}
  }
)pb";

TEST(ModelInputsTest, SlotsAndTables) {
  const auto shape = InferModel(ParseModelSpec(kSpec));
  ASSERT_TRUE(shape.ok()) << shape.status();
  // counts [3], then e1 [4], e2 [2], e3 [3], slot-major.
  ASSERT_EQ(shape->input_slots.size(), 4u);
  EXPECT_EQ(shape->input_slots[0].name, "counts");
  EXPECT_EQ(shape->input_slots[0].offset, 0);
  EXPECT_EQ(shape->input_slots[0].width, 3);
  EXPECT_EQ(shape->input_slots[0].input, 0);
  EXPECT_EQ(shape->input_slots[1].name, "e1");
  EXPECT_EQ(shape->input_slots[1].offset, 3);
  EXPECT_EQ(shape->input_slots[2].offset, 7);
  EXPECT_EQ(shape->input_slots[3].offset, 9);
  EXPECT_EQ(shape->input_size, 12);
  EXPECT_EQ(shape->input_shape, std::vector<int64_t>{12});
  ASSERT_EQ(shape->sparse_tables.size(), 3u);
  const SparseTableInfo& e2 = shape->sparse_tables[1];
  EXPECT_EQ(e2.name, "e2/table");
  EXPECT_EQ(e2.input, 2);
  EXPECT_EQ(e2.slot, 2);
  EXPECT_EQ(e2.layer, 1);
  EXPECT_TRUE(e2.hash_ids);
  EXPECT_EQ(e2.vocab_size, INT64_MAX);
  EXPECT_TRUE(e2.mean);
  EXPECT_TRUE(e2.has_optimizer);
  EXPECT_EQ(e2.optimizer.kind(), OptimizerSpec::ADAGRAD);
  EXPECT_FLOAT_EQ(e2.init_scale, 1.f / std::sqrt(2.f));
  EXPECT_EQ(shape->sparse_tables[2].max_rows, 10);
  EXPECT_EQ(shape->sparse_tables[2].input, 1);
  EXPECT_EQ(shape->inputs[1].max_ids(), 4);
  EXPECT_EQ(shape->inputs[2].max_ids(), 64);
  // The tables are not parameters: only the two dense layers have any.
  ASSERT_EQ(shape->params.size(), 4u);
  EXPECT_EQ(shape->params[0].name, "fc1/weight");
  EXPECT_EQ(shape->params[0].shape, (std::vector<int64_t>{12, 5}));
  EXPECT_EQ(shape->layers[3].output_shape, std::vector<int64_t>{12});
}

struct ErrorCase {
  std::string spec;
  std::string message;
};

class ModelInputsErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ModelInputsErrorTest, RejectsWithMessageNamingTheField) {
  const auto shape = InferModel(ParseModelSpec(GetParam().spec));
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(shape.status().message()).find(GetParam().message), std::string::npos)
      << shape.status();
}

constexpr char kTwoInputs[] =
    "num_classes: 2 inputs { name: 'd' shape: 3 } inputs { name: 's' kind: SPARSE } ";
constexpr char kLoss[] = " layer { dense { units: 2 } } layer { softmax_cross_entropy {} }";

INSTANTIATE_TEST_SUITE_P(
    Errors, ModelInputsErrorTest,
    ::testing::Values(
        ErrorCase{"input_shape: 3 num_classes: 2 inputs { name: 'd' } layer { "
                  "softmax_cross_entropy {} }",
                  "model.input_shape and model.inputs exclude each other"},
        ErrorCase{"num_classes: 2 inputs { } layer { softmax_cross_entropy {} }",
                  "model.inputs[0] (\"\"): name is required"},
        ErrorCase{"num_classes: 2 inputs { name: 'd' } inputs { name: 'd' } layer { "
                  "softmax_cross_entropy {} }",
                  "model.inputs[1] (\"d\"): duplicate input name"},
        ErrorCase{"num_classes: 2 inputs { name: 'd' shape: [2, 0] } layer { "
                  "softmax_cross_entropy {} }",
                  "model.inputs[0] (\"d\"): shape must be positive, got [2, 0]"},
        ErrorCase{"num_classes: 2 inputs { name: 's' kind: SPARSE features: ['a', 'b'] } layer { "
                  "softmax_cross_entropy {} }",
                  "a SPARSE input reads exactly 1 feature, got 2"},
        ErrorCase{"num_classes: 2 inputs { name: 's' kind: SPARSE max_ids: 100000 } layer { "
                  "softmax_cross_entropy {} }",
                  "max_ids must be in [1, 65536], got 100000"},
        ErrorCase{std::string(kTwoInputs) + "layer { dense { units: 2 } }" + kLoss,
                  "model.layer[0] (\"dense0\"): set inputs: the model has 2 named inputs"},
        ErrorCase{std::string(kTwoInputs) + "layer { inputs: 's' dense { units: 2 } }" + kLoss,
                  "input \"s\" is SPARSE: only an embedding with sparse: true reads it"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 's' embedding { vocab_size: 10 dim: 2 } }" + kLoss,
                  "input \"s\" is SPARSE: only an embedding with sparse: true reads it"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 'd' embedding { sparse: true vocab_size: 10 dim: 2 } }" +
                      kLoss,
                  "embedding with sparse: true reads a SPARSE model input"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 's' embedding { sparse: true dim: 2 } }" + kLoss,
                  "embedding.vocab_size must be positive (or 0 with hash_ids), got 0"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 's' embedding { sparse: true vocab_size: 9 dim: 2 "
                      "optimizer { kind: MOMENTUM } } }" +
                      kLoss,
                  "MOMENTUM is not offered for sparse tables"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 'd' embedding { vocab_size: 100000000 dim: 2 } }" + kLoss,
                  "is more than a dense table takes (2^24, ids as floats); set sparse: true"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 'd' embedding { vocab_size: 10 dim: 2 max_rows: 5 } }" +
                      kLoss,
                  "max_rows, eviction and embedding_staleness are for sparse: true"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 'd' embedding { vocab_size: 10 dim: 2 "
                      "embedding_staleness: 2 } }" +
                      kLoss,
                  "embedding_staleness are for sparse: true"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { inputs: 's' embedding { sparse: true vocab_size: 9 dim: 2 "
                      "embedding_staleness: 1001 } }" +
                      kLoss,
                  "embedding.embedding_staleness must be in [0, 1000], got 1001"},
        ErrorCase{std::string(kTwoInputs) +
                      "layer { name: 'e' inputs: 's' embedding { sparse: true vocab_size: 9 dim: "
                      "2 } } layer { name: 'f' inputs: 'd' flatten {} } layer { inputs: ['e', "
                      "'d', 'x'] concat {} }" +
                      kLoss,
                  "input \"x\" is not a model input or an earlier layer"},
        ErrorCase{std::string(kTwoInputs) + "layer { name: 'd' inputs: 'd' relu {} }" + kLoss,
                  "model.layer[0] (\"d\"): a model input has this name too"},
        ErrorCase{"num_classes: 2 inputs { name: 'a' shape: [2, 3] } inputs { name: 'b' shape: "
                  "[3, 3] } layer { inputs: ['a', 'b'] concat {} }" +
                      std::string(kLoss),
                  "concat inputs must agree but in their last axis"},
        ErrorCase{
            "num_classes: 2 inputs { name: 'a' shape: 2 } layer { concat {} }" + std::string(kLoss),
            "concat takes at least 2 inputs"},
        ErrorCase{"num_classes: 2 inputs { name: 'a' shape: 2 } inputs { name: 'b' shape: 3 }"
                  " layer { inputs: ['a', 'b'] dot_interaction {} }" +
                      std::string(kLoss),
                  "dot_interaction inputs must have the same shape"}));

// Fills the model input (slot-major) with normal values.
std::vector<float> RandomInput(const Model& model, int64_t batch, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(batch * model.input_size());
  for (float& v : x) v = normal(gen);
  return x;
}

// Trains one step of `model` on `x` (slot-major) and checks the gradient of
// every parameter and of every sparse slot (Model::input_grad) against
// central differences of the mean loss, and that a dense slot has none.
// Returns how many values were checked.
int CheckGradients(Model& model, std::vector<float>& x, const std::vector<int32_t>& labels) {
  const int64_t batch = static_cast<int64_t>(labels.size());
  EXPECT_TRUE(model.TrainStep(x.data(), labels.data(), batch, 0).ok());
  const std::vector<float> input_grad(model.input_grad(),
                                      model.input_grad() + batch * model.input_size());
  std::vector<std::vector<float>> param_grad;
  for (const ParamInfo& p : model.params()) {
    param_grad.emplace_back(model.grad(p.id), model.grad(p.id) + p.num_elements);
  }
  auto mean_loss = [&]() {
    auto r = model.Evaluate(x.data(), labels.data(), batch);
    EXPECT_TRUE(r.ok());
    return r->loss_sum / batch;
  };
  int checked = 0;
  auto check = [&](float* v, double analytic, const std::string& what) {
    const float eps = 1e-3f, saved = *v;
    *v = saved + eps;
    const double plus = mean_loss();
    *v = saved - eps;
    const double minus = mean_loss();
    *v = saved;
    const double numeric = (plus - minus) / (2.0 * eps);
    const double denom = std::max({std::abs(analytic), std::abs(numeric), 1e-2});
    EXPECT_LT(std::abs(analytic - numeric) / denom, 1e-2)
        << what << " analytic " << analytic << " numeric " << numeric;
    ++checked;
  };
  for (const InputSlot& slot : model.shape().input_slots) {
    for (int64_t i = batch * slot.offset; i < batch * (slot.offset + slot.width); ++i) {
      if (slot.sparse_table < 0) {
        EXPECT_EQ(input_grad[i], 0.f) << slot.name << " element " << i;
      } else {
        check(&x[i], input_grad[i], slot.name + " input " + std::to_string(i));
      }
    }
  }
  for (const ParamInfo& p : model.params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      check(model.param(p.id) + i, param_grad[p.id][i], p.name + "[" + std::to_string(i) + "]");
    }
  }
  return checked;
}

TEST(ModelInputsTest, GradientsOfParametersAndSparseSlotsMatchFiniteDifferences) {
  auto created = Model::Create(ParseModelSpec(kSpec), 11);
  ASSERT_TRUE(created.ok()) << created.status();
  std::vector<float> x = RandomInput(**created, 3, 5);
  // Sparse slots e1 [4], e2 [2], e3 [3]; fc1 [12, 5] + 5, logits [5, 2] + 2.
  EXPECT_EQ(CheckGradients(**created, x, {1, 0, 1}), 3 * (4 + 2 + 3) + 65 + 12);
}

// DLRM in miniature: a bottom layer on the dense input, three sparse
// embeddings, their pairwise dot products joined with the bottom output.
constexpr char kDlrm[] = R"pb(
  num_classes: 2
  inputs { name: "counts" shape: 3 }
  inputs { name: "C1" kind: SPARSE }
  layer {
    name: "bottom"
    inputs: "counts"
    dense { units: 4 }
  }
  layer {
    name: "e1"
    inputs: "C1"
    embedding { sparse: true vocab_size: 9 dim: 4 }
  }
  layer {
    name: "e2"
    inputs: "C1"
    embedding { sparse: true vocab_size: 9 dim: 4 }
  }
  layer {
    name: "e3"
    inputs: "C1"
    embedding { sparse: true vocab_size: 9 dim: 4 }
  }
  layer {
    name: "dots"
    inputs: [ "bottom", "e1", "e2", "e3" ]
    dot_interaction {}
  }
  layer {
    name: "top_in"
    inputs: [ "bottom", "dots" ]
    concat {}
  }
  layer {
    name: "top"
    dense { units: 2 }
  }
  layer {
    name: "loss"
    softmax_cross_entropy {}
  }
)pb";

TEST(ModelInputsTest, DotInteractionGradientsMatchFiniteDifferences) {
  const auto shape = InferModel(ParseModelSpec(kDlrm));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->layers[4].output_shape, std::vector<int64_t>{6});  // 4 choose 2.
  auto created = Model::Create(ParseModelSpec(kDlrm), 2);
  ASSERT_TRUE(created.ok()) << created.status();
  std::vector<float> x = RandomInput(**created, 3, 8);
  EXPECT_EQ(CheckGradients(**created, x, {0, 1, 1}), 3 * 12 + (3 * 4 + 4) + (10 * 2 + 2));
}

TEST(ModelInputsTest, EvaluateReturnsTheLogitsOfItsLoss) {
  auto created = Model::Create(ParseModelSpec(kSpec), 3);
  ASSERT_TRUE(created.ok()) << created.status();
  Model& model = **created;
  const int64_t batch = 5;
  const std::vector<float> x = RandomInput(model, batch, 9);
  const std::vector<int32_t> labels = {1, 0, 1, 1, 0};
  std::vector<float> logits;
  auto r = model.Evaluate(x.data(), labels.data(), batch, &logits);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(logits.size(), static_cast<size_t>(batch * 2));
  double loss_sum = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const double a = logits[2 * i], b = logits[2 * i + 1];
    const double m = std::max(a, b);
    const double log_z = m + std::log(std::exp(a - m) + std::exp(b - m));
    loss_sum += log_z - (labels[i] == 1 ? b : a);
  }
  EXPECT_NEAR(r->loss_sum, loss_sum, 1e-4 * batch);
}

TEST(ModelInputsTest, ConcatOfDenseInputsIsTheirJoin) {
  // Two dense inputs concatenated and fed to a dense layer equal one input
  // of the joined width with the same weights.
  const std::string joined =
      "num_classes: 2 inputs { name: 'a' shape: 2 } inputs { name: 'b' shape: 3 }"
      " layer { name: 'j' inputs: ['a', 'b'] concat {} }"
      " layer { name: 'fc' dense { units: 2 } } layer { softmax_cross_entropy {} }";
  const std::string single =
      "num_classes: 2 input_shape: 5"
      " layer { name: 'fc' dense { units: 2 } } layer { softmax_cross_entropy {} }";
  auto a = Model::Create(ParseModelSpec(joined), 4);
  auto b = Model::Create(ParseModelSpec(single), 4);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t batch = 4;
  const std::vector<float> slot_major = RandomInput(**a, batch, 2);
  std::vector<float> example_major(batch * 5);
  for (int64_t i = 0; i < batch; ++i) {
    for (int k = 0; k < 2; ++k) example_major[i * 5 + k] = slot_major[i * 2 + k];
    for (int k = 0; k < 3; ++k) example_major[i * 5 + 2 + k] = slot_major[batch * 2 + i * 3 + k];
  }
  const std::vector<int32_t> labels = {0, 1, 1, 0};
  auto ra = (*a)->TrainStep(slot_major.data(), labels.data(), batch, 0);
  auto rb = (*b)->TrainStep(example_major.data(), labels.data(), batch, 0);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_NEAR(ra->loss, rb->loss, 1e-6);
  for (int64_t i = 0; i < 10; ++i) EXPECT_NEAR((*a)->grad(0)[i], (*b)->grad(0)[i], 1e-6);
}

}  // namespace
}  // namespace downpour
