// ONNX tensors (onnx.TensorProto: initializers, Constant values) read into
// plain vectors: float for the floating-point types (FLOAT, DOUBLE, FLOAT16,
// BFLOAT16), int64 for the integer ones and BOOL; raw_data or the typed
// fields, every size checked against the dims before it is used. External
// and segmented data are refused. Thread-safe: pure functions.
#ifndef DOWNPOUR_SPEC_ONNX_TENSOR_H_
#define DOWNPOUR_SPEC_ONNX_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx.pb.h"

namespace downpour {

// An integer initializer or Constant holds at most this many elements
// (they are shapes, axes and indices); shape arithmetic folds at most
// kMaxOnnxFoldedElements integers a node.
inline constexpr int64_t kMaxOnnxIntegerElements = int64_t{1} << 20;
inline constexpr size_t kMaxOnnxFoldedElements = 64;

// A tensor known when importing: an initializer, a Constant, or folded from
// them. Floating-point data is held as float, integer (and bool) as int64.
struct OnnxConst {
  std::string name;
  std::vector<int64_t> dims;
  bool integer = false;
  std::vector<float> f;
  std::vector<int64_t> i;
};

// The values of `t`; InvalidArgument saying what is wrong (the caller names
// the tensor).
absl::StatusOr<OnnxConst> ReadOnnxTensor(const onnx::TensorProto& t);

// The value of a Constant node (value, value_int(s) or value_float(s)).
absl::StatusOr<OnnxConst> ReadOnnxConstant(const onnx::NodeProto& node);

// Shape arithmetic over integer scalars and vectors, as exporters spell a
// flatten: Gather, Unsqueeze, Squeeze, Concat and Cast of `in`;
// InvalidArgument for anything else (the caller names the node).
absl::StatusOr<OnnxConst> FoldOnnxShapeOp(const std::string& op,
                                          const std::vector<const OnnxConst*>& in);

// Whether a TensorProto element type is floating point.
bool IsOnnxFloatType(int type);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_ONNX_TENSOR_H_
