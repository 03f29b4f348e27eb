// The CPU compute backend: ComputeBackend over the reference kernels of
// kernels/cpu/layers.h, in host memory. Everything runs when called (there is
// nothing to queue or wait for); every precision runs in fp32. Created
// through kernels/factory.h. Thread-compatible, as every backend.
#ifndef DOWNPOUR_KERNELS_CPU_BACKEND_H_
#define DOWNPOUR_KERNELS_CPU_BACKEND_H_

#include <cstdint>
#include <memory>

#include "kernels/backend.h"

namespace downpour {
namespace kernels {
namespace cpu {

// Of `options`, only the memory cap is used (memory_limit, shared_caps).
std::unique_ptr<ComputeBackend> CreateCpuBackend(const BackendOptions& options = BackendOptions());

}  // namespace cpu
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CPU_BACKEND_H_
