// The ONNX form of a trained model: ExportOnnx turns a job's ModelSpec and its
// weights in PyTorch's layout (control/export.h; what `downpourctl export`
// fetches) into an ONNX inference graph that ONNX Runtime, onnx.checker and
// the other ONNX tools take. `downpourctl export --format=onnx` calls it on
// the client, from the exported file alone (its metadata holds the spec).
//
// The graph (opset kOnnxOpset of the default domain, IR version
// kOnnxIrVersion):
//   inputs   "input" [batch, ...] for a model without named inputs, else one
//            per DENSE input (ModelSpec.inputs), by its name. An image
//            input ([H, W, C] in the spec) is NCHW, [batch, C, H, W], as a
//            PyTorch module of the same architecture takes it; any other
//            input has the spec's shape after the batch. The batch is the
//            symbolic dimension "batch".
//   outputs  "logits" [batch, num_classes]: the input of the job's
//            softmax_cross_entropy layer. The loss itself has no node: an
//            inference graph has no labels. "probabilities" [batch,
//            num_classes] is Softmax(logits).
//   weights  initializers named as in the PyTorch layout ("fc1.weight",
//            "bn1.running_var"), F32, raw little-endian bytes.
// Layers become Gemm (transB=1 over the [out, in] weight), Conv (group 1,
// pads from the layer's window), Relu, MaxPool, AveragePool
// (count_include_pad=0: padding is not counted), GlobalAveragePool +
// Flatten, BatchNormalization (the running statistics: inference), Add,
// Concat, Flatten, Cast + Gather (a dense embedding; ids must be integers in
// [0, vocab_size): ONNX Runtime refuses one outside the table) and
// Unsqueeze/Concat/MatMul/Gather (dot_interaction); dropout is the identity
// at inference and has no node. Images flow as NCHW between image layers
// (Transpose only where a layer needs the other order), so a flatten feeds
// the dense weights that control/export.h already put in NCHW order.
//
// Refused, InvalidArgument with one sentence naming the layer or tensor:
// sparse embeddings (their tables live on the shards and have no ONNX
// form here), a dense embedding whose ids another layer computes (the job
// reads an id outside the table as zeros, Gather refuses it), weights in
// the native layout, missing or of another shape than the spec's, a model
// input named like an output or a weight, and a model whose file would
// pass protobuf's 2 GiB (ONNX's external data is not written).
//
// Thread-safety: a pure function; thread-safe.
#ifndef DOWNPOUR_SPEC_ONNX_EXPORT_H_
#define DOWNPOUR_SPEC_ONNX_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "proto/job.pb.h"

namespace downpour {

// The operator set the graph's nodes are taken from (ONNX 1.12 and later,
// ONNX Runtime 1.12 and later) and the IR version of the file.
inline constexpr int64_t kOnnxOpset = 17;
inline constexpr int64_t kOnnxIrVersion = 8;

// The serialized onnx.ModelProto of `model` with `weights` (every parameter
// and batch-norm statistic of the model by its PyTorch name and shape; the
// file's "downpour.*" metadata is copied into the model's metadata_props).
absl::StatusOr<std::string> ExportOnnx(const ModelSpec& model, const SafetensorsFile& weights);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_ONNX_EXPORT_H_
