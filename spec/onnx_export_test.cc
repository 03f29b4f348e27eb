// ExportOnnx over small models with weights in PyTorch's layout: the model's
// header (IR version, opset, producer, metadata), its inputs and outputs,
// each layer's node with its attributes and the initializers it reads
// (names, shapes, bytes), NCHW kept between image layers with a Transpose
// only where a reader needs our order, and each refusal's sentence. That
// ONNX Runtime computes what the job computes is tests/onnx_test.py's.
#include "spec/onnx_export.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "onnx/onnx.pb.h"
#include "spec/model_shape.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

ModelSpec ParseModel(const std::string& text) {
  ModelSpec model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &model)) << text;
  return model;
}

// Every tensor of `model` in PyTorch's layout (control/export.h), values
// k / 64 - 1 (variances k / 64 + 0.5) so that each tensor's bytes differ.
struct Weights {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::string> metadata = {
      {"downpour.layout", "pytorch"}, {"downpour.job", "job-1"}, {"downpour.step", "10"}};

  SafetensorsFile File() const {
    std::vector<TensorToWrite> tensors;
    for (const auto& [name, shape] : shapes) {
      tensors.push_back({name, TensorDtype::kF32, shape, values.at(name).data()});
    }
    std::string bytes = SerializeSafetensors(tensors, metadata).value();
    return SafetensorsFile::Parse(std::move(bytes), "weights").value();
  }
};

Weights PyTorchWeights(const ModelSpec& model) {
  const ModelShape shape = InferModel(model).value();
  Weights w;
  const auto add = [&](const LayerShape& layer, const char* suffix, std::vector<int64_t> dims) {
    const std::string name = absl::StrCat(layer.name, ".", suffix);
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float>& v = w.values[name];
    // A variance is positive.
    const float low = absl::EndsWith(name, "running_var") ? 0.5f : -1.f;
    for (int64_t k = 0; k < n; ++k) v.push_back(static_cast<float>(k % 128) / 64.f + low);
    w.shapes[name] = std::move(dims);
  };
  for (const LayerShape& layer : shape.layers) {
    const std::vector<int64_t> in =
        layer.inputs.empty()
            ? std::vector<int64_t>{}
            : (layer.inputs[0] < 0 ? shape.input_slots[LayerShape::SlotOf(layer.inputs[0])].shape
                                   : shape.layers[layer.inputs[0]].output_shape);
    switch (layer.kind) {
      case LayerKind::kDense:
        add(layer, "weight", {layer.units, in[0]});
        if (layer.param_ids.size() > 1) add(layer, "bias", {layer.units});
        break;
      case LayerKind::kConv2d:
        add(layer, "weight",
            {layer.window.out_c, layer.window.in_c, layer.window.kernel_h, layer.window.kernel_w});
        if (layer.param_ids.size() > 1) add(layer, "bias", {layer.window.out_c});
        break;
      case LayerKind::kBatchNorm:
        for (const char* suffix : {"weight", "bias", "running_mean", "running_var"}) {
          add(layer, suffix, {layer.output_shape.back()});
        }
        break;
      case LayerKind::kEmbedding:
        if (layer.sparse_table < 0) add(layer, "weight", {layer.vocab_size, layer.embedding_dim});
        break;
      default:
        break;
    }
  }
  return w;
}

onnx::ModelProto Export(const ModelSpec& model, const Weights& weights) {
  absl::StatusOr<std::string> bytes = ExportOnnx(model, weights.File());
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  onnx::ModelProto proto;
  EXPECT_TRUE(bytes.ok() && proto.ParseFromString(*bytes));
  return proto;
}

std::string ExportError(const ModelSpec& model, const Weights& weights) {
  absl::StatusOr<std::string> bytes = ExportOnnx(model, weights.File());
  EXPECT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(bytes.status().message());
}

std::vector<std::string> OpTypes(const onnx::GraphProto& graph) {
  std::vector<std::string> ops;
  for (const onnx::NodeProto& node : graph.node()) ops.push_back(node.op_type());
  return ops;
}

