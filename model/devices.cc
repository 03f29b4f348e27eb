#include "model/devices.h"

#include "absl/strings/str_cat.h"
#include "kernels/factory.h"

namespace downpour {

int GpuCount() { return kernels::GpuCount(); }

std::string GpuUnavailableReason() { return kernels::GpuUnavailableReason(); }

absl::StatusOr<std::string> DescribeDevice(int device) {
  if (device < 0) return std::string("cpu");
  const int count = kernels::GpuCount();
  if (count == 0) return absl::FailedPreconditionError(kernels::GpuUnavailableReason());
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist; this process sees ", count));
  }
  return absl::StrCat("cuda:", device, " ", kernels::GpuName(device));
}

void SetCpuThreads(int num_threads) { kernels::SetCpuThreads(num_threads); }

}  // namespace downpour
