#include "model/devices.h"

#include "kernels/factory.h"

namespace downpour {

int GpuCount() { return kernels::GpuCount(); }

std::string GpuUnavailableReason() { return kernels::GpuUnavailableReason(); }

absl::StatusOr<std::string> DescribeDevice(int device) { return kernels::DescribeDevice(device); }

void SetCpuThreads(int num_threads) { kernels::SetCpuThreads(num_threads); }

}  // namespace downpour
