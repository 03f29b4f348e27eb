#include "kernels/factory.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/layers.h"

// The CUDA branch exists only in a build with the toolkit (kernels/BUILD.bazel
// defines DOWNPOUR_WITH_CUDA then); without it this file names no CUDA API.
#ifdef DOWNPOUR_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/stream_link.h"
#endif

namespace downpour {
namespace kernels {

#ifdef DOWNPOUR_WITH_CUDA

bool BuiltWithCuda() { return true; }

int GpuCount() { return cuda::CudaDeviceCount(); }

std::string GpuUnavailableReason() { return cuda::CudaUnavailableReason(); }

absl::StatusOr<std::string> DescribeDevice(int device) {
  if (device < 0) return std::string("cpu");
  const int count = cuda::CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError(cuda::CudaUnavailableReason());
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist; this process sees ", count));
  }
  return absl::StrCat("cuda:", device, " ", cuda::CudaDeviceName(device));
}

absl::StatusOr<GpuMemory> GpuMemoryInfo(int device) {
  RETURN_IF_ERROR(DescribeDevice(device).status());
  size_t free = 0, total = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free, &total);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, ": ", cudaGetErrorString(e)));
  }
  return GpuMemory{static_cast<int64_t>(total - free), static_cast<int64_t>(total)};
}

namespace {
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateGpuBackend(const BackendOptions& options) {
  return cuda::CreateCudaBackend(options);
}
absl::StatusOr<std::unique_ptr<DeviceGroup>> CreateGpuGroup(
    const std::vector<ComputeBackend*>& backends) {
  return cuda::CreateNcclGroup(backends);
}
absl::StatusOr<std::unique_ptr<StreamLink>> CreateGpuStreamLink(
    const std::vector<ComputeBackend*>& backends, int signals_per_rank) {
  return cuda::CreateCudaStreamLink(backends, signals_per_rank);
}
}  // namespace

#else  // !DOWNPOUR_WITH_CUDA

namespace {
constexpr char kBuiltWithoutCuda[] =
    "built without CUDA (no CUDA toolkit at build time, or --config=cpu)";
}  // namespace

bool BuiltWithCuda() { return false; }

int GpuCount() { return 0; }

std::string GpuUnavailableReason() { return absl::StrCat("no CUDA device: ", kBuiltWithoutCuda); }

absl::StatusOr<std::string> DescribeDevice(int device) {
  if (device < 0) return std::string("cpu");
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA device ", device, ": ", kBuiltWithoutCuda));
}

absl::StatusOr<GpuMemory> GpuMemoryInfo(int device) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA device ", device, ": ", kBuiltWithoutCuda));
}

namespace {
// Not reached: DescribeDevice refuses every GPU, and no backend is a GPU one.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateGpuBackend(const BackendOptions&) {
  return absl::FailedPreconditionError(kBuiltWithoutCuda);
}
absl::StatusOr<std::unique_ptr<DeviceGroup>> CreateGpuGroup(const std::vector<ComputeBackend*>&) {
  return absl::FailedPreconditionError(kBuiltWithoutCuda);
}
absl::StatusOr<std::unique_ptr<StreamLink>> CreateGpuStreamLink(const std::vector<ComputeBackend*>&,
                                                                int) {
  return absl::FailedPreconditionError(kBuiltWithoutCuda);
}
}  // namespace

#endif  // DOWNPOUR_WITH_CUDA

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const BackendOptions& options) {
  if (options.device < 0) return cpu::CreateCpuBackend(options);
  RETURN_IF_ERROR(DescribeDevice(options.device).status());
  return CreateGpuBackend(options);
}

absl::StatusOr<std::unique_ptr<DeviceGroup>> CreateDeviceGroup(
    const std::vector<ComputeBackend*>& backends) {
  std::set<int> devices;
  for (const ComputeBackend* backend : backends) {
    if (backend == nullptr || !backend->gpu()) {
      return absl::InvalidArgumentError("a device group spans GPU backends only");
    }
    if (!devices.insert(backend->device()).second) {
      return absl::InvalidArgumentError(absl::StrCat("a device group needs distinct GPUs; device ",
                                                     backend->device(), " is given twice"));
    }
  }
  if (backends.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a device group needs two or more GPUs, got ", backends.size()));
  }
  return CreateGpuGroup(backends);
}

namespace {

// The CPU's link: every rank's work runs when called, on its caller's
// thread, so a copy is a memcpy and the callers' handover orders signals.
class HostStreamLink final : public StreamLink {
 public:
  explicit HostStreamLink(int size) : size_(size) {}
  int size() const override { return size_; }
  absl::Status Copy(int, void* dst, int, const void* src, int, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Mark(int, int) override { return absl::OkStatus(); }
  absl::Status Wait(int, int, int) override { return absl::OkStatus(); }

 private:
  const int size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamLink>> CreateStreamLink(
    const std::vector<ComputeBackend*>& backends, int signals_per_rank) {
  if (backends.empty()) return absl::InvalidArgumentError("a stream link needs a backend");
  if (signals_per_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stream link needs signals_per_rank >= 0, got ", signals_per_rank));
  }
  int gpus = 0;
  for (const ComputeBackend* backend : backends) {
    if (backend == nullptr) return absl::InvalidArgumentError("a stream link's backend is null");
    gpus += backend->gpu() ? 1 : 0;
  }
  if (gpus == 0) return std::unique_ptr<StreamLink>(new HostStreamLink(backends.size()));
  if (gpus != static_cast<int>(backends.size())) {
    return absl::InvalidArgumentError(
        "a stream link joins CPU backends or GPU backends, not a mix of both");
  }
  return CreateGpuStreamLink(backends, signals_per_rank);
}

void SetCpuThreads(int num_threads) { cpu::SetCpuThreads(num_threads); }

}  // namespace kernels
}  // namespace downpour
