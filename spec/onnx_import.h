// An ONNX model (a serialized onnx.ModelProto, as torch.onnx.export, Keras
// converters or the onnx package write it) turned into a ModelSpec and the
// weights it starts from, so a network written in another framework trains
// on the cluster unchanged.
//
// What maps (default domain, opsets kMinOnnxOpset..kMaxOnnxOpset):
//   Conv (group 1, dilations 1)            -> conv2d (EXPLICIT padding)
//   Gemm (alpha = beta = 1, transA 0)      -> dense
//   MatMul by a weight, + Add of a bias    -> dense
//   Relu -> relu; Dropout -> dropout; BatchNormalization (inference form) ->
//   batch_norm; MaxPool / AveragePool (ceil_mode 0; padding counted only
//   where there is none) -> max_pool / avg_pool; GlobalAveragePool (with the
//   Flatten after it) -> global_avg_pool; Add of two tensors -> add;
//   Concat along the channels or features -> concat; Flatten, and a Reshape
//   to [batch, -1] -> flatten; Gather from a weight (axis 0) -> a dense
//   embedding; Identity is passed through; Shape, Constant, Unsqueeze,
//   Concat and Gather over constants are folded (how older exporters spell a
//   flatten). A final Softmax or LogSoftmax is the loss; a graph that ends in
//   logits gets the loss after them: the job trains a classifier with
//   softmax cross-entropy over the graph's output (num_classes = its width).
// Anything else is refused with one sentence naming the node, its op and
// why: an op not in the list, an attribute value, a layout, an opset.
//
// Layouts. The graph's input is NCHW ([batch, C, H, W]) or [batch, F];
// Downpour's images are NHWC, so an image input becomes input_shape
// [H, W, C] (records hold images in HWC order). The weights come back as a
// safetensors file in PyTorch's names and layouts (control/export.h), which
// `submit --init_from` and WriteInitialCheckpoint take as they are: a layer
// with a weight is named after it ("conv1.weight" -> layer "conv1", so an
// export of the trained job loads into the original PyTorch module with
// load_state_dict), other layers after their node's output or op. Because
// Downpour flattens images in HWC order, a flattened image may only feed a
// Gemm or MatMul directly (whose weight is then reordered); anything else
// reading it is refused.
//
// A graph with one floating-point input uses ModelSpec.input_shape; several
// inputs, or integer ids for a Gather, become named inputs (ModelSpec.inputs,
// DENSE, features named after the input). Shapes come from the graph (the
// input's, and value_info / outputs where the file has them) and are checked
// against Downpour's own inference (InferModel).
//
// Malformed or hostile bytes are InvalidArgument naming the file; nothing
// here trusts a size or an index from the file before checking it.
// Thread-safe: a pure function.
#ifndef DOWNPOUR_SPEC_ONNX_IMPORT_H_
#define DOWNPOUR_SPEC_ONNX_IMPORT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace downpour {

inline constexpr int kMinOnnxOpset = 9;
inline constexpr int kMaxOnnxOpset = 21;
// The largest ONNX file taken (weights inside it): protobuf's own bound.
inline constexpr size_t kMaxOnnxBytes = (size_t{1} << 31) - 1;

struct ImportedModel {
  ModelSpec model;
  // A safetensors file of every parameter and batch-norm statistic of
  // `model`, in PyTorch's names and layouts, from the graph's initializers.
  std::string weights;
  // Nodes taken as something else than one layer each, for the user to
  // read ("node \"x\" (Identity): passed through").
  std::vector<std::string> notes;
};

// `name` names the file in every message.
absl::StatusOr<ImportedModel> ImportOnnx(absl::string_view bytes, absl::string_view name);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_ONNX_IMPORT_H_
