// What a job's Precision (proto/job.proto) asks of a GPU backend: the type
// activations are stored and multiplied in, and where fp32 products may use
// TF32 tensor cores. The CPU backend ignores both (it computes in full fp32).
// Pure functions; thread-safe.
#ifndef DOWNPOUR_MODEL_PRECISION_H_
#define DOWNPOUR_MODEL_PRECISION_H_

#include "kernels/types.h"
#include "proto/job.pb.h"

namespace downpour {

struct GpuPrecision {
  kernels::ComputePrecision compute = kernels::ComputePrecision::kFp32;
  kernels::Tf32Policy tf32 = kernels::Tf32Policy::kConvolutions;
};

// FP32: fp32, TF32 convolutions (PyTorch's defaults). TF32: fp32, TF32
// convolutions and GEMMs. FP32_STRICT: fp32, no TF32. BF16/FP16: that
// activation type; the fp32 convolutions a reduced plan may run on
// converted copies use TF32 as FP32's do.
// REQUIRES: Precision_IsValid(precision).
GpuPrecision GpuPrecisionOf(Precision precision);

// BF16 and FP16: activations in a 16-bit type (reduced weight copies, loss
// scaling for FP16), which some graphs cannot take (model.cc).
bool IsReducedPrecision(Precision precision);

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_PRECISION_H_
