// The ONNX importer's parts (spec/onnx_import.h says what it does): the
// class its two files share (onnx_import.cc: the graph, its inputs and
// outputs, constants, checks; onnx_import_layers.cc: one function a layer
// op). Internal to //spec:onnx_import.
#ifndef DOWNPOUR_SPEC_ONNX_IMPORTER_H_
#define DOWNPOUR_SPEC_ONNX_IMPORTER_H_

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "onnx/onnx.pb.h"
#include "proto/job.pb.h"
#include "spec/onnx_import.h"
#include "spec/onnx_tensor.h"

namespace downpour {
namespace onnx_import_internal {

using onnx::AttributeProto;
using onnx::NodeProto;
using onnx::TensorProto;
using Const = OnnxConst;

// A tensor the network computes, per example (the batch dimension left out).
struct Value {
  // The layer (or named model input) that produces it; empty: the model's
  // one unnamed input.
  std::string layer;
  std::vector<int64_t> dims;  // ONNX's order: [C, H, W] for an image.
  std::vector<int64_t> ours;  // Downpour's: [H, W, C] for an image.
  bool ids = false;           // Integer ids, a Gather's indices.
  // A flatten of an image of more than one pixel: ONNX flattens CHW and
  // Downpour HWC, which only a dense layer's weight can make up for.
  bool flattened_image = false;
  bool softmax = false;  // A final Softmax / LogSoftmax: the loss.
  int bias_layer = -1;   // A MatMul's dense layer still waiting for its bias.
  bool image() const { return dims.size() == 3; }
};

inline bool SimpleName(const std::string& name) {
  if (name.empty() || name.size() > 64 || !absl::ascii_isalpha(name[0])) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char ch) { return absl::ascii_isalnum(ch) || ch == '_' || ch == '.'; });
}

// A weight the import hands back, in PyTorch's layout.
struct Weight {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<float> values;
};

class Importer {
 public:
  Importer(const onnx::GraphProto& graph, std::string file, int opset)
      : graph_(graph), file_(std::move(file)), opset_(opset) {}

  absl::StatusOr<ImportedModel> Run();

 private:
  template <typename... Args>
  absl::Status Error(const NodeProto& node, const Args&... args) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": node \"", node.name(), "\" (", node.op_type(), "): ", args...));
  }
  template <typename... Args>
  absl::Status FileError(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", args...));
  }

  absl::Status ReadInitializers();
  absl::Status ReadInputs();
  absl::Status Take(const NodeProto& node);
  absl::Status Finish();
  absl::Status CheckDeclaredShapes();

  // Attributes, checked against the set each op understands.
  absl::Status CheckAttributes(const NodeProto& node, std::set<std::string> known) const;
  const AttributeProto* Attribute(const NodeProto& node, const std::string& name) const;
  absl::StatusOr<int64_t> IntAttr(const NodeProto& node, const std::string& name,
                                  int64_t fallback) const;
  absl::StatusOr<float> FloatAttr(const NodeProto& node, const std::string& name,
                                  float fallback) const;
  absl::StatusOr<std::vector<int64_t>> IntsAttr(const NodeProto& node, const std::string& name,
                                                std::vector<int64_t> fallback) const;

  // Input k of `node`: a value the network computes, or a constant.
  absl::StatusOr<const Value*> ValueInput(const NodeProto& node, int k,
                                          bool flattened_image_ok = false) const;
  absl::StatusOr<const Const*> ConstInput(const NodeProto& node, int k) const;
  bool IsConst(const NodeProto& node, int k) const {
    return k < node.input_size() && consts_.count(node.input(k)) > 0;
  }
  absl::Status SetOutput(const NodeProto& node, Value value, bool extra_outputs_ok = false);

  // A new layer reading `inputs`, named after `weight` ("x.weight" -> "x")
  // or the node.
  absl::StatusOr<LayerSpec*> AddLayer(const NodeProto& node,
                                      const std::vector<const Value*>& inputs, const Const* weight,
                                      std::vector<int64_t> ours);
  void AddWeight(const LayerSpec& layer, const std::string& what, std::vector<int64_t> dims,
                 std::vector<float> values);

  absl::Status TakeConv(const NodeProto& node);
  absl::Status TakePool(const NodeProto& node);
  absl::Status TakeGemm(const NodeProto& node);
  absl::Status TakeMatMul(const NodeProto& node);
  absl::Status TakeAdd(const NodeProto& node);
  absl::Status TakeBatchNorm(const NodeProto& node);
  absl::Status TakeConcat(const NodeProto& node);
  absl::Status TakeFlatten(const NodeProto& node, const Value& x);
  // GlobalAveragePool, ReduceMean over height and width: [C, 1, 1] to ONNX
  // (or [C]), the vector [C] in Downpour.
  absl::Status TakeGlobalPool(const NodeProto& node, const Value& x, bool keepdims);
  absl::Status TakeGather(const NodeProto& node);
  absl::Status Fold(const NodeProto& node);

  // The window of a Conv or pool: explicit pads [top, bottom, left, right]
  // (auto_pad resolved) and the output's height and width.
  struct Window {
    std::vector<int64_t> kernel, stride, pads;
    int64_t out_h = 0, out_w = 0;
  };
  absl::StatusOr<Window> ReadWindow(const NodeProto& node, const Value& x,
                                    std::vector<int64_t> kernel) const;

  const onnx::GraphProto& graph_;
  const std::string file_;
  const int opset_;
  std::map<std::string, Const> consts_;
  std::map<std::string, Value> values_;
  bool named_inputs_ = false;
  ModelSpec model_;
  std::map<std::string, std::vector<int64_t>> expected_;  // Layer -> its shape (ours).
  std::set<std::string> names_;
  std::map<std::string, int> op_count_;
  std::vector<Weight> weights_;
  // How many nodes (and graph outputs) read each name.
  std::map<std::string, int> uses_;
  // Weights a layer was named after (a second reader is told of).
  std::set<std::string> tied_;
  size_t copied_bytes_ = 0;
  std::vector<std::string> notes_;
};

}  // namespace onnx_import_internal
}  // namespace downpour

#endif  // DOWNPOUR_SPEC_ONNX_IMPORTER_H_