const onnx::NodeProto& NodeNamed(const onnx::GraphProto& graph, const std::string& name) {
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.name() == name) return node;
  }
  ADD_FAILURE() << "no node " << name;
  return onnx::NodeProto::default_instance();
}

// The node whose output is `value`.
const onnx::NodeProto& Producer(const onnx::GraphProto& graph, const std::string& value) {
  for (const onnx::NodeProto& node : graph.node()) {
    for (const std::string& out : node.output()) {
      if (out == value) return node;
    }
  }
  ADD_FAILURE() << "no node makes " << value;
  return onnx::NodeProto::default_instance();
}

const onnx::AttributeProto* Attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

std::vector<int64_t> Ints(const onnx::NodeProto& node, const std::string& name) {
  const onnx::AttributeProto* a = Attribute(node, name);
  if (a == nullptr) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

int64_t Int(const onnx::NodeProto& node, const std::string& name) {
  const onnx::AttributeProto* a = Attribute(node, name);
  EXPECT_NE(a, nullptr) << node.name() << " has no " << name;
  return a != nullptr ? a->i() : -1;
}

// "batch" then the fixed dimensions, as text: "batch,2,6,6".
std::string Dims(const onnx::ValueInfoProto& info) {
  std::string out;
  for (const auto& d : info.type().tensor_type().shape().dim()) {
    absl::StrAppend(&out, out.empty() ? "" : ",",
                    d.has_dim_param() ? d.dim_param() : absl::StrCat(d.dim_value()));
  }
  return out;
}

std::vector<std::string> Inputs(const onnx::NodeProto& node) {
  return std::vector<std::string>(node.input().begin(), node.input().end());
}

const onnx::TensorProto* Initializer(const onnx::GraphProto& graph, const std::string& name) {
  for (const onnx::TensorProto& t : graph.initializer()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

TEST(OnnxExportTest, MlpIsGemmsOverTheFlatInput) {
  const ModelSpec model = SmallMlpJob(1, 1).model();
  const Weights weights = PyTorchWeights(model);
  const onnx::ModelProto proto = Export(model, weights);
  EXPECT_EQ(proto.ir_version(), 8);
  ASSERT_EQ(proto.opset_import_size(), 1);
  EXPECT_EQ(proto.opset_import(0).domain(), "");
  EXPECT_EQ(proto.opset_import(0).version(), 17);
  EXPECT_EQ(proto.producer_name(), "downpour");
  std::map<std::string, std::string> meta;
  for (const auto& e : proto.metadata_props()) meta[e.key()] = e.value();
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"downpour.job", "job-1"},
                                                      {"downpour.layout", "pytorch"},
                                                      {"downpour.step", "10"}}));
  const onnx::GraphProto& g = proto.graph();
  EXPECT_EQ(g.name(), "job-1");
  ASSERT_EQ(g.input_size(), 1);
  EXPECT_EQ(g.input(0).name(), "input");
  EXPECT_EQ(g.input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(Dims(g.input(0)), "batch,8");
  ASSERT_EQ(g.output_size(), 2);
  EXPECT_EQ(g.output(0).name(), "logits");
  EXPECT_EQ(Dims(g.output(0)), "batch,3");
  EXPECT_EQ(g.output(1).name(), "probabilities");
  EXPECT_EQ(Dims(g.output(1)), "batch,3");

  // The loss is no node: the last dense makes the logits.
  EXPECT_EQ(OpTypes(g), (std::vector<std::string>{"Gemm", "Relu", "Gemm", "Softmax"}));
  const onnx::NodeProto& fc = NodeNamed(g, "dense0");
  EXPECT_EQ(Inputs(fc), (std::vector<std::string>{"input", "dense0.weight", "dense0.bias"}));
  EXPECT_EQ(Int(fc, "transB"), 1);
  EXPECT_EQ(Producer(g, "logits").name(), "dense2");
  EXPECT_EQ(Inputs(NodeNamed(g, "probabilities")), std::vector<std::string>{"logits"});
  EXPECT_EQ(Int(NodeNamed(g, "probabilities"), "axis"), 1);

  ASSERT_EQ(g.initializer_size(), 4);
  for (const auto& [name, dims] : weights.shapes) {
    const onnx::TensorProto* t = Initializer(g, name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->data_type(), onnx::TensorProto::FLOAT);
    EXPECT_EQ(std::vector<int64_t>(t->dims().begin(), t->dims().end()), dims) << name;
    const std::vector<float>& v = weights.values.at(name);
    EXPECT_EQ(t->raw_data(),
              std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)))
        << name;
  }
}

