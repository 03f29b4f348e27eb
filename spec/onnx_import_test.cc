#include "spec/onnx_import.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "onnx/onnx.pb.h"
#include "spec/model_shape.h"
#include "spec/onnx_test_graphs.h"

namespace downpour {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;
using ::testing::Pointwise;

std::vector<std::string> LayerNames(const ModelSpec& model) {
  std::vector<std::string> names;
  for (const LayerSpec& layer : model.layer()) names.push_back(layer.name());
  return names;
}

std::vector<float> Floats(const SafetensorsFile& file, const std::string& name) {
  absl::StatusOr<SafetensorsFile::Tensor> t = file.Get(name);
  EXPECT_TRUE(t.ok()) << name;
  if (!t.ok()) return {};
  std::vector<float> v(t->data.size() / 4);
  std::memcpy(v.data(), t->data.data(), t->data.size());
  return v;
}

TEST(OnnxImportTest, AnMlpBecomesItsLayersWithItsWeightsInPyTorchsNames) {
  absl::StatusOr<ImportedModel> imported = ImportOnnx(OnnxMlp().Bytes(), "mlp.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  const ModelSpec& model = imported->model;
  EXPECT_THAT(model.input_shape(), ElementsAre(28, 28, 1));
  EXPECT_EQ(model.num_classes(), 10);
  EXPECT_THAT(LayerNames(model), ElementsAre("flat", "fc1", "relu", "fc2", "loss"));
  EXPECT_EQ(model.layer(1).dense().units(), 8);
  EXPECT_TRUE(model.layer(4).has_softmax_cross_entropy());
  ASSERT_TRUE(InferModel(model).ok());
  absl::StatusOr<SafetensorsFile> weights = SafetensorsFile::Parse(imported->weights, "w");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->tensors().size(), 4u);
  EXPECT_THAT(weights->Get("fc1.weight")->shape, ElementsAre(8, 784));
  EXPECT_FLOAT_EQ(Floats(*weights, "fc2.bias")[3], 0.03f);
  EXPECT_THAT(imported->notes, ElementsAre(HasSubstr("softmax cross-entropy")));
}

TEST(OnnxImportTest, AMatMulAndItsBiasAddAreOneDenseLayerWithTheWeightTransposed) {
  OnnxGraph g;
  g.Input("x", {3}).Output("y", {2});
  g.Weight("w", {3, 2}).Weight("b", {2});
  g.Node("MatMul", {"x", "w"}, {"mm"});
  g.Node("Add", {"mm", "b"}, {"y"});
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "m.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  ASSERT_EQ(imported->model.layer_size(), 2);
  EXPECT_FALSE(imported->model.layer(0).dense().no_bias());
  EXPECT_THAT(imported->model.input_shape(), ElementsAre(3));
  absl::StatusOr<SafetensorsFile> weights = SafetensorsFile::Parse(imported->weights, "w");
  ASSERT_TRUE(weights.ok());
  // w[i][o] = 0.01 * (2i + o); PyTorch's [out, in] holds it at [o][i].
  EXPECT_THAT(Floats(*weights, "mm.weight"),
              Pointwise(FloatEq(), {0.f, 0.02f, 0.04f, 0.01f, 0.03f, 0.05f}));
  EXPECT_THAT(weights->Get("mm.bias")->shape, ElementsAre(2));
}

TEST(OnnxImportTest, ACnnWithBatchNormAResidualAddAndAConcatMapsLayerForLayer) {
  absl::StatusOr<ImportedModel> imported = ImportOnnx(OnnxCnn().Bytes(), "cnn.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  const ModelSpec& model = imported->model;
  EXPECT_THAT(model.input_shape(), ElementsAre(8, 8, 3));
  EXPECT_THAT(LayerNames(model), ElementsAre("conv1", "bn1", "r1", "p1", "conv2", "res", "side",
                                             "cat", "gap", "fc", "loss"));
  EXPECT_EQ(model.layer(0).conv2d().padding(), EXPLICIT);
  EXPECT_THAT(model.layer(0).conv2d().explicit_padding(), ElementsAre(1, 1, 1, 1));
  EXPECT_TRUE(model.layer(4).conv2d().no_bias());
  EXPECT_THAT(model.layer(3).max_pool().stride(), ElementsAre(2, 2));
  EXPECT_THAT(model.layer(5).inputs(), ElementsAre("conv2", "p1"));
  EXPECT_FLOAT_EQ(model.layer(1).batch_norm().momentum(), 0.9f);
  EXPECT_TRUE(imported->notes.empty());
  absl::StatusOr<ModelShape> shape = InferModel(model);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(shape->layers[7].output_shape, ElementsAre(4, 4, 6));
  absl::StatusOr<SafetensorsFile> weights = SafetensorsFile::Parse(imported->weights, "w");
  ASSERT_TRUE(weights.ok());
  EXPECT_THAT(weights->Get("bn1.running_var")->shape, ElementsAre(4));
  EXPECT_THAT(weights->Get("conv1.weight")->shape, ElementsAre(4, 3, 3, 3));
  EXPECT_EQ(weights->tensors().count("conv2.bias"), 0u);
}

TEST(OnnxImportTest, SameAutoPaddingBecomesExplicitPadding) {
  OnnxGraph g;
  g.Input("x", {1, 7, 7}).Output("y", {3});
  g.Weight("c.weight", {2, 1, 3, 3}).Weight("fc.weight", {3, 32});
  onnx::NodeProto& conv = g.Node("Conv", {"x", "c.weight"}, {"c"});
  SetIntsAttribute(conv, "strides", {2, 2});
  onnx::AttributeProto* pad = conv.add_attribute();
  pad->set_name("auto_pad");
  pad->set_type(onnx::AttributeProto::STRING);
  pad->set_s("SAME_UPPER");
  g.Node("Flatten", {"c"}, {"f"});
  SetIntAttribute(g.Node("Gemm", {"f", "fc.weight"}, {"y"}), "transB", 1);
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "same.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  // 7 at stride 2: 4 outputs, (4 - 1) * 2 + 3 - 7 = 2 padded, 1 each side.
  EXPECT_THAT(imported->model.layer(0).conv2d().explicit_padding(), ElementsAre(1, 1, 1, 1));
}

TEST(OnnxImportTest, AFlattenSpelledAsShapeArithmeticIsAFlatten) {
  // x.view(x.size(0), -1), as older exporters write it.
  OnnxGraph g = OnnxViewFlatten();
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "view.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_THAT(LayerNames(imported->model), ElementsAre("flat", "fc", "loss"));
  EXPECT_TRUE(imported->model.layer(0).has_flatten());
}

TEST(OnnxImportTest, AGatherOfIdsIsAnEmbeddingReadingANamedInput) {
  OnnxGraph g = OnnxEmbedding();
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "emb.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  const ModelSpec& model = imported->model;
  ASSERT_EQ(model.inputs_size(), 2);
  EXPECT_EQ(model.inputs(0).name(), "ids");
  EXPECT_THAT(model.inputs(0).shape(), ElementsAre(3));
  EXPECT_EQ(model.layer(0).embedding().vocab_size(), 50);
  EXPECT_THAT(model.layer(0).inputs(), ElementsAre("ids"));
  EXPECT_THAT(model.layer(2).inputs(), ElementsAre("flat", "dense"));
  EXPECT_TRUE(InferModel(model).ok());
}

TEST(OnnxImportTest, DynamosMeanOverHeightAndWidthAndATrainingModeBatchNormMap) {
  OnnxGraph g;
  g.Input("x", {2, 4, 4}).Output("y", {3});
  g.Weight("bn.weight", {2}, 1.f).Weight("bn.bias", {2}).Weight("bn.running_mean", {2});
  g.Weight("bn.running_var", {2}, 1.f).Weight("fc.weight", {3, 2}).Ints("axes", {-1, -2});
  onnx::NodeProto& bn = g.Node("BatchNormalization",
                               {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
                               {"b", "new_mean", "new_var"});
  SetIntAttribute(bn, "training_mode", 1);
  g.Node("ReduceMean", {"b", "axes"}, {"mean"});
  SetIntAttribute(g.Node("Shape", {"mean"}, {"shape"}), "end", 1);  // [batch].
  g.Ints("minus_one", {-1});
  g.Node("Concat", {"shape", "minus_one"}, {"target"});
  g.Node("Reshape", {"mean", "target"}, {"flat"});
  SetIntAttribute(g.Node("Gemm", {"flat", "fc.weight"}, {"y"}), "transB", 1);
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "dynamo.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_THAT(LayerNames(imported->model), ElementsAre("bn", "mean", "fc", "loss"));
  EXPECT_TRUE(imported->model.layer(1).has_global_avg_pool());
  EXPECT_THAT(imported->notes, Contains(HasSubstr("exported in training mode")));
}

// What a refusal says, for a graph changed by `change`.
std::string Refusal(OnnxGraph g) {
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "bad.onnx");
  EXPECT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(imported.status().message());
}

TEST(OnnxImportTest, AnUnsupportedOpIsRefusedNamingTheNodeAndTheOp) {
  OnnxGraph g = OnnxMlp();
  g.model().mutable_graph()->mutable_node(2)->set_op_type("Sigmoid");
  EXPECT_THAT(Refusal(g),
              HasSubstr("bad.onnx: node \"/relu/Relu\" (Sigmoid): op Sigmoid is not supported"));
}

TEST(OnnxImportTest, AttributesOutsideWhatMapsAreRefused) {
  OnnxGraph grouped = OnnxCnn();
  SetIntAttribute(*grouped.model().mutable_graph()->mutable_node(0), "group", 2);
  EXPECT_THAT(Refusal(grouped), HasSubstr("(Conv): group 2 is not supported"));
  OnnxGraph ceil = OnnxCnn();
  SetIntAttribute(*ceil.model().mutable_graph()->mutable_node(3), "ceil_mode", 1);
  EXPECT_THAT(Refusal(ceil), HasSubstr("(MaxPool): ceil_mode 1 is not supported"));
  OnnxGraph unknown = OnnxMlp();
  SetIntAttribute(*unknown.model().mutable_graph()->mutable_node(2), "alpha", 1);
  EXPECT_THAT(Refusal(unknown), HasSubstr("(Relu): attribute alpha is not understood"));
}

TEST(OnnxImportTest, AFlattenedImageReadByAnythingButADenseLayerIsRefused) {
  OnnxGraph g;
  g.Input("x", {2, 3, 3}).Output("y", {4});
  g.Weight("fc.weight", {4, 18});
  g.Node("Flatten", {"x"}, {"flat"});
  g.Node("Relu", {"flat"}, {"r"});
  SetIntAttribute(g.Node("Gemm", {"r", "fc.weight"}, {"y"}), "transB", 1);
  EXPECT_THAT(Refusal(g), HasSubstr("reads the flattened image \"flat\"; Downpour flattens "
                                    "images in HWC order"));
}

TEST(OnnxImportTest, AReshapeThatIsNoFlattenIsRefused) {
  OnnxGraph g;
  g.Input("x", {18}).Output("y", {4});
  g.Ints("shape", {0, 2, 9});
  g.Node("Reshape", {"x", "shape"}, {"y"});
  EXPECT_THAT(Refusal(g), HasSubstr("a Reshape to [0, 2, 9] of [18] is not a flatten"));
}

TEST(OnnxImportTest, WeightsThatDoNotFitTheInputAreRefusedNamingThem) {
  OnnxGraph g = OnnxMlp();
  g.model().mutable_graph()->mutable_initializer(0)->set_dims(1, 783);
  g.model().mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(8 * 783 * 4);
  EXPECT_THAT(Refusal(g), HasSubstr("weight \"fc1.weight\" [8, 783] (transB 1) does not take 784"));
}

TEST(OnnxImportTest, AGlobalPoolReadByAConvIsRefused) {
  // Squeeze-and-excitation's 1x1 conv over a pooled [C, 1, 1]: Downpour's
  // pool is a vector.
  OnnxGraph g;
  g.Input("x", {2, 4, 4}).Output("y", {3});
  g.Weight("se.weight", {2, 2, 1, 1}).Weight("fc.weight", {3, 2});
  g.Node("GlobalAveragePool", {"x"}, {"gap"});
  g.Node("Conv", {"gap", "se.weight"}, {"se"});
  g.Node("Flatten", {"se"}, {"f"});
  SetIntAttribute(g.Node("Gemm", {"f", "fc.weight"}, {"y"}), "transB", 1);
  EXPECT_THAT(Refusal(g), HasSubstr("reads \"gap\", a global average pool's [2, 1, 1], which "
                                    "Downpour keeps as the vector [2]"));
}

TEST(OnnxImportTest, AMatMulsBiasIsTakenOnlyWhereTheAddIsItsOneReader) {
  OnnxGraph g;
  g.Input("x", {3}).Output("y", {2});
  g.Weight("w", {3, 2}).Weight("b", {2});
  g.Node("MatMul", {"x", "w"}, {"mm"});
  g.Node("Add", {"mm", "b"}, {"biased"});
  g.Node("Add", {"biased", "mm"}, {"y"});  // Reads mm without the bias.
  EXPECT_THAT(Refusal(g), HasSubstr("adds a bias to \"mm\", which other nodes read without it"));
}

TEST(OnnxImportTest, AWeightTwoLayersReadIsCopiedAndSaidSo) {
  OnnxGraph g;
  g.Input("x", {4}).Output("y", {4});
  g.Weight("fc.weight", {4, 4});
  SetIntAttribute(g.Node("Gemm", {"x", "fc.weight"}, {"h"}), "transB", 1);
  SetIntAttribute(g.Node("Gemm", {"h", "fc.weight"}, {"y"}), "transB", 1);
  absl::StatusOr<ImportedModel> imported = ImportOnnx(g.Bytes(), "tied.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_THAT(LayerNames(imported->model), ElementsAre("fc", "fc_2", "loss"));
  EXPECT_THAT(imported->notes, Contains(HasSubstr("reads weight \"fc.weight\" as an earlier "
                                                  "layer does")));
}

TEST(OnnxImportTest, HugeDimensionsAndWindowsAreRefusedBeforeAnyArithmetic) {
  OnnxGraph wide;
  wide.Input("x", {65536, 65536, 2}).Output("y", {2});
  wide.Node("Flatten", {"x"}, {"y"});
  EXPECT_THAT(Refusal(wide), HasSubstr("input \"x\" has more than 2^31-1 elements"));
  OnnxGraph window = OnnxCnn();
  SetIntsAttribute(*window.model().mutable_graph()->mutable_node(3), "pads",
                   {int64_t{1} << 40, 0, 0, 0});
  EXPECT_THAT(Refusal(window), HasSubstr("a window, stride or pad of 1099511627776 is too large"));
}

TEST(OnnxImportTest, MalformedFilesAreOneClearError) {
  EXPECT_THAT(ImportOnnx("not a model at all", "junk.onnx").status().message(),
              HasSubstr("junk.onnx: not an ONNX model"));
  OnnxGraph old = OnnxMlp();
  old.model().mutable_opset_import(0)->set_version(7);
  EXPECT_THAT(Refusal(old), HasSubstr("opset 7 is not supported; Downpour reads opsets 9 to 21"));
  OnnxGraph truncated = OnnxMlp();
  truncated.model().mutable_graph()->mutable_initializer(1)->mutable_raw_data()->resize(5);
  EXPECT_THAT(Refusal(truncated),
              HasSubstr("initializer \"fc1.bias\": raw_data has 5 bytes; shape [8] needs 32"));
  OnnxGraph external = OnnxMlp();
  external.model().mutable_graph()->mutable_initializer(0)->set_data_location(
      onnx::TensorProto::EXTERNAL);
  EXPECT_THAT(Refusal(external), HasSubstr("stored outside the file"));
  OnnxGraph negative = OnnxMlp();
  negative.model().mutable_graph()->mutable_initializer(0)->set_dims(0, -8);
  EXPECT_THAT(Refusal(negative), HasSubstr("dimension -8 is negative"));
  OnnxGraph two = OnnxMlp();
  two.Output("relu", {8});
  EXPECT_THAT(Refusal(two), HasSubstr("the graph has 2 outputs"));
  OnnxGraph cycle = OnnxMlp();
  cycle.model().mutable_graph()->mutable_node(1)->set_input(0, "logits");
  EXPECT_THAT(Refusal(cycle), HasSubstr("input \"logits\" is not produced by an earlier node"));
  OnnxGraph declared = OnnxMlp();
  declared.model()
      .mutable_graph()
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(1)
      ->set_dim_value(11);
  EXPECT_THAT(Refusal(declared), HasSubstr("declares \"logits\" as [batch, 11]; its nodes "
                                           "compute [batch, 10]"));
}

}  // namespace
}  // namespace downpour
