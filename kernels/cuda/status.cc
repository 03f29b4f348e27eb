#include "kernels/cuda/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace kernels {
namespace cuda {

absl::Status FromCuda(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status FromCublas(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(status)));
}

absl::Status FromCudnn(cudnnStatus_t status, absl::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudnnGetErrorString(status)));
}

absl::Status FromNccl(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, " failed: ", ncclGetErrorString(result));
  // NCCL's last message usually names the cause (a duplicate GPU, an
  // unreachable peer); it may also be an older error, hence "last".
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') absl::StrAppend(&message, " (last NCCL error: ", last, ")");
  return absl::InternalError(message);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
