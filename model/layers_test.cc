// Gradient checks and shape inference for the image, normalisation, residual
// and embedding layers of model/model (conv2d, max_pool, avg_pool,
// global_avg_pool, batch_norm, add, embedding).
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"
#include "model/model_testing.h"

namespace downpour {
namespace {

// Compares every parameter's gradient from TrainStep with central finite
// differences of the training loss (batch norm in training mode normalises
// with the batch's statistics, so the training loss, not Evaluate, is the
// function being differentiated). `features` null: standard normal inputs.
// Returns the number of elements checked.
int CheckGradients(const std::string& spec, int64_t batch, uint32_t seed,
                   std::vector<float> features = {}) {
  auto model = MakeModel(spec, seed);
  if (model == nullptr) return 0;
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  if (features.empty()) {
    features.resize(batch * model->input_size());
    for (float& v : features) v = normal(gen);
  }
  // Biases start at zero and gammas at one; move them so their gradients matter.
  for (const ParamInfo& p : model->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) model->param(p.id)[i] += 0.1f * normal(gen);
  }
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i)
    labels[i] = static_cast<int32_t>((i * 7 + 3) % model->num_classes());

  auto train_loss = [&]() {
    auto r = model->TrainStep(features.data(), labels.data(), batch, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->loss : 0.0;
  };
  train_loss();
  std::vector<std::vector<float>> analytic;
  for (const ParamInfo& p : model->params()) {
    analytic.emplace_back(model->grad(p.id), model->grad(p.id) + p.num_elements);
  }
  const float eps = 1e-3f;
  int checked = 0;
  for (const ParamInfo& p : model->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      float* w = model->param(p.id) + i;
      const float saved = *w;
      *w = saved + eps;
      const double plus = train_loss();
      *w = saved - eps;
      const double minus = train_loss();
      *w = saved;
      const double numeric = (plus - minus) / (2.0 * eps);
      const double a = analytic[p.id][i];
      // Relative 2%, plus an absolute 3e-4 for float rounding in the loss
      // (batch norm divides by small standard deviations).
      EXPECT_LT(std::abs(a - numeric), 2e-2 * std::max(std::abs(a), std::abs(numeric)) + 3e-4)
          << p.name << "[" << i << "] analytic " << a << " numeric " << numeric;
      ++checked;
    }
  }
  return checked;
}

TEST(LayersGradientTest, Conv2dSameAndValidWithPooling) {
  const int checked = CheckGradients(
      "input_shape: [6, 5, 2] num_classes: 3"
      " layer { name: 'c1' conv2d { filters: 3 kernel_size: 3 } }"
      " layer { relu {} }"
      " layer { name: 'c2' conv2d { filters: 4 kernel_size: [2, 3] stride: 2 padding: VALID } }"
      " layer { max_pool { window: 2 stride: 1 } }"
      " layer { avg_pool { window: 2 } }"
      " layer { flatten {} }"
      " layer { dense { units: 3 } }"
      " layer { softmax_cross_entropy {} }",
      3, 1);
  // c1 3*3*3*2 + 3, c2 4*2*3*3 + 4, dense 4*3 + 3 (c2 out [3, 2]; pools keep
  // [3, 2] then [2, 1]).
  EXPECT_EQ(checked, 54 + 3 + 72 + 4 + 8 * 3 + 3);
}

TEST(LayersGradientTest, Conv2dExplicitAsymmetricPaddingAndNoBias) {
  CheckGradients(
      "input_shape: [5, 4, 3] num_classes: 2"
      " layer { conv2d { filters: 2 kernel_size: 3 stride: [2, 1] padding: EXPLICIT"
      "   explicit_padding: [1, 0, 0, 2] no_bias: true } }"
      " layer { avg_pool { window: 3 stride: 2 padding: SAME } }"
      " layer { flatten {} }"
      " layer { dense { units: 2 } }"
      " layer { softmax_cross_entropy {} }",
      2, 2);
}

TEST(LayersGradientTest, BatchNormOnImagesAndVectors) {
  CheckGradients(
      "input_shape: [3, 3, 2] num_classes: 3"
      " layer { conv2d { filters: 4 kernel_size: 2 no_bias: true } }"
      " layer { batch_norm {} }"  // A bias before it would have a zero gradient.
      " layer { relu {} }"
      " layer { global_avg_pool {} }"
      " layer { dense { units: 5 } }"
      " layer { batch_norm { momentum: 0.9 epsilon: 1e-4 } }"
      " layer { dense { units: 3 } }"
      " layer { softmax_cross_entropy {} }",
      4, 3);
}

