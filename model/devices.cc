#include "model/devices.h"

#include "kernels/factory.h"

namespace downpour {

bool BuiltWithCuda() { return kernels::BuiltWithCuda(); }

int GpuCount() { return kernels::GpuCount(); }

std::string GpuUnavailableReason() { return kernels::GpuUnavailableReason(); }

absl::StatusOr<std::string> DescribeDevice(int device) { return kernels::DescribeDevice(device); }

absl::StatusOr<std::pair<int64_t, int64_t>> GpuMemoryUsedAndTotal(int device) {
  absl::StatusOr<kernels::GpuMemory> memory = kernels::GpuMemoryInfo(device);
  if (!memory.ok()) return memory.status();
  return std::make_pair(memory->used_bytes, memory->total_bytes);
}

void SetCpuThreads(int num_threads) { kernels::SetCpuThreads(num_threads); }

}  // namespace downpour
