#include "spec/onnx_test_graphs.h"

namespace downpour {

OnnxGraph::OnnxGraph() { model_.add_opset_import()->set_version(17); }

OnnxGraph& OnnxGraph::Input(const std::string& name, std::vector<int64_t> dims, int type) {
  onnx::ValueInfoProto* v = model_.mutable_graph()->add_input();
  v->set_name(name);
  onnx::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(type);
  t->mutable_shape()->add_dim()->set_dim_param("batch");
  for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  return *this;
}

OnnxGraph& OnnxGraph::Output(const std::string& name, std::vector<int64_t> dims) {
  onnx::ValueInfoProto* v = model_.mutable_graph()->add_output();
  v->set_name(name);
  onnx::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("batch");
  for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  return *this;
}

OnnxGraph& OnnxGraph::Weight(const std::string& name, std::vector<int64_t> dims, float start,
                             float step) {
  onnx::TensorProto* t = model_.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) {
    t->add_dims(d);
    n *= d;
  }
  std::vector<float> v(n);
  for (int64_t k = 0; k < n; ++k) v[k] = start + k * step;
  t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), n * 4));
  return *this;
}

OnnxGraph& OnnxGraph::Ints(const std::string& name, std::vector<int64_t> values) {
  onnx::TensorProto* t = model_.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
  return *this;
}

onnx::NodeProto& OnnxGraph::Node(const std::string& op, std::vector<std::string> in,
                                 std::vector<std::string> out) {
  onnx::NodeProto* n = model_.mutable_graph()->add_node();
  n->set_op_type(op);
  n->set_name("/" + out[0] + "/" + op);
  for (const std::string& s : in) n->add_input(s);
  for (const std::string& s : out) n->add_output(s);
  return *n;
}

void SetIntsAttribute(onnx::NodeProto& node, const std::string& name, std::vector<int64_t> values) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void SetIntAttribute(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

OnnxGraph OnnxMlp() {
  OnnxGraph g;
  g.Input("input", {1, 28, 28}).Output("logits", {10});
  g.Weight("fc1.weight", {8, 784}).Weight("fc1.bias", {8}).Weight("fc2.weight", {10, 8});
  g.Weight("fc2.bias", {10});
  g.Node("Flatten", {"input"}, {"flat"});
  SetIntAttribute(g.Node("Gemm", {"flat", "fc1.weight", "fc1.bias"}, {"h"}), "transB", 1);
  g.Node("Relu", {"h"}, {"relu"});
  SetIntAttribute(g.Node("Gemm", {"relu", "fc2.weight", "fc2.bias"}, {"logits"}), "transB", 1);
  return g;
}

OnnxGraph OnnxCnn() {
  OnnxGraph g;
  g.Input("image", {3, 8, 8}).Output("probs", {5});
  g.Weight("conv1.weight", {4, 3, 3, 3}).Weight("conv1.bias", {4});
  g.Weight("bn1.weight", {4}, 1.f).Weight("bn1.bias", {4}).Weight("bn1.running_mean", {4});
  g.Weight("bn1.running_var", {4}, 1.f);
  g.Weight("conv2.weight", {4, 4, 3, 3});
  g.Weight("side.weight", {2, 4, 1, 1});
  g.Weight("fc.weight", {5, 6}).Weight("fc.bias", {5});
  onnx::NodeProto& conv1 = g.Node("Conv", {"image", "conv1.weight", "conv1.bias"}, {"c1"});
  SetIntsAttribute(conv1, "pads", {1, 1, 1, 1});
  SetIntsAttribute(conv1, "kernel_shape", {3, 3});
  g.Node("BatchNormalization",
         {"c1", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"}, {"b1"});
  g.Node("Relu", {"b1"}, {"r1"});
  onnx::NodeProto& pool = g.Node("MaxPool", {"r1"}, {"p1"});
  SetIntsAttribute(pool, "kernel_shape", {2, 2});
  SetIntsAttribute(pool, "strides", {2, 2});
  SetIntsAttribute(g.Node("Conv", {"p1", "conv2.weight"}, {"c2"}), "pads", {1, 1, 1, 1});
  g.Node("Add", {"c2", "p1"}, {"res"});
  g.Node("Conv", {"res", "side.weight"}, {"side"});
  SetIntAttribute(g.Node("Concat", {"res", "side"}, {"cat"}), "axis", 1);
  g.Node("GlobalAveragePool", {"cat"}, {"gap"});
  g.Node("Flatten", {"gap"}, {"flat"});
  SetIntAttribute(g.Node("Gemm", {"flat", "fc.weight", "fc.bias"}, {"logits"}), "transB", 1);
  g.Node("Softmax", {"logits"}, {"probs"});
  return g;
}

OnnxGraph OnnxViewFlatten() {
  OnnxGraph g;
  g.Input("x", {2, 3, 3}).Output("y", {4});
  g.Weight("fc.weight", {4, 18}).Ints("zero", {0}).Ints("minus_one", {-1});
  g.Node("Shape", {"x"}, {"shape"});
  g.Node("Gather", {"shape", "zero"}, {"batch"});
  g.Node("Concat", {"batch", "minus_one"}, {"target"});
  g.Node("Reshape", {"x", "target"}, {"flat"});
  SetIntAttribute(g.Node("Gemm", {"flat", "fc.weight"}, {"y"}), "transB", 1);
  return g;
}

OnnxGraph OnnxEmbedding() {
  OnnxGraph g;
  g.Input("ids", {3}, onnx::TensorProto::INT64).Input("dense", {4}).Output("y", {2});
  g.Weight("emb.weight", {50, 4}).Weight("fc.weight", {2, 16});
  g.Node("Gather", {"emb.weight", "ids"}, {"rows"});
  g.Node("Flatten", {"rows"}, {"flat"});
  SetIntAttribute(g.Node("Concat", {"flat", "dense"}, {"cat"}), "axis", 1);
  SetIntAttribute(g.Node("Gemm", {"cat", "fc.weight"}, {"y"}), "transB", 1);
  return g;
}

}  // namespace downpour
