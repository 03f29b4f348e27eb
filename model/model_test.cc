#include "model/model.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/log.h"
#include "gtest/gtest.h"
#include "model/model_testing.h"

namespace downpour {
namespace {

// A model asked for a precision it cannot compute in says so in the log
// of the job it trains ("job ID: ..." lines reach downpourctl logs), not
// on stderr alone.
TEST(ModelTest, APrecisionChangeIsLoggedForTheJob) {
  std::vector<std::string> lines;
  SetLogObserver([&lines](absl::Time, absl::string_view line) { lines.emplace_back(line); });
  ModelOptions options;
  options.precision = BF16;
  options.job_id = "mnist-7";
  auto model =
      Model::Create(ParseModelSpec("input_shape: 4 num_classes: 2 layer { dense { units: 2 } }"
                                   " layer { softmax_cross_entropy {} }"),
                    1, options);
  SetLogObserver(nullptr);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->precision(), FP32);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "job mnist-7: model on the cpu: precision BF16 runs in fp32 there");
}

struct ErrorCase {
  std::string spec;
  std::string message;  // Expected substring.
};

class InferModelErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(InferModelErrorTest, RejectsWithMessageNamingTheField) {
  const auto shape = InferModel(ParseModelSpec(GetParam().spec));
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(shape.status().message()).find(GetParam().message), std::string::npos)
      << shape.status();
}

constexpr char kHead[] = "input_shape: 784 num_classes: 10 ";
const std::string kTail = " layer { name: 'loss' softmax_cross_entropy {} }";

INSTANTIATE_TEST_SUITE_P(
    Errors, InferModelErrorTest,
    ::testing::Values(
        ErrorCase{"num_classes: 10 layer { softmax_cross_entropy {} }",
                  "model.input_shape (or model.inputs) is required"},
        ErrorCase{"input_shape: [28, 0] num_classes: 10 layer { softmax_cross_entropy {} }",
                  "model.input_shape[1] must be positive, got 0"},
        ErrorCase{"input_shape: 10 layer { softmax_cross_entropy {} }",
                  "model.num_classes must be positive"},
        ErrorCase{"input_shape: 10 num_classes: -1 layer { softmax_cross_entropy {} }",
                  "model.num_classes must be positive, got -1"},
        ErrorCase{"input_shape: 10 num_classes: 10", "model.layer is empty"},
        ErrorCase{std::string(kHead) + "layer { dense { units: 10 } } layer { }" + kTail,
                  "model.layer[1]: no layer type set"},
        ErrorCase{
            std::string(kHead) +
                "layer { name: 'fc1' dense { units: 10 } } layer { relu {} }"
                " layer { name: 'fc2' inputs: 'fc9' dense { units: 10 } }" +
                kTail,
            "model.layer[2] (\"fc2\"): input \"fc9\" is not a model input or an earlier layer"},
        ErrorCase{std::string(kHead) + "layer { name: 'a' inputs: 'b' dense { units: 10 } }" +
                      " layer { name: 'b' dense { units: 10 } }" + kTail,
                  "model.layer[0] (\"a\"): input \"b\" is not a model input or an earlier layer"},
        ErrorCase{
            std::string(kHead) + "layer { name: 'a' inputs: 'a' dense { units: 10 } }" + kTail,
            "model.layer[0] (\"a\"): input \"a\" is not a model input or an earlier layer"},
        ErrorCase{std::string(kHead) + "layer { name: 'fc' dense { units: 10 } }" +
                      " layer { name: 'fc' relu {} }" + kTail,
                  "model.layer[1] (\"fc\"): duplicate layer name"},
        ErrorCase{std::string(kHead) + "layer { dense { units: 10 } }" +
                      " layer { name: 'dense0' relu {} }" + kTail,
                  "model.layer[1] (\"dense0\"): duplicate layer name"},
        ErrorCase{std::string(kHead) + "layer { dense { units: 0 } }" + kTail,
                  "model.layer[0] (\"dense0\"): dense.units must be positive, got 0"},
        ErrorCase{std::string(kHead) + "layer { dense { units: -3 } }" + kTail,
                  "dense.units must be positive, got -3"},
        ErrorCase{std::string(kHead) +
                      "layer { dense { units: 10 } } layer { dropout { rate: 1 } }" + kTail,
                  "model.layer[1] (\"dropout1\"): dropout.rate must be in [0, 1), got 1"},
        ErrorCase{std::string(kHead) +
                      "layer { dense { units: 10 } } layer { dropout { rate: -0.5 } }" + kTail,
                  "dropout.rate must be in [0, 1), got -0.5"},
        ErrorCase{std::string(kHead) + "layer { name: 'fc' dense { units: 10 } }",
                  "model.layer[0] (\"fc\"): the last layer must be softmax_cross_entropy, got "
                  "dense"},
        ErrorCase{
            std::string(kHead) + "layer { dense { units: 10 } }" + kTail + " layer { relu {} }",
            "model.layer[1] (\"loss\"): softmax_cross_entropy must be the last layer"},
        ErrorCase{std::string(kHead) + "layer { dense { units: 256 } } layer { relu {} }" +
                      " layer { dense { units: 128 } } " + kTail,
                  "model.layer[3] (\"loss\"): softmax_cross_entropy expects [num_classes=10] "
                  "logits, got [128]"},
        ErrorCase{"input_shape: [28, 28, 1] num_classes: 10 layer { dense { units: 10 } }" + kTail,
                  "model.layer[0] (\"dense0\"): dense needs a rank-1 input, got [28, 28, 1]; "
                  "add a flatten layer before it"}));

