#include "kernels/cuda/context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/status.h"

namespace downpour {
namespace kernels {
namespace cuda {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky-free error so later calls start clean.
    return 0;
  }
  return count;
}

std::string CudaUnavailableReason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("no CUDA device: ", cudaGetErrorString(e));
  }
  if (count == 0) return "no CUDA device: the runtime reports 0 devices";
  return "";
}

std::string CudaDeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(int device,
                                                                 size_t workspace_bytes) {
  const int count = CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError(CudaUnavailableReason());
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist; there are ", count));
  }
  auto ctx = std::make_unique<CudaContext>();
  ctx->device = device;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&ctx->cublas));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(ctx->cublas, ctx->stream));
  // Full fp32 unless a GEMM asks for TF32 itself (its compute type, dense.cc),
  // so the policy can change after the handle is made.
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(ctx->cublas, CUBLAS_DEFAULT_MATH));
  CUDNN_RETURN_IF_ERROR(cudnnCreate(&ctx->cudnn));
  CUDNN_RETURN_IF_ERROR(cudnnSetStream(ctx->cudnn, ctx->stream));
  if (workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ctx->workspace, workspace_bytes));
    ctx->workspace_bytes = workspace_bytes;
  }
  return ctx;
}

CudaContext::~CudaContext() {
  if (device < 0) return;
  cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  // Convolution plans of cuDNN's graph API are bound to the handle: gone
  // before it.
  conv_plans.reset();
  ReturnWorkspace();
  if (workspace != nullptr) cudaFree(workspace);
  if (cudnn != nullptr) cudnnDestroy(cudnn);
  if (cublas != nullptr) cublasDestroy(cublas);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void CudaContext::LendWorkspace(void* memory, size_t bytes) const {
  if (!workspace_lent) {
    own_workspace = workspace;
    own_workspace_bytes = workspace_bytes;
    workspace_lent = true;
  }
  workspace = memory;
  workspace_bytes = bytes;
}

void CudaContext::ReturnWorkspace() const {
  if (!workspace_lent) return;
  workspace = own_workspace;
  workspace_bytes = own_workspace_bytes;
  own_workspace = nullptr;
  own_workspace_bytes = 0;
  workspace_lent = false;
}

absl::Status CudaContext::ReleaseWorkspace() {
  ReturnWorkspace();
  if (workspace == nullptr) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  CUDA_RETURN_IF_ERROR(cudaFree(workspace));
  workspace = nullptr;
  workspace_bytes = 0;
  return absl::OkStatus();
}

size_t CudaContext::owned_workspace_bytes() const {
  return workspace_lent ? own_workspace_bytes : workspace_bytes;
}

absl::Status CudaContext::Synchronize() const {
  return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status CudaContext::MakeCurrent() const {
  return FromCuda(cudaSetDevice(device), "cudaSetDevice");
}

absl::Status EnsureWorkspace(const CudaContext& ctx, size_t bytes) {
  ctx.workspace_peak = std::max(ctx.workspace_peak, bytes);
  if (bytes <= ctx.workspace_bytes) return absl::OkStatus();
  if (ctx.workspace_is_lent()) {
    ctx.ReturnWorkspace();
    if (bytes <= ctx.workspace_bytes) return absl::OkStatus();
  }
  const size_t grown = Aligned(std::max(bytes, ctx.workspace_bytes + ctx.workspace_bytes / 2));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  if (ctx.workspace != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(ctx.workspace));
  ctx.workspace = nullptr;
  ctx.workspace_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ctx.workspace, grown));
  ctx.workspace_bytes = grown;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
