// The one conversion of the CUDA runtime's, cuBLAS's, cuDNN's and NCCL's
// error codes to absl::Status for everything in kernels/cuda: OK on success,
// else Internal naming the call that failed and the library's reason. The
// *_RETURN_IF_ERROR macros return that error from the calling function,
// naming the failed expression as written.
//
// Pure functions; thread-safe (FromNccl reads NCCL's last error, which is
// per process, so the detail may come from another thread's failure).
#ifndef DOWNPOUR_KERNELS_CUDA_STATUS_H_
#define DOWNPOUR_KERNELS_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace downpour {
namespace kernels {
namespace cuda {

// "<what>: <reason>".
absl::Status FromCuda(cudaError_t error, absl::string_view what);
absl::Status FromCublas(cublasStatus_t status, absl::string_view what);
absl::Status FromCudnn(cudnnStatus_t status, absl::string_view what);
// "<what> failed: <reason> (last NCCL error: <detail>)", the detail where
// NCCL has one.
absl::Status FromNccl(ncclResult_t result, absl::string_view what);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#define DOWNPOUR_CUDA_STATUS_RETURN_(convert, expr)                                  \
  do {                                                                               \
    ::absl::Status cuda_status_ = ::downpour::kernels::cuda::convert((expr), #expr); \
    if (!cuda_status_.ok()) return cuda_status_;                                     \
  } while (0)

#define CUDA_RETURN_IF_ERROR(expr) DOWNPOUR_CUDA_STATUS_RETURN_(FromCuda, expr)
#define CUBLAS_RETURN_IF_ERROR(expr) DOWNPOUR_CUDA_STATUS_RETURN_(FromCublas, expr)
#define CUDNN_RETURN_IF_ERROR(expr) DOWNPOUR_CUDA_STATUS_RETURN_(FromCudnn, expr)

#endif  // DOWNPOUR_KERNELS_CUDA_STATUS_H_