TEST(InferModelTest, MlpParameterList) {
  const auto shape = InferModel(ParseModelSpec(
      "input_shape: 784 num_classes: 10"
      " layer { dense { units: 256 } } layer { relu {} }"
      " layer { name: 'out' dense { units: 10 } } layer { softmax_cross_entropy {} }"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->input_size, 784);
  ASSERT_EQ(shape->params.size(), 4u);
  struct Want {
    std::string name;
    std::vector<int64_t> shape;
    ParamInit init;
    int64_t fan_in, fan_out;
  };
  const std::vector<Want> want = {
      {"dense0/weight", {784, 256}, ParamInit::kHeUniform, 784, 256},
      {"dense0/bias", {256}, ParamInit::kZeros, 784, 256},
      {"out/weight", {256, 10}, ParamInit::kHeUniform, 256, 10},
      {"out/bias", {10}, ParamInit::kZeros, 256, 10},
  };
  for (size_t i = 0; i < want.size(); ++i) {
    const ParamInfo& p = shape->params[i];
    EXPECT_EQ(p.id, static_cast<int32_t>(i));
    EXPECT_EQ(p.name, want[i].name);
    EXPECT_EQ(p.shape, want[i].shape);
    EXPECT_EQ(p.num_elements,
              want[i].shape.size() == 2 ? want[i].shape[0] * want[i].shape[1] : want[i].shape[0]);
    EXPECT_EQ(p.init, want[i].init) << p.name;
    if (p.init == ParamInit::kHeUniform) {
      EXPECT_EQ(p.fan_in, want[i].fan_in);
      EXPECT_EQ(p.fan_out, want[i].fan_out);
    }
  }
  ASSERT_EQ(shape->layers.size(), 4u);
  EXPECT_EQ(shape->layers[0].name, "dense0");
  EXPECT_EQ(shape->layers[1].name, "relu1");
  EXPECT_EQ(shape->layers[3].name, "softmax_cross_entropy3");
  EXPECT_EQ(shape->layers[0].inputs, std::vector<int>{LayerShape::kModelInput});
  EXPECT_EQ(shape->layers[2].inputs, std::vector<int>{1});
  EXPECT_EQ(shape->layers[1].output_shape, std::vector<int64_t>{256});
  EXPECT_EQ(shape->layers[2].output_shape, std::vector<int64_t>{10});
  EXPECT_TRUE(shape->layers[3].output_shape.empty());
  EXPECT_EQ(shape->layers[2].param_ids, (std::vector<int32_t>{2, 3}));
}

TEST(InferModelTest, NoBiasAndFlatten) {
  const auto shape = InferModel(ParseModelSpec(
      "input_shape: [4, 3, 2] num_classes: 5 layer { flatten {} }"
      " layer { dense { units: 5 no_bias: true } } layer { softmax_cross_entropy {} }"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->layers[0].output_shape, std::vector<int64_t>{24});
  ASSERT_EQ(shape->params.size(), 1u);
  EXPECT_EQ(shape->params[0].name, "dense1/weight");
  EXPECT_EQ(shape->params[0].shape, (std::vector<int64_t>{24, 5}));
}

// A dense or conv2d layer's initializer picks how its weight and bias
// start; HE_UNIFORM (He weight, zero bias) is the default.
TEST(InferModelTest, InitializerChoosesHowWeightsAndBiasesStart) {
  const auto shape = InferModel(ParseModelSpec(
      "input_shape: [4, 4, 2] num_classes: 3"
      " layer { name: 'c' conv2d { filters: 2 kernel_size: 3 initializer: PYTORCH_DEFAULT } }"
      " layer { flatten {} }"
      " layer { name: 'g' dense { units: 5 initializer: GLOROT_UNIFORM } }"
      " layer { name: 'p' dense { units: 4 initializer: PYTORCH_DEFAULT } }"
      " layer { name: 'h' dense { units: 3 } } layer { softmax_cross_entropy {} }"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  std::vector<std::pair<std::string, ParamInit>> got;
  for (const ParamInfo& p : shape->params) got.emplace_back(p.name, p.init);
  EXPECT_EQ(got,
            (std::vector<std::pair<std::string, ParamInit>>{{"c/weight", ParamInit::kFanInUniform},
                                                            {"c/bias", ParamInit::kFanInUniform},
                                                            {"g/weight", ParamInit::kGlorotUniform},
                                                            {"g/bias", ParamInit::kZeros},
                                                            {"p/weight", ParamInit::kFanInUniform},
                                                            {"p/bias", ParamInit::kFanInUniform},
                                                            {"h/weight", ParamInit::kHeUniform},
                                                            {"h/bias", ParamInit::kZeros}}));
  // The conv's fan-in is its patch (3 * 3 * 2), the bias's too.
  EXPECT_EQ(shape->params[0].fan_in, 18);
  EXPECT_EQ(shape->params[1].fan_in, 18);
  const auto bad = InferModel(
      ParseModelSpec("input_shape: 4 num_classes: 3 layer { dense { units: 3 initializer: 9 } }"
                     " layer { softmax_cross_entropy {} }"));
  EXPECT_EQ(bad.status().message(),
            "model.layer[0] (\"dense0\"): dense.initializer = 9 is none of HE_UNIFORM, "
            "GLOROT_UNIFORM, PYTORCH_DEFAULT");
}

TEST(ModelTest, ParametersMatchInitParamRange) {
  auto model = MakeModel(
      "input_shape: 6 num_classes: 3 layer { dense { units: 5 } } layer { relu {} }"
      " layer { dense { units: 3 } } layer { softmax_cross_entropy {} }",
      1234);
  ASSERT_NE(model, nullptr);
  for (const ParamInfo& p : model->params()) {
    std::vector<float> want(p.num_elements);
    InitParamRange(p, 1234, 0, p.num_elements, want.data());
    EXPECT_EQ(std::vector<float>(model->param(p.id), model->param(p.id) + p.num_elements), want)
        << p.name;
  }
}

// A small network that exercises flatten of the model input, a tensor read by
// two layers ("relu" feeds both "side" and "fc2") and a layer whose output
// nothing reads ("side": its gradients are zero).
constexpr char kGradCheckSpec[] =
    "input_shape: [2, 3] num_classes: 3"
    " layer { flatten {} }"
    " layer { name: 'fc1' dense { units: 5 } }"
    " layer { name: 'relu' relu {} }"
    " layer { name: 'side' inputs: 'relu' dense { units: 4 } }"
    " layer { name: 'drop' inputs: 'relu' dropout { rate: 0 } }"
    " layer { name: 'fc2' dense { units: 3 } }"
    " layer { softmax_cross_entropy {} }";

TEST(ModelTest, GradientsMatchCentralFiniteDifferences) {
  auto model = MakeModel(kGradCheckSpec, 7);
  ASSERT_NE(model, nullptr);
  const int64_t batch = 4;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(batch * 6);
  for (float& v : x) v = normal(gen);
  // Biases start at zero; make them non-trivial so their gradients matter.
  for (const ParamInfo& p : model->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) model->param(p.id)[i] += 0.1f * normal(gen);
  }
  const std::vector<int32_t> labels = {0, 2, 1, 2};

  ASSERT_TRUE(model->TrainStep(x.data(), labels.data(), batch, 0).ok());
  std::vector<std::vector<float>> analytic;
  for (const ParamInfo& p : model->params()) {
    analytic.emplace_back(model->grad(p.id), model->grad(p.id) + p.num_elements);
  }
  auto mean_loss = [&]() {
    auto r = model->Evaluate(x.data(), labels.data(), batch);
    EXPECT_TRUE(r.ok());
    return r->loss_sum / batch;
  };
  const float eps = 1e-3f;
  int checked = 0;
  for (const ParamInfo& p : model->params()) {
    for (int64_t i = 0; i < p.num_elements; ++i) {
      float* w = model->param(p.id) + i;
      const float saved = *w;
      *w = saved + eps;
      const double plus = mean_loss();
      *w = saved - eps;
      const double minus = mean_loss();
      *w = saved;
      const double numeric = (plus - minus) / (2.0 * eps);
      const double a = analytic[p.id][i];
      if (p.name.rfind("side/", 0) == 0) {
        EXPECT_EQ(a, 0.0) << p.name << "[" << i << "]";
      }
      const double denom = std::max({std::abs(a), std::abs(numeric), 1e-2});
      EXPECT_LT(std::abs(a - numeric) / denom, 1e-2)
          << p.name << "[" << i << "] analytic " << a << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * 5 + 5 + 5 * 4 + 4 + 5 * 3 + 3);
}

TEST(ModelTest, DropoutChangesTrainLossButNotEvaluate) {
  const std::string with =
      "input_shape: 8 num_classes: 4 layer { dense { units: 32 } }"
      " layer { relu {} } layer { dropout { rate: 0.5 } }"
      " layer { dense { units: 4 } } layer { softmax_cross_entropy {} }";
  const std::string without =
      "input_shape: 8 num_classes: 4 layer { dense { units: 32 } }"
      " layer { relu {} } layer { dropout { rate: 0 } }"
      " layer { dense { units: 4 } } layer { softmax_cross_entropy {} }";
  auto dropped = MakeModel(with, 5);
  auto plain = MakeModel(without, 5);
  ASSERT_NE(dropped, nullptr);
  ASSERT_NE(plain, nullptr);
  const int64_t batch = 16;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(batch * 8);
  for (float& v : x) v = normal(gen);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % 4);

  const auto eval_dropped = dropped->Evaluate(x.data(), labels.data(), batch);
  const auto eval_plain = plain->Evaluate(x.data(), labels.data(), batch);
  ASSERT_TRUE(eval_dropped.ok() && eval_plain.ok());
  EXPECT_EQ(eval_dropped->loss_sum, eval_plain->loss_sum);
  EXPECT_EQ(eval_dropped->correct, eval_plain->correct);

  const auto train_plain = plain->TrainStep(x.data(), labels.data(), batch, 1);
  ASSERT_TRUE(train_plain.ok());
  EXPECT_NEAR(train_plain->loss, eval_plain->loss_sum / batch, 1e-6);

  const auto step1 = dropped->TrainStep(x.data(), labels.data(), batch, 1);
  const auto step1_again = dropped->TrainStep(x.data(), labels.data(), batch, 1);
  const auto step2 = dropped->TrainStep(x.data(), labels.data(), batch, 2);
  ASSERT_TRUE(step1.ok() && step1_again.ok() && step2.ok());
  EXPECT_NE(step1->loss, train_plain->loss);
  EXPECT_EQ(step1->loss, step1_again->loss);  // The mask depends on (seed, step) only.
  EXPECT_NE(step1->loss, step2->loss);

  // Training steps leave Evaluate where it was.
  const auto eval_after = dropped->Evaluate(x.data(), labels.data(), batch);
  ASSERT_TRUE(eval_after.ok());
  EXPECT_EQ(eval_after->loss_sum, eval_dropped->loss_sum);
}

// Labels are the argmax of a fixed random linear map of the features: linearly
// separable, so a small MLP gets nearly all of them.
void MakeSeparable(int64_t n, uint32_t seed, std::vector<float>* x, std::vector<int32_t>* y) {
  constexpr int kIn = 8, kClasses = 4;
  std::mt19937 teacher_gen(99);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> teacher(kIn * kClasses);
  for (float& v : teacher) v = normal(teacher_gen);
  std::mt19937 gen(seed);
  x->resize(n * kIn);
  y->resize(n);
  for (int64_t r = 0; r < n; ++r) {
    for (int i = 0; i < kIn; ++i) (*x)[r * kIn + i] = normal(gen);
    int best = 0;
    float best_score = -1e30f;
    for (int c = 0; c < kClasses; ++c) {
      float s = 0;
      for (int i = 0; i < kIn; ++i) s += (*x)[r * kIn + i] * teacher[i * kClasses + c];
      if (s > best_score) best_score = s, best = c;
    }
    (*y)[r] = best;
  }
}

TEST(ModelTest, SgdLearnsSeparableProblem) {
  auto model = MakeModel(
      "input_shape: 8 num_classes: 4 layer { dense { units: 32 } } layer { relu {} }"
      " layer { dense { units: 4 } } layer { softmax_cross_entropy {} }",
      11);
  ASSERT_NE(model, nullptr);
  std::vector<float> train_x, test_x;
  std::vector<int32_t> train_y, test_y;
  MakeSeparable(2048, 1, &train_x, &train_y);
  MakeSeparable(512, 2, &test_x, &test_y);
  const auto before = model->Evaluate(test_x.data(), test_y.data(), 512);
  ASSERT_TRUE(before.ok());

  const int64_t batch = 32;
  const float lr = 0.1f;
  for (int64_t step = 0; step < 1500; ++step) {
    const int64_t offset = (step * batch) % 2048;
    ASSERT_TRUE(
        model->TrainStep(train_x.data() + offset * 8, train_y.data() + offset, batch, step).ok());
    for (const ParamInfo& p : model->params()) {
      float* w = model->param(p.id);
      const float* g = model->grad(p.id);
      for (int64_t i = 0; i < p.num_elements; ++i) w[i] -= lr * g[i];
    }
  }
  const auto after = model->Evaluate(test_x.data(), test_y.data(), 512);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->loss_sum, 0.5 * before->loss_sum);
  EXPECT_GT(static_cast<double>(after->correct) / 512, 0.9)
      << "loss " << after->loss_sum / 512 << " before " << before->loss_sum / 512;
}

TEST(ModelTest, RejectsBadBatches) {
  auto model = MakeModel(
      "input_shape: 2 num_classes: 3 layer { dense { units: 3 } } layer { softmax_cross_entropy {} "
      "}",
      1);
  ASSERT_NE(model, nullptr);
  const std::vector<float> x(6, 0.5f);
  for (int32_t bad : {-1, 3}) {
    const std::vector<int32_t> labels = {0, bad, 1};
    const auto train = model->TrainStep(x.data(), labels.data(), 3, 0);
    ASSERT_EQ(train.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(train.status().message()).find("labels[1]"), std::string::npos)
        << train.status();
    EXPECT_EQ(model->Evaluate(x.data(), labels.data(), 3).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  const std::vector<int32_t> labels = {0, 1, 2};
  EXPECT_EQ(model->TrainStep(x.data(), labels.data(), 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->Evaluate(nullptr, labels.data(), 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, BuffersGrowWithTheBatch) {
  auto model = MakeModel(
      "input_shape: 8 num_classes: 4 layer { dense { units: 16 } } layer { relu {} }"
      " layer { dense { units: 4 } } layer { softmax_cross_entropy {} }",
      3);
  ASSERT_NE(model, nullptr);
  std::vector<float> x;
  std::vector<int32_t> y;
  MakeSeparable(100, 4, &x, &y);
  const auto small = model->Evaluate(x.data(), y.data(), 2);
  const auto large = model->Evaluate(x.data(), y.data(), 100);
  const auto small_again = model->Evaluate(x.data(), y.data(), 2);
  ASSERT_TRUE(small.ok() && large.ok() && small_again.ok());
  EXPECT_EQ(small->loss_sum, small_again->loss_sum);
  double sum = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const auto one = model->Evaluate(x.data() + i * 8, y.data() + i, 1);
    ASSERT_TRUE(one.ok());
    sum += one->loss_sum;
  }
  EXPECT_NEAR(sum, large->loss_sum, 1e-4 * sum);
  ASSERT_TRUE(model->TrainStep(x.data(), y.data(), 100, 0).ok());
}

}  // namespace
}  // namespace downpour
