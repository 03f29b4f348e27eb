// Where compute backends come from: the one place that names the CPU and
// CUDA implementations, so a model asks for a device and never for an
// implementation. Also what a daemon asks about the machine's devices.
//
// Thread-safe (the device queries and factories keep no state of their own).
#ifndef DOWNPOUR_KERNELS_FACTORY_H_
#define DOWNPOUR_KERNELS_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/stream_link.h"

namespace downpour {
namespace kernels {

// The CPU backend (options.device < 0) or the CUDA one on options.device:
// FailedPrecondition naming the reason when that device is unusable;
// ResourceExhausted when its memory runs out.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const BackendOptions& options);

// Collectives over `backends` (not owned; they must outlive the group): two
// or more GPU backends on distinct devices. InvalidArgument otherwise; the
// NCCL error when the communicators cannot be created.
absl::StatusOr<std::unique_ptr<DeviceGroup>> CreateDeviceGroup(
    const std::vector<ComputeBackend*>& backends);

// Copies and signals between `backends` (not owned; they must outlive the
// link), for pipeline stages: all CPU backends (copies are memcpy, signals
// no-ops), or all GPU backends (kernels/cuda/stream_link.h; two may share a
// device), each rank with `signals_per_rank` signals. InvalidArgument for
// none, a mix of CPU and GPU, or signals_per_rank < 0.
absl::StatusOr<std::unique_ptr<StreamLink>> CreateStreamLink(
    const std::vector<ComputeBackend*>& backends, int signals_per_rank);

// Whether this program was built with CUDA. Without the CUDA toolkit at build
// time (or with --config=cpu) only the CPU backend exists: GpuCount() is 0
// and every GPU device is refused with "built without CUDA".
bool BuiltWithCuda();

// Number of usable CUDA devices; 0 when there is no driver, no device, or the
// runtime reports any error (which it does on a machine without a GPU).
int GpuCount();
// Why no device is usable ("no CUDA device: <runtime message>"), or "" when
// one is. For logs and test skips.
std::string GpuUnavailableReason();
// What a backend on `device` runs on: "cpu" (device -1), or "cuda:<d>
// <name>" ("cuda:0 NVIDIA H100 80GB HBM3"); FailedPrecondition naming the
// reason when device d is unusable.
absl::StatusOr<std::string> DescribeDevice(int device);

// Memory of CUDA device `device`, as the driver counts it (every process's
// allocations and contexts): used = total - free. FailedPrecondition naming
// the reason when the device is unusable. Makes the calling thread's current
// device `device`, and the device's context if this process has none yet.
struct GpuMemory {
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
};
absl::StatusOr<GpuMemory> GpuMemoryInfo(int device);

// Threads the CPU backend's matrix products use, process-wide (OpenBLAS);
// `num_threads` <= 0 leaves the library's choice (all cores).
void SetCpuThreads(int num_threads);

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_FACTORY_H_
