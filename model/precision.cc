#include "model/precision.h"

namespace downpour {

GpuPrecision GpuPrecisionOf(Precision precision) {
  using kernels::ComputePrecision;
  using kernels::Tf32Policy;
  switch (precision) {
    case BF16:
      return {ComputePrecision::kBf16, Tf32Policy::kConvolutions};
    case FP16:
      return {ComputePrecision::kFp16, Tf32Policy::kConvolutions};
    case TF32:
      return {ComputePrecision::kFp32, Tf32Policy::kConvolutionsAndGemms};
    case FP32_STRICT:
      return {ComputePrecision::kFp32, Tf32Policy::kOff};
    case FP32:
    default:  // The proto's sentinel values, never valid.
      return {ComputePrecision::kFp32, Tf32Policy::kConvolutions};
  }
}

bool IsReducedPrecision(Precision precision) { return precision == BF16 || precision == FP16; }

}  // namespace downpour
