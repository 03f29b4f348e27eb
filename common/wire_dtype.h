// How floats travel on the wire: as float32, rounded to bfloat16 or float16
// (half the bytes), or as block-scaled int8 (about a quarter: each block of
// kInt8Block elements is one float32 scale, max |x| / 127, then one int8
// per element, x / scale rounded to nearest). The 16-bit codecs round to
// nearest even, keep NaN a NaN and take float16 overflow to infinity, as
// CUDA's own conversions do; int8 turns a block holding a value that is not
// finite into a NaN scale, so every element of it decodes as NaN and the
// receiver's finite check sees it.
//
// Int8 loses what a block's rounding drops, so its users carry that over
// (error feedback): a worker adds what its last push dropped to the next
// (EncodeInt8Carrying), and a shard sends the change from the copy the
// workers hold, which it advances by exactly what they decode
// (EncodeInt8Change, AddInt8; compiled without contraction into FMA, so
// the two machines' additions give the same bits whichever clone runs).
// Pure functions; thread-safe.
//
// The mapping to and from the protocol's DType enum is spec/proto_dtype.h's.
#ifndef DOWNPOUR_COMMON_WIRE_DTYPE_H_
#define DOWNPOUR_COMMON_WIRE_DTYPE_H_

#include <cstdint>

namespace downpour {

enum class WireDtype { kFloat32, kBfloat16, kFloat16, kInt8 };

// Elements per int8 block (one scale each).
inline constexpr int64_t kInt8Block = 256;

// Bytes of `n` elements as `dtype`. Elements [start, ...) of an encoding
// begin at WireBytes(dtype, start) when start is a multiple of kInt8Block.
int64_t WireBytes(WireDtype dtype, int64_t n);

// Converts `n` floats to `dtype` at `out` (WireBytes(dtype, n) bytes), and
// back. `in` and `out` of an int8 encoding start on a block.
void EncodeFloats(WireDtype dtype, const float* in, int64_t n, char* out);
void DecodeFloats(WireDtype dtype, const char* in, int64_t n, float* out);

// Int8 of x + carry[i] at `out`; carry[i] becomes what that dropped
// (0 in a block that is not finite).
void EncodeInt8Carrying(const float* x, int64_t n, float* carry, char* out);
// Int8 of target - held at `out`, and held += what it decodes to
// (AddInt8's arithmetic).
void EncodeInt8Change(const float* target, int64_t n, float* held, char* out);
// held[i] += the decoded element i of the int8 encoding `in`.
void AddInt8(const char* in, int64_t n, float* held);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_WIRE_DTYPE_H_