// Conv, batch norm, a residual add, both pools, concat of images and of
// vectors, global average pooling and a dense after a flatten: NCHW all the
// way, with no Transpose.
constexpr char kCnn[] = R"pb(
  input_shape: [ 6, 6, 2 ]
  num_classes: 3
  layer {
    name: "c1"
    conv2d { filters: 4 kernel_size: 3 no_bias: true }
  }
  layer {
    name: "bn1"
    batch_norm { epsilon: 0.002 }
  }
  layer {
    name: "r1"
    relu {}
  }
  layer {
    name: "c2"
    conv2d {
      filters: 4
      kernel_size: [ 3, 1 ]
      stride: [ 1, 1 ]
    }
  }
  layer {
    name: "res"
    inputs: [ "r1", "c2" ]
    add {}
  }
  layer {
    name: "mp"
    max_pool { window: 2 }
  }
  layer {
    name: "ap"
    inputs: "res"
    avg_pool { window: 3 stride: 2 }
  }
  layer {
    name: "cat"
    inputs: [ "mp", "ap" ]
    concat {}
  }
  layer {
    name: "gap"
    global_avg_pool {}
  }
  layer {
    name: "flat"
    inputs: "cat"
    flatten {}
  }
  layer {
    name: "fc1"
    dense { units: 5 }
  }
  layer {
    name: "drop"
    dropout { rate: 0.5 }
  }
  layer {
    name: "head"
    inputs: [ "gap", "drop" ]
    concat {}
  }
  layer {
    name: "logits"
    dense { units: 3 }
  }
  layer {
    name: "loss"
    softmax_cross_entropy {}
  }
)pb";