TEST(LayersGradientTest, ResidualAdd) {
  CheckGradients(
      "input_shape: 4 num_classes: 3"
      " layer { name: 'fc1' dense { units: 5 } }"
      " layer { name: 'r1' relu {} }"
      " layer { name: 'fc2' dense { units: 5 } }"
      " layer { name: 'sum' inputs: ['r1', 'fc2'] add {} }"
      " layer { name: 'twice' inputs: ['sum', 'sum', 'fc1'] add {} }"
      " layer { dense { units: 3 } }"
      " layer { softmax_cross_entropy {} }",
      3, 4);
}

TEST(LayersGradientTest, EmbeddingWithRepeatedIds) {
  // Ids repeat within and across examples, so rows collect several
  // contributions; id 6 is never used, so its gradient must be zero.
  const std::vector<float> ids = {0, 1, 1, 5, 2, 3, 0, 4, 5, 5, 5, 1};
  CheckGradients(
      "input_shape: 4 num_classes: 3"
      " layer { embedding { vocab_size: 7 dim: 3 } }"
      " layer { flatten {} }"
      " layer { dense { units: 3 } }"
      " layer { softmax_cross_entropy {} }",
      3, 5, ids);
  auto model = MakeModel(
      "input_shape: 4 num_classes: 3 layer { embedding { vocab_size: 7 dim: 3 } }"
      " layer { flatten {} } layer { dense { units: 3 } } layer { softmax_cross_entropy {} }",
      5);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> labels = {0, 1, 2};
  ASSERT_TRUE(model->TrainStep(ids.data(), labels.data(), 3, 0).ok());
  for (int j = 0; j < 3; ++j) EXPECT_EQ(model->grad(0)[6 * 3 + j], 0.f);
  // Non-integer or out-of-range ids are a bad batch, named.
  std::vector<float> bad = ids;
  bad[5] = 7;
  auto r = model->TrainStep(bad.data(), labels.data(), 3, 0);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("features[5] = 7"), std::string::npos)
      << r.status();
  bad[5] = 1.5f;
  EXPECT_EQ(model->Evaluate(bad.data(), labels.data(), 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LayersTest, ShapesAndParametersOfTheFashionMnistCnn) {
  const auto shape = InferModel(
      ParseModelSpec("input_shape: [28, 28, 1] num_classes: 10"
                     " layer { name: 'conv1' conv2d { filters: 32 kernel_size: 3 padding: SAME } }"
                     " layer { relu {} } layer { max_pool { window: 2 } }"
                     " layer { name: 'conv2' conv2d { filters: 64 kernel_size: 3 padding: SAME } }"
                     " layer { relu {} } layer { max_pool { window: 2 } }"
                     " layer { flatten {} } layer { dense { units: 128 } } layer { relu {} }"
                     " layer { dense { units: 10 } } layer { softmax_cross_entropy {} }"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->layers[0].output_shape, (std::vector<int64_t>{28, 28, 32}));
  EXPECT_EQ(shape->layers[2].output_shape, (std::vector<int64_t>{14, 14, 32}));
  EXPECT_EQ(shape->layers[5].output_shape, (std::vector<int64_t>{7, 7, 64}));
  EXPECT_EQ(shape->layers[6].output_shape, (std::vector<int64_t>{3136}));
  ASSERT_EQ(shape->params.size(), 8u);
  EXPECT_EQ(shape->params[0].name, "conv1/weight");
  EXPECT_EQ(shape->params[0].shape, (std::vector<int64_t>{32, 3, 3, 1}));
  EXPECT_EQ(shape->params[0].init, ParamInit::kHeUniform);
  EXPECT_EQ(shape->params[0].fan_in, 9);
  EXPECT_EQ(shape->params[2].shape, (std::vector<int64_t>{64, 3, 3, 32}));
  EXPECT_EQ(shape->params[2].fan_in, 288);
  EXPECT_EQ(shape->params[3].name, "conv2/bias");
  EXPECT_EQ(shape->params[4].shape, (std::vector<int64_t>{3136, 128}));
  EXPECT_TRUE(shape->local_state.empty());
}

TEST(LayersTest, SamePaddingPutsTheOddRowAtTheBottom) {
  const auto shape = InferModel(ParseModelSpec(
      "input_shape: [7, 8, 3] num_classes: 2"
      " layer { conv2d { filters: 2 kernel_size: [4, 3] stride: 2 } }"
      " layer { max_pool { window: 2 } }"
      " layer { flatten {} } layer { dense { units: 2 } } layer { softmax_cross_entropy {} }"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  const WindowShape& conv = shape->layers[0].window;
  EXPECT_EQ(conv.out_h, 4);  // ceil(7 / 2); padding (4-1)*2 + 4 - 7 = 3: 1 top, 2 bottom.
  EXPECT_EQ(conv.pad_top, 1);
  EXPECT_EQ(conv.pad_bottom(), 2);
  EXPECT_EQ(conv.out_w, 4);  // ceil(8 / 2); padding 3*2 + 3 - 8 = 1: 0 left, 1 right.
  EXPECT_EQ(conv.pad_left, 0);
  EXPECT_EQ(conv.pad_right(), 1);
  EXPECT_EQ(shape->layers[1].output_shape, (std::vector<int64_t>{2, 2, 2}));
}

TEST(LayersTest, BatchNormKeepsRunningStatisticsAsLocalState) {
  auto model = MakeModel(
      "input_shape: 3 num_classes: 2 layer { name: 'bn' batch_norm { momentum: 0.5 } }"
      " layer { dense { units: 2 } } layer { softmax_cross_entropy {} }",
      1);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->params().size(), 4u);
  EXPECT_EQ(model->params()[0].name, "bn/gamma");
  EXPECT_EQ(model->params()[1].name, "bn/beta");
  ASSERT_EQ(model->local_state().size(), 2u);
  EXPECT_EQ(model->local_state()[0].name, "bn/running_mean");
  EXPECT_EQ(model->local_state()[1].name, "bn/running_var");
  EXPECT_EQ(model->local_state_data(1)[0], 1.f);

  const std::vector<float> x = {1, 0, 5, 3, 0, 5, 2, 0, 5, 2, 0, 5};
  const std::vector<int32_t> labels = {0, 1, 0, 1};
  const auto before = model->Evaluate(x.data(), labels.data(), 4);
  ASSERT_TRUE(model->TrainStep(x.data(), labels.data(), 4, 0).ok());
  // Column 0: mean 2, biased variance 0.5, unbiased 2/3.
  EXPECT_NEAR(model->local_state_data(0)[0], 0.5 * 0 + 0.5 * 2, 1e-6);
  EXPECT_NEAR(model->local_state_data(1)[0], 0.5 * 1 + 0.5 * (2.0 / 3), 1e-6);
  EXPECT_NEAR(model->local_state_data(0)[2], 2.5, 1e-6);
  EXPECT_NEAR(model->local_state_data(1)[2], 0.5, 1e-6);  // Constant column.
  const auto after = model->Evaluate(x.data(), labels.data(), 4);
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_NE(before->loss_sum, after->loss_sum);  // Evaluate reads the running statistics.
}

// Images with one bright 2x2 blob; the label is the quadrant it lies in. A
// small CNN with batch norm and a residual add learns it with plain SGD.
TEST(LayersTest, SmallCnnLearnsWhereTheBlobIs) {
  auto model = MakeModel(
      "input_shape: [8, 8, 1] num_classes: 4"
      " layer { name: 'c1' conv2d { filters: 8 kernel_size: 3 no_bias: true } }"
      " layer { name: 'bn1' batch_norm { momentum: 0.9 } }"
      " layer { name: 'r1' relu {} }"
      " layer { name: 'c2' conv2d { filters: 8 kernel_size: 3 } }"
      " layer { name: 'r2' relu {} }"
      " layer { name: 'res' inputs: ['r1', 'r2'] add {} }"
      " layer { max_pool { window: 2 } }"
      " layer { flatten {} }"
      " layer { dense { units: 4 } }"
      " layer { softmax_cross_entropy {} }",
      21);
  ASSERT_NE(model, nullptr);
  auto make = [](int64_t n, uint32_t seed, std::vector<float>* x, std::vector<int32_t>* y) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> noise(0.f, 0.1f);
    std::uniform_int_distribution<int> pos(0, 2);
    x->assign(n * 64, 0.f);
    y->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      for (int p = 0; p < 64; ++p) (*x)[i * 64 + p] = noise(gen);
      const int quadrant = static_cast<int>(i % 4);
      const int top = (quadrant / 2) * 4 + pos(gen), left = (quadrant % 2) * 4 + pos(gen);
      for (int dh = 0; dh < 2; ++dh) {
        for (int dw = 0; dw < 2; ++dw) (*x)[i * 64 + (top + dh) * 8 + left + dw] += 1.f;
      }
      (*y)[i] = quadrant;
    }
  };
  std::vector<float> train_x, test_x;
  std::vector<int32_t> train_y, test_y;
  make(1024, 1, &train_x, &train_y);
  make(256, 2, &test_x, &test_y);
  const int64_t batch = 32;
  for (int64_t step = 0; step < 300; ++step) {
    const int64_t offset = (step * batch) % 1024;
    ASSERT_TRUE(
        model->TrainStep(train_x.data() + offset * 64, train_y.data() + offset, batch, step).ok());
    for (const ParamInfo& p : model->params()) {
      for (int64_t i = 0; i < p.num_elements; ++i)
        model->param(p.id)[i] -= 0.05f * model->grad(p.id)[i];
    }
  }
  const auto eval = model->Evaluate(test_x.data(), test_y.data(), 256);
  ASSERT_TRUE(eval.ok());
  EXPECT_GT(static_cast<double>(eval->correct) / 256, 0.9) << "loss " << eval->loss_sum / 256;
}

struct ErrorCase {
  std::string spec;
  std::string message;
};

class LayersErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(LayersErrorTest, RejectsWithMessageNamingTheField) {
  const auto shape = InferModel(ParseModelSpec(GetParam().spec));
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(shape.status().message()).find(GetParam().message), std::string::npos)
      << shape.status();
}

