#include "spec/onnx_tensor.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

onnx::TensorProto Raw(int type, std::vector<int64_t> dims, const std::string& bytes) {
  onnx::TensorProto t;
  t.set_data_type(type);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(bytes);
  return t;
}

std::string Halves(std::vector<uint16_t> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

TEST(OnnxTensorTest, HalfAndBfloatBitsReadAsTheirFloats) {
  // 1.0, a subnormal (2^-24), infinity, -2.0.
  absl::StatusOr<OnnxConst> half = ReadOnnxTensor(
      Raw(onnx::TensorProto::FLOAT16, {4}, Halves({0x3c00, 0x0001, 0x7c00, 0xc000})));
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_FLOAT_EQ(half->f[0], 1.f);
  EXPECT_FLOAT_EQ(half->f[1], 5.9604645e-8f);
  EXPECT_EQ(half->f[2], std::numeric_limits<float>::infinity());
  EXPECT_FLOAT_EQ(half->f[3], -2.f);
  absl::StatusOr<OnnxConst> bf16 =
      ReadOnnxTensor(Raw(onnx::TensorProto::BFLOAT16, {2}, Halves({0x3f80, 0xc040})));
  ASSERT_TRUE(bf16.ok());
  EXPECT_THAT(bf16->f, ElementsAre(1.f, -3.f));
}

TEST(OnnxTensorTest, TypedFieldsAndSmallIntegersRead) {
  onnx::TensorProto d;
  d.set_data_type(onnx::TensorProto::DOUBLE);
  d.add_dims(2);
  d.add_double_data(0.5);
  d.add_double_data(-1.5);
  EXPECT_THAT(ReadOnnxTensor(d)->f, ElementsAre(0.5f, -1.5f));
  absl::StatusOr<OnnxConst> bytes =
      ReadOnnxTensor(Raw(onnx::TensorProto::INT8, {3}, std::string("\x01\xff\x7f", 3)));
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(bytes->integer);
  EXPECT_THAT(bytes->i, ElementsAre(1, -1, 127));
  EXPECT_THAT(ReadOnnxTensor(Raw(onnx::TensorProto::BOOL, {2}, std::string("\x01\x00", 2)))->i,
              ElementsAre(1, 0));
}

TEST(OnnxTensorTest, SizesAreCheckedBeforeAnythingIsAllocated) {
  // 2^31-1 int64s claimed with no data: refused, not 16 GiB zero-filled.
  onnx::TensorProto huge;
  huge.set_data_type(onnx::TensorProto::INT64);
  huge.add_dims(2147483647);
  EXPECT_THAT(ReadOnnxTensor(huge).status().message(), HasSubstr("integer constants"));
  onnx::TensorProto floats;
  floats.set_data_type(onnx::TensorProto::FLOAT);
  floats.add_dims(2147483647);
  EXPECT_THAT(ReadOnnxTensor(floats).status().message(),
              HasSubstr("has 0 values; shape [2147483647] needs 2147483647"));
  EXPECT_THAT(ReadOnnxTensor(Raw(onnx::TensorProto::FLOAT, {2, 3}, "abc")).status().message(),
              HasSubstr("raw_data has 3 bytes; shape [2, 3] needs 24"));
  onnx::TensorProto big;
  big.set_data_type(onnx::TensorProto::FLOAT);
  big.add_dims(1 << 20);
  big.add_dims(1 << 20);
  EXPECT_THAT(ReadOnnxTensor(big).status().message(), HasSubstr("more than 2^31-1 elements"));
  EXPECT_THAT(ReadOnnxTensor(Raw(onnx::TensorProto::STRING, {1}, "x")).status().message(),
              HasSubstr("element type STRING is not read"));
}

TEST(OnnxTensorTest, ShapeArithmeticFoldsAndIsBounded) {
  OnnxConst shape{"s", {3}, true, {}, {0, 64, 7}};
  OnnxConst index{"k", {}, true, {}, {-1}};
  absl::StatusOr<OnnxConst> last = FoldOnnxShapeOp("Gather", {&shape, &index});
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(last->i, ElementsAre(7));
  OnnxConst far{"k", {}, true, {}, {3}};
  EXPECT_THAT(FoldOnnxShapeOp("Gather", {&shape, &far}).status().message(),
              HasSubstr("index 3 is outside [-3, 3)"));
  EXPECT_THAT(FoldOnnxShapeOp("Concat", {&shape, &index})->i, ElementsAre(0, 64, 7, -1));
  // A Concat of Concats doubles a vector each time: refused past 64 integers.
  OnnxConst wide{"w", {40}, true, {}, std::vector<int64_t>(40, 1)};
  EXPECT_THAT(FoldOnnxShapeOp("Concat", {&wide, &wide}).status().message(),
              HasSubstr("folds 80 integers; shape arithmetic takes at most 64"));
  OnnxConst floats{"f", {1}, false, {1.f}, {}};
  EXPECT_THAT(FoldOnnxShapeOp("Concat", {&floats}).status().message(),
              HasSubstr("integer scalars and vectors only"));
  EXPECT_THAT(FoldOnnxShapeOp("Mul", {&shape}).status().message(),
              HasSubstr("op Mul over constants is not folded"));
}

}  // namespace
}  // namespace downpour
