// The protocol's DType (proto/tensor.proto) as the wire codec's WireDtype
// (common/wire_dtype.h), and back: how a push header names the element type
// its gradient bytes travel as. Pure functions; thread-safe.
#ifndef DOWNPOUR_SPEC_PROTO_DTYPE_H_
#define DOWNPOUR_SPEC_PROTO_DTYPE_H_

#include "absl/status/statusor.h"
#include "common/wire_dtype.h"
#include "proto/tensor.pb.h"

namespace downpour {

// DTYPE_UNSPECIFIED is FLOAT32; Unimplemented for a value this build does not
// know (a newer peer's).
absl::StatusOr<WireDtype> WireDtypeOf(DType dtype);

DType DTypeOf(WireDtype dtype);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_PROTO_DTYPE_H_
