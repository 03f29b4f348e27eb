// What a worker asks about the compute devices its models can run on, so the
// daemon never names a device API (kernels/factory.h answers).
// Thread-safe.
#ifndef DOWNPOUR_MODEL_DEVICES_H_
#define DOWNPOUR_MODEL_DEVICES_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace downpour {

// Whether this program was built with CUDA (kernels/factory.h).
bool BuiltWithCuda();

// Number of usable CUDA devices (0 on a machine without a GPU, and in a
// build without CUDA).
int GpuCount();
// Why no GPU is usable ("no CUDA device: ..."), or "" when one is.
std::string GpuUnavailableReason();

// What runs a model: "cpu" (device -1), or "cuda:<d> <name>" ("cuda:0
// NVIDIA H100 80GB HBM3"); FailedPrecondition naming the reason when device d
// is unusable.
absl::StatusOr<std::string> DescribeDevice(int device);

// Bytes of CUDA device `device`'s memory in use (by every process) and in
// all; FailedPrecondition naming the reason when the device is unusable.
absl::StatusOr<std::pair<int64_t, int64_t>> GpuMemoryUsedAndTotal(int device);

// Threads the CPU's matrix products use, process-wide (<= 0: all cores).
void SetCpuThreads(int num_threads);

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_DEVICES_H_
