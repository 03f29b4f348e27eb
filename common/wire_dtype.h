// How floats travel on the wire: as float32, or rounded to bfloat16 or
// float16 (half the bytes; gradient compression). The codec rounds to nearest
// even, keeps NaN a NaN and takes float16 overflow to infinity, as CUDA's own
// conversions do. Pure functions; thread-safe.
//
// The mapping to and from the protocol's DType enum is spec/proto_dtype.h's.
#ifndef DOWNPOUR_COMMON_WIRE_DTYPE_H_
#define DOWNPOUR_COMMON_WIRE_DTYPE_H_

#include <cstdint>

namespace downpour {

enum class WireDtype { kFloat32, kBfloat16, kFloat16 };

// Bytes per element: 4 or 2.
int BytesPerElement(WireDtype dtype);

// Converts `n` floats to `dtype` at `out` (BytesPerElement(dtype) * n bytes),
// and back.
void EncodeFloats(WireDtype dtype, const float* in, int64_t n, char* out);
void DecodeFloats(WireDtype dtype, const char* in, int64_t n, float* out);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_WIRE_DTYPE_H_
