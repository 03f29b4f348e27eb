// ONNX graphs built with the message API, as an exporter writes them: the
// importer's tests and the fuzzer's seeds (fuzz/make_corpus.cc). testonly.
#ifndef DOWNPOUR_SPEC_ONNX_TEST_GRAPHS_H_
#define DOWNPOUR_SPEC_ONNX_TEST_GRAPHS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "onnx/onnx.pb.h"

namespace downpour {

class OnnxGraph {
 public:
  OnnxGraph();
  // A tensor input [batch, dims...] of element type `type`.
  OnnxGraph& Input(const std::string& name, std::vector<int64_t> dims,
                   int type = onnx::TensorProto::FLOAT);
  OnnxGraph& Output(const std::string& name, std::vector<int64_t> dims = {});
  // A float initializer whose element k is start + k * step (raw_data).
  OnnxGraph& Weight(const std::string& name, std::vector<int64_t> dims, float start = 0.f,
                    float step = 0.01f);
  // An int64 vector initializer (int64_data).
  OnnxGraph& Ints(const std::string& name, std::vector<int64_t> values);
  // A node named "/<first output>/<op>".
  onnx::NodeProto& Node(const std::string& op, std::vector<std::string> in,
                        std::vector<std::string> out);
  onnx::ModelProto& model() { return model_; }
  std::string Bytes() const { return model_.SerializeAsString(); }

 private:
  onnx::ModelProto model_;
};

void SetIntsAttribute(onnx::NodeProto& node, const std::string& name, std::vector<int64_t> values);
void SetIntAttribute(onnx::NodeProto& node, const std::string& name, int64_t value);

// torch.nn.Sequential(Flatten, Linear(784, 8), ReLU, Linear(8, 10)) as
// torch.onnx.export writes it: input "input" [batch, 1, 28, 28], output
// "logits" [batch, 10], weights fc1.* and fc2.*.
OnnxGraph OnnxMlp();
// conv(pad 1)-batch norm-relu-max pool, a residual conv + add, a 1x1 conv
// concatenated to it, global average pool, flatten, Gemm, softmax: input
// "image" [batch, 3, 8, 8], output "probs" [batch, 5].
OnnxGraph OnnxCnn();
// x.view(x.size(0), -1) as older exporters write it (Shape, Gather, Concat,
// Reshape) before a Gemm: input "x" [batch, 2, 3, 3], output "y" [batch, 4].
OnnxGraph OnnxViewFlatten();
// int64 "ids" [batch, 3] through a Gather of "emb.weight" [50, 4], flattened
// and concatenated with "dense" [batch, 4], then a Gemm: output "y" [batch, 2].
OnnxGraph OnnxEmbedding();

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_ONNX_TEST_GRAPHS_H_