TEST(OnnxExportTest, CnnStaysNchwBetweenImageLayers) {
  const ModelSpec model = ParseModel(kCnn);
  const onnx::ModelProto proto = Export(model, PyTorchWeights(model));
  const onnx::GraphProto& g = proto.graph();
  EXPECT_EQ(Dims(g.input(0)), "batch,2,6,6");
  EXPECT_EQ(OpTypes(g),
            (std::vector<std::string>{"Conv", "BatchNormalization", "Relu", "Conv", "Add",
                                      "MaxPool", "AveragePool", "Concat", "GlobalAveragePool",
                                      "Flatten", "Flatten", "Gemm", "Concat", "Gemm", "Softmax"}));

  const onnx::NodeProto& c1 = NodeNamed(g, "c1");
  EXPECT_EQ(Inputs(c1), (std::vector<std::string>{"input", "c1.weight"}));
  EXPECT_EQ(Ints(c1, "kernel_shape"), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(Ints(c1, "strides"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(Ints(c1, "pads"), (std::vector<int64_t>{1, 1, 1, 1}));  // SAME
  EXPECT_EQ(Int(c1, "group"), 1);
  EXPECT_EQ(Dims(g.input(0)), "batch,2,6,6");
  const onnx::TensorProto* w = Initializer(g, "c1.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(std::vector<int64_t>(w->dims().begin(), w->dims().end()),
            (std::vector<int64_t>{4, 2, 3, 3}));
  const onnx::NodeProto& c2 = NodeNamed(g, "c2");
  EXPECT_EQ(Inputs(c2), (std::vector<std::string>{"r1", "c2.weight", "c2.bias"}));
  EXPECT_EQ(Ints(c2, "kernel_shape"), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(Ints(c2, "pads"), (std::vector<int64_t>{1, 0, 1, 0}));

  const onnx::NodeProto& bn = NodeNamed(g, "bn1");
  EXPECT_EQ(Inputs(bn), (std::vector<std::string>{"c1", "bn1.weight", "bn1.bias",
                                                  "bn1.running_mean", "bn1.running_var"}));
  ASSERT_NE(Attribute(bn, "epsilon"), nullptr);
  EXPECT_FLOAT_EQ(Attribute(bn, "epsilon")->f(), 0.002f);

  EXPECT_EQ(Inputs(NodeNamed(g, "res")), (std::vector<std::string>{"r1", "c2"}));
  const onnx::NodeProto& mp = NodeNamed(g, "mp");
  EXPECT_EQ(Ints(mp, "kernel_shape"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Ints(mp, "strides"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Ints(mp, "pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  // 6 wide, window 3, stride 2, SAME: 3 out, 1 padding, at the bottom/right;
  // padding not counted in the mean.
  const onnx::NodeProto& ap = NodeNamed(g, "ap");
  EXPECT_EQ(Inputs(ap), std::vector<std::string>{"res"});
  EXPECT_EQ(Ints(ap, "pads"), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(Int(ap, "count_include_pad"), 0);
  // Our last axis is NCHW's channels.
  EXPECT_EQ(Int(NodeNamed(g, "cat"), "axis"), 1);

  EXPECT_EQ(Inputs(NodeNamed(g, "gap")), std::vector<std::string>{"cat"});
  EXPECT_EQ(Inputs(NodeNamed(g, "gap/flatten")), std::vector<std::string>{"gap/pooled"});
  // fc1's weight takes NCHW's order: flatten the NCHW tensor as it is.
  const onnx::NodeProto& flat = NodeNamed(g, "flat");
  EXPECT_EQ(Inputs(flat), std::vector<std::string>{"cat"});
  EXPECT_EQ(Int(flat, "axis"), 1);
  EXPECT_EQ(Inputs(NodeNamed(g, "fc1")),
            (std::vector<std::string>{"flat", "fc1.weight", "fc1.bias"}));
  // Dropout is no node; the head concatenates vectors.
  const onnx::NodeProto& head = NodeNamed(g, "head");
  EXPECT_EQ(Inputs(head), (std::vector<std::string>{"gap", "fc1"}));
  EXPECT_EQ(Int(head, "axis"), 1);
  EXPECT_EQ(Producer(g, "logits").name(), "logits");
  EXPECT_EQ(Inputs(Producer(g, "logits"))[0], "head");
  // Every parameter and statistic, nothing else (num_batches_tracked is not read).
  std::set<std::string> names;
  for (const onnx::TensorProto& t : g.initializer()) names.insert(t.name());
  EXPECT_EQ(names, (std::set<std::string>{"c1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                          "bn1.running_var", "c2.weight", "c2.bias", "fc1.weight",
                                          "fc1.bias", "logits.weight", "logits.bias"}));
}

// A flatten read by a dense (whose weight control/export.h put in NCHW
// order) and through a dropout by another (ours, HWC): two Flattens, the
// second after a Transpose back to NHWC.
TEST(OnnxExportTest, FlattenFollowsItsReadersWeightOrder) {
  const ModelSpec model = ParseModel(R"pb(
    input_shape: [ 4, 4, 3 ]
    num_classes: 2
    layer {
      name: "flat"
      flatten {}
    }
    layer {
      name: "a"
      dense { units: 2 }
    }
    layer {
      name: "drop"
      inputs: "flat"
      dropout { rate: 0.1 }
    }
    layer {
      name: "b"
      dense { units: 2 }
    }
    layer {
      name: "sum"
      inputs: [ "a", "b" ]
      add {}
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  const onnx::GraphProto g = Export(model, PyTorchWeights(model)).graph();
  EXPECT_EQ(OpTypes(g), (std::vector<std::string>{"Flatten", "Gemm", "Transpose", "Flatten", "Gemm",
                                                  "Add", "Softmax"}));
  EXPECT_EQ(Inputs(NodeNamed(g, "a"))[0], "flat");
  EXPECT_EQ(Inputs(NodeNamed(g, "flat")), std::vector<std::string>{"input"});
  const onnx::NodeProto& to_nhwc = Producer(g, "input/nhwc");
  EXPECT_EQ(to_nhwc.op_type(), "Transpose");
  EXPECT_EQ(Ints(to_nhwc, "perm"), (std::vector<int64_t>{0, 2, 3, 1}));
  const onnx::NodeProto& b = NodeNamed(g, "b");
  EXPECT_EQ(Producer(g, Inputs(b)[0]).op_type(), "Flatten");
  EXPECT_EQ(Inputs(Producer(g, Inputs(b)[0])), std::vector<std::string>{"input/nhwc"});
  EXPECT_EQ(Producer(g, "logits").name(), "sum");
}

TEST(OnnxExportTest, ANamedImageInputFlattensInTheOrderItsDenseWeightHas) {
  // control/export.cc lays "fc.weight" out for an NCHW flatten of the named
  // image input as of the unnamed one: the graph must flatten it so.
  const ModelSpec model = ParseModel(R"pb(
    num_classes: 2
    inputs {
      name: "img"
      shape: [ 4, 4, 3 ]
    }
    inputs {
      name: "extra"
      shape: [ 2 ]
    }
    layer {
      name: "flat"
      inputs: "img"
      flatten {}
    }
    layer {
      name: "fc"
      dense { units: 2 }
    }
    layer {
      name: "side"
      inputs: "extra"
      dense { units: 2 }
    }
    layer {
      name: "sum"
      inputs: [ "fc", "side" ]
      add {}
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  const onnx::GraphProto g = Export(model, PyTorchWeights(model)).graph();
  const onnx::NodeProto& flat = NodeNamed(g, "flat");
  EXPECT_EQ(Inputs(flat), std::vector<std::string>{"img"});  // Already NCHW: no Transpose.
  EXPECT_EQ(Inputs(NodeNamed(g, "fc"))[0], flat.output(0));
}

TEST(OnnxExportTest, PaddingComesFromTheWindow) {
  const ModelSpec model = ParseModel(R"pb(
    input_shape: [ 5, 5, 1 ]
    num_classes: 2
    layer {
      name: "same"
      conv2d { filters: 2 kernel_size: 2 stride: 2 }
    }
    layer {
      name: "valid"
      inputs: "same"
      max_pool { window: 2 stride: 1 padding: VALID }
    }
    layer {
      name: "wide"
      inputs: "same"
      conv2d { filters: 1 kernel_size: 2 stride: 2 padding: VALID }
    }
    layer {
      name: "explicit"
      inputs: "same"
      avg_pool {
        window: 2
        padding: EXPLICIT
        explicit_padding: [ 1, 0, 0, 1 ]
      }
    }
    layer {
      name: "flat"
      inputs: "explicit"
      flatten {}
    }
    layer {
      name: "logits"
      dense { units: 2 }
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  const onnx::GraphProto g = Export(model, PyTorchWeights(model)).graph();
  // 5 wide, kernel 2, stride 2, SAME: 3 out, 1 padding at the bottom/right.
  EXPECT_EQ(Ints(NodeNamed(g, "same"), "pads"), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(Ints(NodeNamed(g, "valid"), "pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  // 3 wide, kernel 2, stride 2, VALID: one window, the last row and column
  // unread (a padding of -1 in the window, 0 in ONNX).
  EXPECT_EQ(Ints(NodeNamed(g, "wide"), "pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  // [top, bottom, left, right] in the spec; [top, left, bottom, right] in ONNX.
  EXPECT_EQ(Ints(NodeNamed(g, "explicit"), "pads"), (std::vector<int64_t>{1, 0, 0, 1}));
}

// Named dense inputs, a dense embedding (Cast, Gather), batch norm over a
// vector and over an embedding's [ids, dim] output, and dot_interaction.
TEST(OnnxExportTest, NamedInputsEmbeddingsAndDotInteraction) {
  const ModelSpec model = ParseModel(R"pb(
    num_classes: 2
    inputs {
      name: "x"
      shape: [ 4 ]
    }
    inputs {
      name: "ids"
      shape: [ 2 ]
    }
    layer {
      name: "bx"
      inputs: "x"
      dense { units: 4 }
    }
    layer {
      name: "bnx"
      batch_norm {}
    }
    layer {
      name: "emb"
      inputs: "ids"
      embedding { vocab_size: 10 dim: 4 }
    }
    layer {
      name: "bne"
      batch_norm {}
    }
    layer {
      name: "flat"
      flatten {}
    }
    layer {
      name: "proj"
      dense { units: 4 }
    }
    layer {
      name: "dot"
      inputs: [ "bnx", "proj", "bx" ]
      dot_interaction {}
    }
    layer {
      name: "cat"
      inputs: [ "bx", "dot" ]
      concat {}
    }
    layer {
      name: "logits"
      dense { units: 2 }
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  const onnx::GraphProto g = Export(model, PyTorchWeights(model)).graph();
  ASSERT_EQ(g.input_size(), 2);
  EXPECT_EQ(g.input(0).name(), "x");
  EXPECT_EQ(Dims(g.input(0)), "batch,4");
  EXPECT_EQ(g.input(1).name(), "ids");
  EXPECT_EQ(Dims(g.input(1)), "batch,2");
  EXPECT_EQ(Inputs(NodeNamed(g, "bnx"))[0], "bx");  // A vector: no Transpose.
  const onnx::NodeProto& cast = NodeNamed(g, "emb/cast");
  EXPECT_EQ(Inputs(cast), std::vector<std::string>{"ids"});
  EXPECT_EQ(Int(cast, "to"), onnx::TensorProto::INT64);
  const onnx::NodeProto& gather = NodeNamed(g, "emb");
  EXPECT_EQ(gather.op_type(), "Gather");
  EXPECT_EQ(Inputs(gather), (std::vector<std::string>{"emb.weight", "emb/ids"}));
  EXPECT_EQ(Int(gather, "axis"), 0);
  // [ids, dim]: batch norm over dim, ONNX's axis 1, and back for the flatten.
  const onnx::NodeProto& bne = NodeNamed(g, "bne");
  const onnx::NodeProto& to_first = Producer(g, Inputs(bne)[0]);
  EXPECT_EQ(Ints(to_first, "perm"), (std::vector<int64_t>{0, 2, 1}));
  EXPECT_EQ(Inputs(to_first), std::vector<std::string>{"emb"});
  const onnx::NodeProto& flat = NodeNamed(g, "flat");
  const onnx::NodeProto& to_last = Producer(g, Inputs(flat)[0]);
  EXPECT_EQ(Ints(to_last, "perm"), (std::vector<int64_t>{0, 2, 1}));
  EXPECT_EQ(Inputs(to_last), std::vector<std::string>{"bne"});

  // Three vectors stacked [batch, 3, 4], times their transpose, the upper
  // triangle: pairs (0,1), (0,2), (1,2) at 1, 2 and 5 of the flat 3x3.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(NodeNamed(g, absl::StrCat("dot/unsqueeze", i)).op_type(), "Unsqueeze");
  }
  EXPECT_EQ(Int(NodeNamed(g, "dot/stack"), "axis"), 1);
  EXPECT_EQ(Ints(NodeNamed(g, "dot/transpose"), "perm"), (std::vector<int64_t>{0, 2, 1}));
  EXPECT_EQ(Inputs(NodeNamed(g, "dot/matmul")),
            (std::vector<std::string>{"dot/stacked", "dot/transposed"}));
  const onnx::TensorProto* shape = Initializer(g, "dot/shape");
  ASSERT_NE(shape, nullptr);
  EXPECT_EQ(std::vector<int64_t>(shape->int64_data().begin(), shape->int64_data().end()),
            (std::vector<int64_t>{0, 9}));
  const onnx::NodeProto& dot = NodeNamed(g, "dot");
  EXPECT_EQ(dot.op_type(), "Gather");
  EXPECT_EQ(Int(dot, "axis"), 1);
  const onnx::TensorProto* pairs = Initializer(g, Inputs(dot)[1]);
  ASSERT_NE(pairs, nullptr);
  EXPECT_EQ(pairs->data_type(), onnx::TensorProto::INT64);
  EXPECT_EQ(std::vector<int64_t>(pairs->int64_data().begin(), pairs->int64_data().end()),
            (std::vector<int64_t>{1, 2, 5}));
  EXPECT_EQ(Int(NodeNamed(g, "cat"), "axis"), 1);
}

TEST(OnnxExportTest, TheLossReadingAnInputGetsAnIdentity) {
  const ModelSpec model = ParseModel(R"pb(
    input_shape: [ 3 ]
    num_classes: 3
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  const onnx::GraphProto g = Export(model, PyTorchWeights(model)).graph();
  EXPECT_EQ(OpTypes(g), (std::vector<std::string>{"Identity", "Softmax"}));
  EXPECT_EQ(Inputs(Producer(g, "logits")), std::vector<std::string>{"input"});
}

TEST(OnnxExportTest, SparseEmbeddingsAreRefused) {
  const ModelSpec model = SmallSparseModel();
  EXPECT_EQ(ExportError(model, PyTorchWeights(model)),
            "layer \"e\" (embedding): sparse tables have no ONNX form in this exporter; export "
            "--format=safetensors");
}

TEST(OnnxExportTest, EmbeddingIdsFromALayerAreRefused) {
  const ModelSpec model = ParseModel(R"pb(
    input_shape: [ 2 ]
    num_classes: 2
    layer {
      name: "r"
      relu {}
    }
    layer {
      name: "emb"
      embedding { vocab_size: 4 dim: 1 }
    }
    layer {
      name: "flat"
      flatten {}
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  EXPECT_EQ(ExportError(model, PyTorchWeights(model)),
            "layer \"emb\" (embedding): ids computed by layer \"r\" have no ONNX form in this "
            "exporter; read them from a model input");
}

TEST(OnnxExportTest, MissingOrMisshapenWeightsAreNamed) {
  const ModelSpec model = SmallMlpJob(1, 1).model();
  Weights weights = PyTorchWeights(model);
  weights.shapes.erase("dense2.bias");
  EXPECT_EQ(ExportError(model, weights),
            "the weights have no tensor \"dense2.bias\" (layer \"dense2\" (dense) needs F32 [3])");
  weights = PyTorchWeights(model);
  weights.shapes["dense0.weight"] = {8, 16};  // Ours, not PyTorch's.
  EXPECT_EQ(ExportError(model, weights),
            "the weights' tensor \"dense0.weight\" is F32 [8, 16]; layer \"dense0\" (dense) "
            "needs F32 [16, 8]");
}

TEST(OnnxExportTest, TheNativeLayoutIsRefused) {
  const ModelSpec model = SmallMlpJob(1, 1).model();
  Weights weights = PyTorchWeights(model);
  weights.metadata["downpour.layout"] = "native";
  EXPECT_EQ(ExportError(model, weights),
            "the weights are in the native layout; ONNX export reads the pytorch layout");
}

TEST(OnnxExportTest, AnInputNamedLikeAnOutputIsRefused) {
  const ModelSpec model = ParseModel(R"pb(
    num_classes: 2
    inputs {
      name: "logits"
      shape: [ 3 ]
    }
    layer {
      name: "fc"
      inputs: "logits"
      dense { units: 2 }
    }
    layer {
      name: "loss"
      softmax_cross_entropy {}
    }
  )pb");
  EXPECT_EQ(ExportError(model, PyTorchWeights(model)),
            "model input \"logits\" has the name of an output or weight of the ONNX graph; "
            "rename the input");
}

TEST(OnnxExportTest, AnInvalidModelIsInferModelsError) {
  ModelSpec model = SmallMlpJob(1, 1).model();
  Weights weights = PyTorchWeights(model);
  model.mutable_layer(0)->mutable_dense()->set_units(0);
  EXPECT_EQ(ExportError(model, weights),
            "model.layer[0] (\"dense0\"): dense.units must be positive, got 0");
}

}  // namespace
}  // namespace downpour
