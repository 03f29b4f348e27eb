#include "spec/proto_dtype.h"

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<WireDtype> WireDtypeOf(DType dtype) {
  switch (dtype) {
    case DTYPE_UNSPECIFIED:
    case FLOAT32:
      return WireDtype::kFloat32;
    case BFLOAT16:
      return WireDtype::kBfloat16;
    case FLOAT16:
      return WireDtype::kFloat16;
    case INT8:
      return WireDtype::kInt8;
    default:
      return absl::UnimplementedError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
}

DType DTypeOf(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kBfloat16:
      return BFLOAT16;
    case WireDtype::kFloat16:
      return FLOAT16;
    case WireDtype::kInt8:
      return INT8;
    case WireDtype::kFloat32:
      break;
  }
  return FLOAT32;
}

}  // namespace downpour