const std::string kImage = "input_shape: [8, 8, 2] num_classes: 2 ";
const std::string kEnd =
    " layer { flatten {} } layer { dense { units: 2 } } layer { softmax_cross_entropy {} }";

INSTANTIATE_TEST_SUITE_P(
    Errors, LayersErrorTest,
    ::testing::Values(
        ErrorCase{kImage + "layer { conv2d { kernel_size: 3 } }" + kEnd,
                  "model.layer[0] (\"conv2d0\"): conv2d.filters must be positive, got 0"},
        ErrorCase{kImage + "layer { conv2d { filters: 4 } }" + kEnd,
                  "model.layer[0] (\"conv2d0\"): conv2d.kernel_size is required"},
        ErrorCase{kImage + "layer { conv2d { filters: 4 kernel_size: [3, 3, 3] } }" + kEnd,
                  "conv2d.kernel_size takes 1 or 2 values, got 3"},
        ErrorCase{kImage + "layer { conv2d { filters: 4 kernel_size: 3 stride: 0 } }" + kEnd,
                  "conv2d.stride must be positive, got [0]"},
        ErrorCase{kImage + "layer { conv2d { filters: 4 kernel_size: 9 padding: VALID } }" + kEnd,
                  "conv2d window 9 is larger than the padded input height 8"},
        ErrorCase{
            kImage + "layer { conv2d { filters: 4 kernel_size: 3 explicit_padding: 1 } }" + kEnd,
            "conv2d.explicit_padding needs padding: EXPLICIT"},
        ErrorCase{kImage +
                      "layer { conv2d { filters: 4 kernel_size: 3 padding: EXPLICIT"
                      " explicit_padding: [1, 1, 1] } }" +
                      kEnd,
                  "conv2d.explicit_padding takes [pad_h, pad_w] or [top, bottom, left, right]"},
        ErrorCase{
            "input_shape: 64 num_classes: 2 layer { conv2d { filters: 4 kernel_size: 3 } }" + kEnd,
            "conv2d needs a [height, width, channels] input, got [64]"},
        ErrorCase{kImage + "layer { max_pool { } }" + kEnd,
                  "model.layer[0] (\"max_pool0\"): max_pool.window is required"},
        ErrorCase{kImage +
                      "layer { avg_pool { window: 2 padding: EXPLICIT"
                      " explicit_padding: [2, 0] } }" +
                      kEnd,
                  "avg_pool.explicit_padding must be smaller than the window along height"},
        ErrorCase{"input_shape: 8 num_classes: 2 layer { global_avg_pool {} }" + kEnd,
                  "global_avg_pool needs a [height, width, channels] input, got [8]"},
        ErrorCase{kImage + "layer { batch_norm { momentum: 1.5 } }" + kEnd,
                  "batch_norm.momentum must be in (0, 1), got 1.5"},
        ErrorCase{kImage + "layer { batch_norm { epsilon: 1e-7 } }" + kEnd,
                  "batch_norm.epsilon must be at least 1e-5"},
        ErrorCase{kImage + "layer { name: 'a' relu {} } layer { add {} }" + kEnd,
                  "model.layer[1] (\"add1\"): add takes at least 2 inputs"},
        ErrorCase{kImage +
                      "layer { name: 'a' relu {} } layer { name: 'p' max_pool { window: 2 } }"
                      " layer { inputs: ['a', 'p'] add {} }" +
                      kEnd,
                  "add inputs must have the same shape; \"a\" is [8, 8, 2] but \"p\" is [4, 4, 2]"},
        ErrorCase{"input_shape: 4 num_classes: 2 layer { embedding { dim: 3 } }" + kEnd,
                  "model.layer[0] (\"embedding0\"): embedding.vocab_size must be positive, got 0"},
        ErrorCase{"input_shape: 4 num_classes: 2 layer { embedding { vocab_size: 3 } }" + kEnd,
                  "embedding.dim must be positive, got 0"},
        ErrorCase{kImage +
                      "layer { name: 'a' relu {} } layer { inputs: 'a' relu {} }"
                      " layer { inputs: ['a', 'a'] relu {} }" +
                      kEnd,
                  "relu takes exactly 1 input, got 2"}));

}  // namespace
}  // namespace downpour
