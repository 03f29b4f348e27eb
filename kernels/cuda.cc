#include "kernels/cuda.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_kernels.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = cuda_internal;

absl::Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status FromCublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(s)));
}

absl::Status FromCudnn(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudnnGetErrorString(s)));
}

#define CUDA_RETURN_IF_ERROR(expr)                        \
  do {                                                    \
    const absl::Status _status = FromCuda((expr), #expr); \
    if (!_status.ok()) return _status;                    \
  } while (0)
#define CUBLAS_RETURN_IF_ERROR(expr)                        \
  do {                                                      \
    const absl::Status _status = FromCublas((expr), #expr); \
    if (!_status.ok()) return _status;                      \
  } while (0)
#define CUDNN_RETURN_IF_ERROR(expr)                        \
  do {                                                     \
    const absl::Status _status = FromCudnn((expr), #expr); \
    if (!_status.ok()) return _status;                     \
  } while (0)
#define STATUS_RETURN_IF_ERROR(expr)     \
  do {                                   \
    const absl::Status _status = (expr); \
    if (!_status.ok()) return _status;   \
  } while (0)

bool Acc(Write w) { return w == Write::kAccumulate; }

// Bytes rounded up so that sub-buffers of the workspace stay aligned.
size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Owners of cuDNN descriptors, destroyed with the scope.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { cudnnCreateTensorDescriptor(&d); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { cudnnCreateFilterDescriptor(&d); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { cudnnCreateConvolutionDescriptor(&d); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
};

int AsInt(int64_t v) { return static_cast<int>(v); }

// Descriptors and chosen algorithms of one convolution in one memory layout.
struct ConvVariant {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnConvolutionFwdAlgo_t fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  size_t fwd_bytes = 0, bwd_filter_bytes = 0, bwd_data_bytes = 0;
  // Measured by cudnnFind; kUnmeasured when only a heuristic choice fitted.
  float fwd_ms = 0, bwd_filter_ms = 0, bwd_data_ms = 0;
};

constexpr float kUnmeasured = 1e9f;

// Everything cuDNN needs for one convolution of `s`, in both layouts: NHWC
// straight on the tensors, or NCHW on copies transposed in the workspace.
// cuDNN 9's fp32 (FMA) kernels for NHWC are few and slow (VGG: 25-50x the
// NCHW ones), so the plan measures both and keeps the faster, transposes
// included.
struct ConvPlan {
  ConvVariant nhwc, nchw;
  TensorDesc bias;  // NHWC [1, out_c, 1, 1].
  // Asymmetric padding: the input is first copied into a padded buffer of
  // padded_h x padded_w and convolved without padding.
  bool padded = false;
  int64_t padded_h = 0, padded_w = 0;
  size_t padded_bytes = 0;  // Of one padded NHWC batch, aligned (0 unless padded).
  // Workspace of the NCHW path, aligned: the (padded) input, the output, the
  // filter.
  size_t in_bytes = 0, out_bytes = 0, filter_bytes = 0;
  bool chosen = false;
  bool fwd_nchw = false, bwd_nchw = false;
  // What cuDNN convolves: the (padded) input's size and its padding.
  int64_t conv_in_h = 0, conv_in_w = 0, conv_pad_h = 0, conv_pad_w = 0;
  // bf16/fp16 contexts: the NHWC tensor-op variant on the reduced tensors;
  // reduced_ok false where cuDNN has no algorithm for it (fp32 then runs on
  // converted copies). Bytes of one reduced (padded) input and filter,
  // aligned.
  ConvVariant reduced;
  bool reduced_chosen = false, reduced_ok = false;
  // Per direction: the reduced variant, or the fp32 plan on converted
  // copies where cudnnFind measured that faster, conversions included (a
  // layer with one or three input channels has no fast tensor-op kernel).
  bool fwd_reduced = false, bwd_reduced = false;
  size_t in16_bytes = 0, filter16_bytes = 0;
};

absl::Status MakeVariant(const WindowShape& s, cudnnTensorFormat_t format, int64_t in_h,
                         int64_t in_w, int64_t pad_h, int64_t pad_w, ConvVariant* v) {
  CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(v->x.d, format, CUDNN_DATA_FLOAT, AsInt(s.batch),
                                                   AsInt(s.in_c), AsInt(in_h), AsInt(in_w)));
  CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(v->y.d, format, CUDNN_DATA_FLOAT, AsInt(s.batch),
                                                   AsInt(s.out_c), AsInt(s.out_h), AsInt(s.out_w)));
  CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(v->w.d, CUDNN_DATA_FLOAT, format, AsInt(s.out_c),
                                                   AsInt(s.in_c), AsInt(s.kernel_h),
                                                   AsInt(s.kernel_w)));
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(v->conv.d, AsInt(pad_h), AsInt(pad_w),
                                                        AsInt(s.stride_h), AsInt(s.stride_w), 1, 1,
                                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // FMA only: no TF32, so results stay within fp32 rounding of the CPU twin.
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v->conv.d, CUDNN_FMA_MATH));
  return absl::OkStatus();
}

cudnnDataType_t ReducedCudnnType(ComputePrecision c) {
  return c == ComputePrecision::kFp16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

absl::Status MakeReducedVariant(const WindowShape& s, cudnnDataType_t type, const ConvPlan& p,
                                ConvVariant* v) {
  CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(v->x.d, CUDNN_TENSOR_NHWC, type, AsInt(s.batch),
                                                   AsInt(s.in_c), AsInt(p.conv_in_h),
                                                   AsInt(p.conv_in_w)));
  CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(v->y.d, CUDNN_TENSOR_NHWC, type, AsInt(s.batch),
                                                   AsInt(s.out_c), AsInt(s.out_h), AsInt(s.out_w)));
  CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(v->w.d, type, CUDNN_TENSOR_NHWC, AsInt(s.out_c),
                                                   AsInt(s.in_c), AsInt(s.kernel_h),
                                                   AsInt(s.kernel_w)));
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
      v->conv.d, AsInt(p.conv_pad_h), AsInt(p.conv_pad_w), AsInt(s.stride_h), AsInt(s.stride_w), 1,
      1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v->conv.d, CUDNN_TENSOR_OP_MATH));
  return absl::OkStatus();
}

absl::Status MakePlan(const WindowShape& s, ConvPlan* p) {
  // cuDNN pads symmetrically: use it directly when that gives our windows.
  const int64_t cudnn_out_h = (s.in_h + 2 * s.pad_top - s.kernel_h) / s.stride_h + 1;
  const int64_t cudnn_out_w = (s.in_w + 2 * s.pad_left - s.kernel_w) / s.stride_w + 1;
  int64_t in_h = s.in_h, in_w = s.in_w, pad_h = s.pad_top, pad_w = s.pad_left;
  if (cudnn_out_h != s.out_h || cudnn_out_w != s.out_w) {
    p->padded = true;
    p->padded_h = in_h = (s.out_h - 1) * s.stride_h + s.kernel_h;
    p->padded_w = in_w = (s.out_w - 1) * s.stride_w + s.kernel_w;
    pad_h = pad_w = 0;
    p->padded_bytes = Aligned(sizeof(float) * s.batch * in_h * in_w * s.in_c);
  }
  p->conv_in_h = in_h;
  p->conv_in_w = in_w;
  p->conv_pad_h = pad_h;
  p->conv_pad_w = pad_w;
  p->in_bytes = Aligned(sizeof(float) * s.batch * in_h * in_w * s.in_c);
  p->out_bytes = Aligned(sizeof(float) * s.batch * s.out_elements());
  p->filter_bytes = Aligned(sizeof(float) * s.out_c * s.patch_elements());
  STATUS_RETURN_IF_ERROR(MakeVariant(s, CUDNN_TENSOR_NHWC, in_h, in_w, pad_h, pad_w, &p->nhwc));
  STATUS_RETURN_IF_ERROR(MakeVariant(s, CUDNN_TENSOR_NCHW, in_h, in_w, pad_h, pad_w, &p->nchw));
  CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(p->bias.d, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                                   1, AsInt(s.out_c), 1, 1));
  return absl::OkStatus();
}

// Conv plan logging (SetConvPlanLogging).
std::atomic<bool> log_conv_plans{false};

template <typename Perf, typename Algo>
void LogPlan(const char* direction, const char* layout, const WindowShape& s, const Perf* perf,
             int returned, Algo chosen) {
  if (!log_conv_plans.load()) return;
  std::fprintf(stderr,
               "conv %s %s n=%lld in=%lldx%lldx%lld out=%lldx%lldx%lld k=%lldx%lld stride=%lld: "
               "chose %d;",
               direction, layout, static_cast<long long>(s.batch), static_cast<long long>(s.in_h),
               static_cast<long long>(s.in_w), static_cast<long long>(s.in_c),
               static_cast<long long>(s.out_h), static_cast<long long>(s.out_w),
               static_cast<long long>(s.out_c), static_cast<long long>(s.kernel_h),
               static_cast<long long>(s.kernel_w), static_cast<long long>(s.stride_h),
               static_cast<int>(chosen));
  for (int i = 0; i < returned; ++i) {
    std::fprintf(stderr, " [algo %d %.3f ms %zu B math %d status %d]",
                 static_cast<int>(perf[i].algo), perf[i].time, perf[i].memory,
                 static_cast<int>(perf[i].mathType), static_cast<int>(perf[i].status));
  }
  std::fprintf(stderr, "\n");
}

// PickAlgo: the fastest measured algorithm that succeeded, was measured with
// the math type the convolution descriptor has (`math`: FMA for fp32, so no
// TF32; tensor ops for bf16/fp16 — cudnnFind also reports algorithms in
// other math types, which the descriptor would not run as measured) and
// fits in `free_bytes` (PickHeuristic: the first heuristic choice that fits
// otherwise).
// Algorithms measured within this fraction of the fastest count as ties
// (cudnnFind's times move more than that between calls); among ties the one
// with the least workspace wins, since every byte of it is device memory.
constexpr float kAlgoTimeTolerance = 1.05f;

template <typename Perf, typename Algo>
bool PickAlgo(const Perf* perf, int returned, size_t free_bytes, Algo* algo, size_t* bytes,
              int* index, cudnnMathType_t math) {
  auto eligible = [&](const Perf& p) {
    return p.status == CUDNN_STATUS_SUCCESS && p.memory <= free_bytes && p.mathType == math;
  };
  int best = -1;
  for (int i = 0; i < returned; ++i) {
    if (eligible(perf[i]) && (best < 0 || perf[i].time < perf[best].time)) best = i;
  }
  if (best < 0) return false;
  const float limit = kAlgoTimeTolerance * perf[best].time;
  for (int i = 0; i < returned; ++i) {
    if (eligible(perf[i]) && perf[i].time <= limit && perf[i].memory < perf[best].memory) {
      best = i;
    }
  }
  *algo = perf[best].algo;
  *bytes = perf[best].memory;
  *index = best;
  return true;
}

template <typename Perf, typename Algo>
void PickHeuristic(const Perf* perf, int returned, size_t free_bytes, Algo* algo) {
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= free_bytes) {
      *algo = perf[i].algo;
      return;
    }
  }
}

// cuDNN's fastest algorithms can want several hundred MiB (VGG's backward
// data: 617 MiB at batch 64); the slow ones that fit a small workspace are up
// to 50x slower. The workspace grows to what the chosen algorithms need, up
// to this.
constexpr size_t kMaxWorkspaceBytes = size_t{2} << 30;

// Grows ctx's workspace to at least `bytes` (waiting for queued work, which
// may still use the old one); a lent one too small is given back first.
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

// The workspace as scratch for column-reduction partials (and `extra_floats`
// more after them).
absl::StatusOr<float*> ColumnScratch(const CudaContext& ctx, int64_t rows, int64_t channels,
                                     size_t extra_floats) {
  const size_t need =
      Aligned(sizeof(float) *
              (k::ColumnPartialsElements(std::max<int64_t>(rows, 1), channels) + extra_floats));
  STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, need));
  return static_cast<float*>(ctx.workspace);
}

}  // namespace

struct ConvPlanCache {
  std::map<std::array<int64_t, 14>, std::unique_ptr<ConvPlan>> plans;
};

namespace {

// The cached plan of `s` (descriptors made on first use).
absl::StatusOr<ConvPlan*> PlanFor(const CudaContext& ctx, const WindowShape& s) {
  if (ctx.conv_plans == nullptr) ctx.conv_plans = std::make_unique<ConvPlanCache>();
  const std::array<int64_t, 14> key = {s.batch,    s.in_h,
                                       s.in_w,     s.in_c,
                                       s.out_h,    s.out_w,
                                       s.out_c,    s.kernel_h,
                                       s.kernel_w, s.stride_h,
                                       s.stride_w, s.pad_top,
                                       s.pad_left, static_cast<int64_t>(ctx.compute)};
  auto it = ctx.conv_plans->plans.find(key);
  if (it != ctx.conv_plans->plans.end()) return it->second.get();
  auto plan = std::make_unique<ConvPlan>();
  STATUS_RETURN_IF_ERROR(MakePlan(s, plan.get()));
  ConvPlan* raw = plan.get();
  ctx.conv_plans->plans.emplace(key, std::move(plan));
  return raw;
}

}  // namespace

// ------------------------------------------------------------ devices

void SetConvPlanLogging(bool on) { log_conv_plans.store(on); }

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
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(ctx->cublas, CUBLAS_DEFAULT_MATH));
  CUDNN_RETURN_IF_ERROR(cudnnCreate(&ctx->cudnn));
  CUDNN_RETURN_IF_ERROR(cudnnSetStream(ctx->cudnn, ctx->stream));
  if (workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ctx->workspace, workspace_bytes));
    ctx->workspace_bytes = workspace_bytes;
  }
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ctx->scratch, 64));
  return ctx;
}

// One device block of reduced copies, each at a 256-byte boundary (as the
// workspace's), and the table the cast kernel reads.
struct ReducedWeightCopies {
  void* copies = nullptr;
  int64_t* table = nullptr;  // src_begin[n], dst_begin[n], count[n].
  int num_ranges = 0;
  int64_t max_count = 0;
  size_t bytes = 0;
  const float* src_base = nullptr;
  std::unordered_map<const float*, const void*> copy_of;
  ReducedWeightCopies() = default;
  ReducedWeightCopies(const ReducedWeightCopies&) = delete;
  ReducedWeightCopies& operator=(const ReducedWeightCopies&) = delete;
  ~ReducedWeightCopies() {
    if (copies != nullptr) cudaFree(copies);
    if (table != nullptr) cudaFree(table);
  }
};

CudaContext::~CudaContext() {
  if (device < 0) return;
  cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  ReturnWorkspace();
  if (scratch != nullptr) cudaFree(scratch);
  if (workspace != nullptr) cudaFree(workspace);
  if (cudnn != nullptr) cudnnDestroy(cudnn);
  if (cublas != nullptr) cublasDestroy(cublas);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void CudaContext::ForgetConvPlans() { conv_plans.reset(); }

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

absl::Status RegisterReducedWeights(CudaContext& ctx,
                                    const std::vector<std::pair<const float*, int64_t>>& ranges) {
  if (ctx.compute == ComputePrecision::kFp32) return absl::OkStatus();
  if (ctx.stream != nullptr) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  ctx.reduced_weights.reset();
  std::vector<std::pair<const float*, int64_t>> kept;
  for (const auto& r : ranges) {
    if (r.first != nullptr && r.second > 0) kept.push_back(r);
  }
  if (kept.empty()) return absl::OkStatus();
  auto w = std::make_unique<ReducedWeightCopies>();
  // Offsets from the lowest range start: one kernel argument for every range.
  const float* base = kept[0].first;
  for (const auto& r : kept) base = std::min(base, r.first);
  const int n = static_cast<int>(kept.size());
  std::vector<int64_t> table(3 * static_cast<size_t>(n));
  int64_t dst = 0;  // In elements; 128 of 2 bytes keep each copy 256-byte aligned.
  for (int i = 0; i < n; ++i) {
    table[i] = kept[i].first - base;
    table[n + i] = dst;
    table[2 * n + i] = kept[i].second;
    w->max_count = std::max(w->max_count, kept[i].second);
    dst += (kept[i].second + 127) / 128 * 128;
  }
  w->bytes = 2 * static_cast<size_t>(dst) + sizeof(int64_t) * table.size();
  CUDA_RETURN_IF_ERROR(cudaMalloc(&w->copies, 2 * static_cast<size_t>(dst)));
  CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&w->table), sizeof(int64_t) * table.size()));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(w->table, table.data(), sizeof(int64_t) * table.size(), cudaMemcpyHostToDevice));
  for (int i = 0; i < n; ++i) {
    w->copy_of[kept[i].first] = static_cast<char*>(w->copies) + 2 * table[n + i];
  }
  w->num_ranges = n;
  w->src_base = base;
  ctx.reduced_weights = std::move(w);
  return absl::OkStatus();
}

size_t ReducedWeightBytes(const CudaContext& ctx) {
  return ctx.reduced_weights != nullptr ? ctx.reduced_weights->bytes : 0;
}

absl::Status CastReducedWeights(const CudaContext& ctx) {
  const ReducedWeightCopies* w = ctx.reduced_weights.get();
  if (w == nullptr) return absl::OkStatus();
  return FromCuda(
      k::CastRangesToReduced(ctx.stream, w->num_ranges, w->table, w->table + w->num_ranges,
                             w->table + 2 * w->num_ranges, w->max_count, w->src_base, w->copies,
                             ctx.compute == ComputePrecision::kFp16),
      "CastRangesToReduced");
}

absl::Status CudaContext::Synchronize() const {
  return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status CudaContext::MakeCurrent() const {
  return FromCuda(cudaSetDevice(device), "cudaSetDevice");
}

// ------------------------------------------------------------ dense and element-wise

absl::Status Gemm(const CudaContext& ctx, Transpose trans_a, Transpose trans_b, int64_t m,
                  int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta,
                  float* c) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) return FromCuda(k::Scale(ctx.stream, m * n, beta, c), "Scale");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const int lda = AsInt(trans_a == Transpose::kYes ? m : k);
  const int ldb = AsInt(trans_b == Transpose::kYes ? k : n);
  return FromCublas(cublasSgemm(ctx.cublas, trans_b == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N,
                                trans_a == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N, AsInt(n),
                                AsInt(m), AsInt(k), &alpha, b, ldb, a, lda, &beta, c, AsInt(n)),
                    "cublasSgemm");
}

namespace {

template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float>;

// The cuBLAS / cuDNN names of the activation types.
template <typename T>
constexpr cudaDataType_t CudaType() {
  return kIsFloat<T> ? CUDA_R_32F : std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}
template <typename T>
constexpr ComputePrecision PrecisionOf() {
  return kIsFloat<T>                 ? ComputePrecision::kFp32
         : std::is_same_v<T, __half> ? ComputePrecision::kFp16
                                     : ComputePrecision::kBf16;
}

// The ops that multiply read reduced weight copies of the context's type:
// their activations must be of that type too.
template <typename T>
absl::Status CheckType(const CudaContext& ctx, const char* what) {
  if (ctx.compute == PrecisionOf<T>()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": activations of ", sizeof(T),
                                                 "-byte type in a context of precision ",
                                                 static_cast<int>(ctx.compute)));
}

size_t Reduced16Bytes(int64_t elements) { return Aligned(2 * static_cast<size_t>(elements)); }

template <typename S, typename D>
absl::Status ConvertOn(const CudaContext& ctx, int64_t n, const S* x, D* y, const float* bias,
                       int64_t channels, bool accumulate, bool relu) {
  if (n == 0) return absl::OkStatus();
  return FromCuda(k::Convert<S, D>(ctx.stream, n, x, y, bias, channels, accumulate, relu),
                  "Convert");
}

// The reduced copy (of type T) of the `n` weights at `w`: the registered one
// (CastReducedWeights), or `w` converted into `scratch`.
template <typename T>
absl::StatusOr<const T*> WeightsToReduced(const CudaContext& ctx, int64_t n, const float* w,
                                          void* scratch) {
  if (ctx.reduced_weights != nullptr) {
    auto it = ctx.reduced_weights->copy_of.find(w);
    if (it != ctx.reduced_weights->copy_of.end()) return static_cast<const T*>(it->second);
  }
  T* copy = static_cast<T*>(scratch);
  STATUS_RETURN_IF_ERROR(ConvertOn(ctx, n, w, copy, nullptr, 1, false, false));
  return static_cast<const T*>(copy);
}

// A dense layer's reduced weights: the registered copy, or a conversion at
// the head of the workspace (asked for only then: a large layer's copy is
// hundreds of MB).
template <typename T>
absl::StatusOr<const T*> DenseWeights(const CudaContext& ctx, int64_t n, const float* w) {
  if (ctx.reduced_weights != nullptr) {
    auto it = ctx.reduced_weights->copy_of.find(w);
    if (it != ctx.reduced_weights->copy_of.end()) return static_cast<const T*>(it->second);
  }
  STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, Reduced16Bytes(n)));
  return WeightsToReduced<T>(ctx, n, w, ctx.workspace);
}

// Row-major C = alpha op(A) op(B) + beta C on tensor cores with fp32
// accumulation; A and B of type `ab`, C of type `c_type`.
absl::Status GemmMixed(const CudaContext& ctx, Transpose trans_a, Transpose trans_b, int64_t m,
                       int64_t n, int64_t k_dim, float alpha, const void* a, const void* b,
                       cudaDataType_t ab, float beta, void* c, cudaDataType_t c_type) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k_dim == 0) {
    // Shapes are validated non-empty; keep the BLAS meaning all the same.
    if (beta != 0.f) return absl::InvalidArgumentError("GemmMixed: k = 0 with beta != 0");
    const size_t element = c_type == CUDA_R_32F ? 4 : 2;
    return FromCuda(cudaMemsetAsync(c, 0, element * m * n, ctx.stream), "cudaMemsetAsync");
  }
  const int lda = AsInt(trans_a == Transpose::kYes ? m : k_dim);
  const int ldb = AsInt(trans_b == Transpose::kYes ? k_dim : n);
  return FromCublas(cublasGemmEx(ctx.cublas, trans_b == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N, AsInt(n),
                                 AsInt(m), AsInt(k_dim), &alpha, b, ab, ldb, a, ab, lda, &beta, c,
                                 c_type, AsInt(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx");
}

}  // namespace

template <typename S, typename D>
absl::Status Convert(const CudaContext& ctx, int64_t n, const S* x, D* y) {
  return ConvertOn(ctx, n, x, y, nullptr, 1, false, false);
}

template <typename T>
absl::Status DenseForward(const CudaContext& ctx, int64_t batch, int64_t in, int64_t out,
                          const T* x, const float* w, const float* bias, T* y) {
  STATUS_RETURN_IF_ERROR(CheckType<T>(ctx, "DenseForward"));
  if (bias != nullptr) {
    CUDA_RETURN_IF_ERROR(k::BroadcastRows<T>(ctx.stream, batch, out, bias, y));
  }
  const float beta = bias != nullptr ? 1.f : 0.f;
  if constexpr (kIsFloat<T>) {
    return Gemm(ctx, Transpose::kNo, Transpose::kNo, batch, out, in, 1.f, x, w, beta, y);
  } else {
    absl::StatusOr<const T*> w16 = DenseWeights<T>(ctx, in * out, w);
    if (!w16.ok()) return w16.status();
    return GemmMixed(ctx, Transpose::kNo, Transpose::kNo, batch, out, in, 1.f, x, *w16,
                     CudaType<T>(), beta, y, CudaType<T>());
  }
}

template <typename T>
absl::Status DenseBackward(const CudaContext& ctx, int64_t batch, int64_t in, int64_t out,
                           const T* x, const float* w, const T* dy, T* dx, Write dx_write,
                           float* dw, float* dbias, Write param_write) {
  STATUS_RETURN_IF_ERROR(CheckType<T>(ctx, "DenseBackward"));
  // dbias first: its partials use the workspace the weight copy then reuses.
  if (dbias != nullptr) {
    absl::StatusOr<float*> partials = ColumnScratch(ctx, batch, out, 0);
    if (!partials.ok()) return partials.status();
    CUDA_RETURN_IF_ERROR(
        k::ColumnSumFast<T>(ctx.stream, batch, out, dy, dbias, Acc(param_write), *partials));
  }
  const float param_beta = Acc(param_write) ? 1.f : 0.f;
  const float dx_beta = Acc(dx_write) ? 1.f : 0.f;
  if constexpr (kIsFloat<T>) {
    STATUS_RETURN_IF_ERROR(
        Gemm(ctx, Transpose::kYes, Transpose::kNo, in, out, batch, 1.f, x, dy, param_beta, dw));
    if (dx == nullptr) return absl::OkStatus();
    return Gemm(ctx, Transpose::kNo, Transpose::kYes, batch, in, out, 1.f, dy, w, dx_beta, dx);
  } else {
    STATUS_RETURN_IF_ERROR(GemmMixed(ctx, Transpose::kYes, Transpose::kNo, in, out, batch, 1.f, x,
                                     dy, CudaType<T>(), param_beta, dw, CUDA_R_32F));
    if (dx == nullptr) return absl::OkStatus();
    absl::StatusOr<const T*> w16 = DenseWeights<T>(ctx, in * out, w);
    if (!w16.ok()) return w16.status();
    return GemmMixed(ctx, Transpose::kNo, Transpose::kYes, batch, in, out, 1.f, dy, *w16,
                     CudaType<T>(), dx_beta, dx, CudaType<T>());
  }
}

template <typename T>
absl::Status ReluForward(const CudaContext& ctx, int64_t n, const T* x, T* y) {
  return FromCuda(k::ReluForward<T>(ctx.stream, n, x, y), "ReluForward");
}

template <typename T>
absl::Status ReluBackward(const CudaContext& ctx, int64_t n, const T* y, const T* dy, T* dx,
                          Write dx_write) {
  return FromCuda(k::ReluBackward<T>(ctx.stream, n, y, dy, dx, Acc(dx_write)), "ReluBackward");
}

template <typename T>
absl::Status DropoutForward(const CudaContext& ctx, int64_t n, float rate, uint64_t seed,
                            uint64_t step, const T* x, T* y, uint8_t* mask) {
  return FromCuda(k::DropoutForward<T>(ctx.stream, n, rate, DropoutKey(seed, step), x, y, mask),
                  "DropoutForward");
}

template <typename T>
absl::Status DropoutBackward(const CudaContext& ctx, int64_t n, float rate, const uint8_t* mask,
                             const T* dy, T* dx, Write dx_write) {
  return FromCuda(k::DropoutBackward<T>(ctx.stream, n, rate, mask, dy, dx, Acc(dx_write)),
                  "DropoutBackward");
}

absl::Status SoftmaxCrossEntropy(const CudaContext& ctx, int64_t batch, int64_t classes,
                                 const float* logits, const int32_t* labels, float* dlogits,
                                 LossStats* stats) {
  auto* loss_sum = static_cast<double*>(ctx.scratch);
  auto* correct = reinterpret_cast<unsigned long long*>(loss_sum + 1);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ctx.scratch, 0, 16, ctx.stream));
  CUDA_RETURN_IF_ERROR(k::SoftmaxCrossEntropy<float>(ctx.stream, batch, classes, logits, labels,
                                                     dlogits, 1.f, loss_sum, correct));
  struct {
    double loss_sum;
    unsigned long long correct;
  } host;
  static_assert(sizeof(host) == 16, "two 8-byte fields");
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&host, ctx.scratch, sizeof(host), cudaMemcpyDeviceToHost, ctx.stream));
  STATUS_RETURN_IF_ERROR(ctx.Synchronize());
  stats->loss_sum = host.loss_sum;
  stats->correct = static_cast<int64_t>(host.correct);
  return absl::OkStatus();
}

template <typename T>
absl::Status SoftmaxCrossEntropyAsync(const CudaContext& ctx, int64_t batch, int64_t classes,
                                      const T* logits, const int32_t* labels, T* dlogits,
                                      float dlogits_scale, double* loss_sum,
                                      unsigned long long* correct) {
  return FromCuda(k::SoftmaxCrossEntropy<T>(ctx.stream, batch, classes, logits, labels, dlogits,
                                            dlogits_scale, loss_sum, correct),
                  "SoftmaxCrossEntropy");
}

template <typename T>
absl::Status CopyOrAdd(const CudaContext& ctx, int64_t n, const T* x, T* y, Write write) {
  if (!Acc(write)) {
    if (x == y || n == 0) return absl::OkStatus();
    return FromCuda(cudaMemcpyAsync(y, x, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream),
                    "cudaMemcpyAsync");
  }
  return FromCuda(k::CopyOrAdd<T>(ctx.stream, n, x, y, true), "CopyOrAdd");
}

absl::Status UnscaleCheckFinite(const CudaContext& ctx, int64_t n, float inv_scale, float* g,
                                int* flag) {
  return FromCuda(k::UnscaleCheckFinite(ctx.stream, n, inv_scale, g, flag), "UnscaleCheckFinite");
}

template <typename T>
absl::Status Zero(const CudaContext& ctx, int64_t n, T* x) {
  return FromCuda(cudaMemsetAsync(x, 0, n * sizeof(T), ctx.stream), "cudaMemsetAsync");
}

template <typename T>
absl::Status Add(const CudaContext& ctx, int64_t n, const T* a, const T* b, T* y) {
  return FromCuda(k::Add<T>(ctx.stream, n, a, b, y), "Add");
}

// ------------------------------------------------------------ convolution

namespace {

// Device bandwidth assumed when a layout change is weighed against a faster
// convolution: bytes read plus written per millisecond (2.5 TB/s, under the
// H100's and H200's measured copy rates).
constexpr double kTransposeBytesPerMs = 2.5e9;

double TransposeMs(size_t bytes) { return 2.0 * static_cast<double>(bytes) / kTransposeBytesPerMs; }

// One direction of FindAlgorithms: `find(count, &returned, perf)` is
// cudnnFind (which reports each algorithm in up to two math types, hence
// room for twice the algorithm count), `heuristic(count, &returned, perf)`
// cuDNN's heuristic list, `workspace(algo, &bytes)` an algorithm's
// workspace size.
template <int kCount, typename Perf, typename Algo, typename Find, typename Heuristic,
          typename Workspace>
absl::Status FindDirection(const char* direction, const char* layout, const WindowShape& s,
                           size_t limit, cudnnMathType_t math, Find find, Heuristic heuristic,
                           Workspace workspace, Algo* algo, size_t* bytes, float* ms) {
  Perf perf[2 * kCount];
  int returned = 0;
  CUDNN_RETURN_IF_ERROR(find(2 * kCount, &returned, perf));
  int chosen = -1;
  if (PickAlgo(perf, returned, limit, algo, bytes, &chosen, math)) {
    *ms = perf[chosen].time;
  } else {
    CUDNN_RETURN_IF_ERROR(heuristic(kCount, &returned, perf));
    PickHeuristic(perf, returned, limit, algo);
    CUDNN_RETURN_IF_ERROR(workspace(*algo, bytes));
    *ms = kUnmeasured;
  }
  LogPlan(direction, layout, s, perf, returned, *algo);
  return absl::OkStatus();
}

// Measures the algorithms of all three directions of `v` (cudnnFind, as
// PyTorch's cudnn.benchmark) and keeps the fastest in `math` (the
// descriptor's) that fits `limit` bytes of workspace, or the first
// heuristic choice that fits.
absl::Status FindAlgorithms(const CudaContext& ctx, const WindowShape& s, const char* layout,
                            size_t limit, ConvVariant* v, cudnnMathType_t math = CUDNN_FMA_MATH) {
  cudnnHandle_t h = ctx.cudnn;
  const cudnnTensorDescriptor_t x = v->x.d, y = v->y.d;
  const cudnnFilterDescriptor_t w = v->w.d;
  const cudnnConvolutionDescriptor_t c = v->conv.d;
  STATUS_RETURN_IF_ERROR(
      (FindDirection<CUDNN_CONVOLUTION_FWD_ALGO_COUNT, cudnnConvolutionFwdAlgoPerf_t>(
          "forward", layout, s, limit, math,
          [&](int n, int* r, auto* p) {
            return cudnnFindConvolutionForwardAlgorithm(h, x, w, c, y, n, r, p);
          },
          [&](int n, int* r, auto* p) {
            return cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y, n, r, p);
          },
          [&](auto algo, size_t* bytes) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, x, w, c, y, algo, bytes);
          },
          &v->fwd_algo, &v->fwd_bytes, &v->fwd_ms)));
  STATUS_RETURN_IF_ERROR(
      (FindDirection<CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, cudnnConvolutionBwdFilterAlgoPerf_t>(
          "backward-filter", layout, s, limit, math,
          [&](int n, int* r, auto* p) {
            return cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, c, w, n, r, p);
          },
          [&](int n, int* r, auto* p) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, c, w, n, r, p);
          },
          [&](auto algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x, y, c, w, algo, bytes);
          },
          &v->bwd_filter_algo, &v->bwd_filter_bytes, &v->bwd_filter_ms)));
  return FindDirection<CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, cudnnConvolutionBwdDataAlgoPerf_t>(
      "backward-data", layout, s, limit, math,
      [&](int n, int* r, auto* p) {
        return cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, c, x, n, r, p);
      },
      [&](int n, int* r, auto* p) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, c, x, n, r, p);
      },
      [&](auto algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w, y, c, x, algo, bytes);
      },
      &v->bwd_data_algo, &v->bwd_data_bytes, &v->bwd_data_ms);
}

// The scratch the NCHW path keeps beside cuDNN's own workspace.
size_t NchwForwardScratch(const ConvPlan& p) { return p.in_bytes + p.filter_bytes + p.out_bytes; }
size_t NchwBackwardScratch(const ConvPlan& p) {
  return 2 * p.in_bytes + p.out_bytes + 2 * p.filter_bytes;
}

// Column-sum partials (dbias) share cuDNN's part of the workspace: they are
// consumed before the convolution that follows them on the stream.
size_t BiasScratch(const WindowShape& s) {
  return Aligned(sizeof(float) * k::ColumnPartialsElements(s.batch * s.out_h * s.out_w, s.out_c));
}

// The workspace the fp32 plan's forward / backward asks for.
size_t Fp32ForwardWorkspace(const ConvPlan& p) {
  return p.fwd_nchw ? NchwForwardScratch(p) + p.nchw.fwd_bytes : p.padded_bytes + p.nhwc.fwd_bytes;
}
size_t Fp32BackwardWorkspace(const WindowShape& s, const ConvPlan& p, bool dx, bool dbias) {
  const ConvVariant& v = p.bwd_nchw ? p.nchw : p.nhwc;
  const size_t cudnn = std::max(
      {v.bwd_filter_bytes, dx ? v.bwd_data_bytes : size_t{0}, dbias ? BiasScratch(s) : size_t{0}});
  return (p.bwd_nchw ? NchwBackwardScratch(p) : 2 * p.padded_bytes) + cudnn;
}

// Measures both layouts the first time `s` is seen and picks one for the
// forward and one for the backward (or takes ctx.conv_layout's).
absl::Status ChooseLayouts(const CudaContext& ctx, const WindowShape& s, ConvPlan* p) {
  if (p->chosen) return absl::OkStatus();
  const bool measure_nhwc = ctx.conv_layout != ConvLayout::kNchw;
  const bool measure_nchw = ctx.conv_layout != ConvLayout::kNhwc;
  if (measure_nhwc) {
    STATUS_RETURN_IF_ERROR(
        FindAlgorithms(ctx, s, "nhwc", kMaxWorkspaceBytes - 2 * p->padded_bytes, &p->nhwc));
  }
  if (measure_nchw) {
    STATUS_RETURN_IF_ERROR(
        FindAlgorithms(ctx, s, "nchw", kMaxWorkspaceBytes - NchwBackwardScratch(*p), &p->nchw));
  }
  if (measure_nhwc && measure_nchw) {
    const double fwd_nhwc = p->nhwc.fwd_ms;
    const double fwd_nchw = p->nchw.fwd_ms + TransposeMs(p->in_bytes) +
                            TransposeMs(p->filter_bytes) + TransposeMs(p->out_bytes);
    const double bwd_nhwc = p->nhwc.bwd_filter_ms + p->nhwc.bwd_data_ms;
    const double bwd_nchw = p->nchw.bwd_filter_ms + p->nchw.bwd_data_ms +
                            2 * TransposeMs(p->in_bytes) + TransposeMs(p->out_bytes) +
                            2 * TransposeMs(p->filter_bytes);
    p->fwd_nchw = fwd_nchw < fwd_nhwc;
    p->bwd_nchw = bwd_nchw < bwd_nhwc;
    if (log_conv_plans.load()) {
      std::fprintf(stderr,
                   "conv layouts n=%lld in=%lldx%lldx%lld out=%lldx%lldx%lld k=%lld: forward "
                   "nhwc %.3f nchw %.3f ms -> %s; backward nhwc %.3f nchw %.3f ms -> %s\n",
                   static_cast<long long>(s.batch), static_cast<long long>(s.in_h),
                   static_cast<long long>(s.in_w), static_cast<long long>(s.in_c),
                   static_cast<long long>(s.out_h), static_cast<long long>(s.out_w),
                   static_cast<long long>(s.out_c), static_cast<long long>(s.kernel_h), fwd_nhwc,
                   fwd_nchw, p->fwd_nchw ? "nchw" : "nhwc", bwd_nhwc, bwd_nchw,
                   p->bwd_nchw ? "nchw" : "nhwc");
    }
  } else {
    p->fwd_nchw = p->bwd_nchw = measure_nchw;
  }
  p->chosen = true;
  return absl::OkStatus();
}

// The reduced backward's scratch before cuDNN's workspace: the padded input
// and its gradient (padded plans), the filter gradient, and room for a
// filter copy.
size_t ReducedBackwardScratch(const ConvPlan& p) {
  return 2 * (p.padded ? p.in16_bytes : 0) + 2 * p.filter16_bytes;
}

// The most the fp32 copies of a reduced convolution's tensors and the fp32
// plan's workspace may take where that plan is merely faster (not where it
// is the only one).
constexpr int64_t kMaxStagingBytes = int64_t{64} << 20;

// bf16/fp16 contexts: the tensor-op NHWC variant on the reduced tensors
// (padded plans convolve a padded copy), measured the first time `s` is
// seen. A shape cuDNN cannot run reduced (reduced_ok false) runs the fp32
// plan on converted copies.
void ChooseReduced(const CudaContext& ctx, const WindowShape& s, ConvPlan* p) {
  if (p->reduced_chosen) return;
  p->reduced_chosen = true;
  p->in16_bytes = Reduced16Bytes(s.batch * p->conv_in_h * p->conv_in_w * s.in_c);
  p->filter16_bytes = Reduced16Bytes(s.out_c * s.patch_elements());
  absl::Status st = MakeReducedVariant(s, ReducedCudnnType(ctx.compute), *p, &p->reduced);
  if (st.ok()) {
    st = FindAlgorithms(ctx, s, "reduced", kMaxWorkspaceBytes - ReducedBackwardScratch(*p),
                        &p->reduced, CUDNN_TENSOR_OP_MATH);
  }
  p->reduced_ok = st.ok();
  if (!st.ok()) {
    if (log_conv_plans.load()) {
      std::fprintf(stderr, "conv reduced precision unavailable, fp32 instead: %s\n",
                   std::string(st.message()).c_str());
    }
    return;
  }
  p->fwd_reduced = p->bwd_reduced = true;
  const int64_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  // Too large for fp32 copies whatever the fp32 plan measures.
  if (4 * (in_n + out_n) > kMaxStagingBytes) return;
  if (!ChooseLayouts(ctx, s, p).ok()) return;
  // A conversion reads 2 bytes and writes 4 per element, or back.
  auto convert_ms = [](int64_t elements) {
    return 6.0 * static_cast<double>(elements) / kTransposeBytesPerMs;
  };
  const double fwd_fp32 =
      (p->fwd_nchw ? p->nchw.fwd_ms + TransposeMs(p->in_bytes) + TransposeMs(p->filter_bytes) +
                         TransposeMs(p->out_bytes)
                   : p->nhwc.fwd_ms) +
      convert_ms(in_n) + convert_ms(out_n);
  const double bwd_fp32 =
      (p->bwd_nchw ? p->nchw.bwd_filter_ms + p->nchw.bwd_data_ms + 2 * TransposeMs(p->in_bytes) +
                         TransposeMs(p->out_bytes) + 2 * TransposeMs(p->filter_bytes)
                   : p->nhwc.bwd_filter_ms + p->nhwc.bwd_data_ms) +
      2 * convert_ms(in_n) + convert_ms(out_n);
  const double fwd_reduced = p->reduced.fwd_ms;
  const double bwd_reduced = p->reduced.bwd_filter_ms + p->reduced.bwd_data_ms;
  // The fp32 copies and the fp32 plan's workspace cost memory the reduced
  // path does not: worth it on small tensors only (the Fashion-MNIST CNN's
  // first convolution, not ResNet's or VGG's 3-channel stems, whose copies
  // alone would take 70-900 MB).
  const int64_t fwd_memory = 4 * (in_n + out_n) + Fp32ForwardWorkspace(*p);
  const int64_t bwd_memory = 4 * (2 * in_n + out_n) + Fp32BackwardWorkspace(s, *p, true, true);
  p->fwd_reduced = fwd_memory > kMaxStagingBytes || fwd_reduced <= fwd_fp32;
  p->bwd_reduced = bwd_memory > kMaxStagingBytes || bwd_reduced <= bwd_fp32;
  if (log_conv_plans.load()) {
    std::fprintf(stderr,
                 "conv precision n=%lld in=%lldx%lldx%lld out=%lldx%lldx%lld k=%lld: forward "
                 "reduced %.3f fp32 %.3f ms -> %s; backward reduced %.3f fp32 %.3f ms -> %s\n",
                 static_cast<long long>(s.batch), static_cast<long long>(s.in_h),
                 static_cast<long long>(s.in_w), static_cast<long long>(s.in_c),
                 static_cast<long long>(s.out_h), static_cast<long long>(s.out_w),
                 static_cast<long long>(s.out_c), static_cast<long long>(s.kernel_h), fwd_reduced,
                 fwd_fp32, p->fwd_reduced ? "reduced" : "fp32", bwd_reduced, bwd_fp32,
                 p->bwd_reduced ? "reduced" : "fp32");
  }
}

template <typename T>
absl::Status Conv2dForwardReduced(const CudaContext& ctx, const WindowShape& s, const ConvPlan& p,
                                  const T* x, const float* w, const float* bias, T* y, bool relu) {
  const ConvVariant& v = p.reduced;
  const size_t padded = p.padded ? p.in16_bytes : 0;
  const size_t scratch = padded + p.filter16_bytes;
  STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, scratch + v.fwd_bytes));
  char* base = static_cast<char*>(ctx.workspace);
  const T* input = x;
  if (p.padded) {
    T* copy = reinterpret_cast<T*>(base);
    CUDA_RETURN_IF_ERROR(k::PadImages<T>(ctx.stream, s, p.padded_h, p.padded_w, x, copy));
    input = copy;
  }
  absl::StatusOr<const T*> w16 =
      WeightsToReduced<T>(ctx, s.out_c * s.patch_elements(), w, base + padded);
  if (!w16.ok()) return w16.status();
  const float one = 1.f, zero = 0.f;
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(ctx.cudnn, &one, v.x.d, input, v.w.d, *w16,
                                                v.conv.d, v.fwd_algo, base + scratch,
                                                ctx.workspace_bytes - scratch, &zero, v.y.d, y));
  if (bias == nullptr && !relu) return absl::OkStatus();
  return ConvertOn(ctx, s.batch * s.out_elements(), y, y, bias, s.out_c, false, relu);
}

template <typename T>
absl::Status Conv2dBackwardReduced(const CudaContext& ctx, const WindowShape& s, const ConvPlan& p,
                                   const T* x, const float* w, const T* dy, T* dx, Write dx_write,
                                   float* dw, float* dbias, Write param_write) {
  const ConvVariant& v = p.reduced;
  const size_t scratch = ReducedBackwardScratch(p);
  const size_t bias_scratch = dbias != nullptr ? BiasScratch(s) : 0;
  STATUS_RETURN_IF_ERROR(EnsureWorkspace(
      ctx, scratch + std::max({v.bwd_filter_bytes, dx != nullptr ? v.bwd_data_bytes : size_t{0},
                               bias_scratch})));
  char* base = static_cast<char*>(ctx.workspace);
  const size_t padded = p.padded ? p.in16_bytes : 0;
  T* x_padded = reinterpret_cast<T*>(base);
  T* dx_padded = reinterpret_cast<T*>(base + padded);
  T* dw16 = reinterpret_cast<T*>(base + 2 * padded);
  char* w16_scratch = base + 2 * padded + p.filter16_bytes;
  char* free_space = base + scratch;
  const size_t free_bytes = ctx.workspace_bytes - scratch;
  if (dbias != nullptr) {
    CUDA_RETURN_IF_ERROR(k::ColumnSumFast<T>(ctx.stream, s.batch * s.out_h * s.out_w, s.out_c, dy,
                                             dbias, Acc(param_write),
                                             reinterpret_cast<float*>(free_space)));
  }
  const T* input = x;
  if (p.padded) {
    CUDA_RETURN_IF_ERROR(k::PadImages<T>(ctx.stream, s, p.padded_h, p.padded_w, x, x_padded));
    input = x_padded;
  }
  const int64_t filter_n = s.out_c * s.patch_elements();
  const float one = 1.f, zero = 0.f;
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(ctx.cudnn, &one, v.x.d, input, v.y.d, dy,
                                                       v.conv.d, v.bwd_filter_algo, free_space,
                                                       free_bytes, &zero, v.w.d, dw16));
  STATUS_RETURN_IF_ERROR(ConvertOn(ctx, filter_n, dw16, dw, nullptr, 1, Acc(param_write), false));
  if (dx == nullptr) return absl::OkStatus();
  absl::StatusOr<const T*> w16 = WeightsToReduced<T>(ctx, filter_n, w, w16_scratch);
  if (!w16.ok()) return w16.status();
  if (!p.padded) {
    const float dx_beta = Acc(dx_write) ? 1.f : 0.f;
    CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(ctx.cudnn, &one, v.w.d, *w16, v.y.d, dy,
                                                       v.conv.d, v.bwd_data_algo, free_space,
                                                       free_bytes, &dx_beta, v.x.d, dx));
    return absl::OkStatus();
  }
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(ctx.cudnn, &one, v.w.d, *w16, v.y.d, dy,
                                                     v.conv.d, v.bwd_data_algo, free_space,
                                                     free_bytes, &zero, v.x.d, dx_padded));
  return FromCuda(
      k::CropImages<T>(ctx.stream, s, p.padded_h, p.padded_w, dx_padded, dx, Acc(dx_write)),
      "CropImages");
}

// The first `bytes` of ctx's workspace (ensured) for the caller; the rest is
// the workspace of the nested calls made while this lives, which must ask
// for no more than `rest` (so that none of them reallocates it).
class WorkspaceHead {
 public:
  static absl::StatusOr<std::unique_ptr<WorkspaceHead>> Take(const CudaContext& ctx, size_t bytes,
                                                             size_t rest) {
    STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, Aligned(bytes) + rest));
    return std::unique_ptr<WorkspaceHead>(new WorkspaceHead(ctx, Aligned(bytes)));
  }
  ~WorkspaceHead() {
    // A nested call that broke the contract and replaced the workspace
    // keeps its own (the head then leaks rather than being freed twice).
    if (ctx_.workspace != head_ + bytes_) return;
    ctx_.workspace = head_;
    ctx_.workspace_bytes += bytes_;
  }
  char* data() const { return head_; }

 private:
  WorkspaceHead(const CudaContext& ctx, size_t bytes)
      : ctx_(ctx), head_(static_cast<char*>(ctx.workspace)), bytes_(bytes) {
    ctx_.workspace = head_ + bytes;
    ctx_.workspace_bytes -= bytes;
  }
  const CudaContext& ctx_;
  char* const head_;
  const size_t bytes_;
};

// NHWC x (padded as the plan says) -> NCHW xn.
absl::Status ToNchwInput(const CudaContext& ctx, const WindowShape& s, const ConvPlan& p,
                         const float* x, float* xn) {
  if (p.padded) {
    return FromCuda(k::PadToNchw(ctx.stream, s, p.padded_h, p.padded_w, x, xn), "PadToNchw");
  }
  return FromCuda(
      k::BatchedTranspose(ctx.stream, s.batch, s.in_h * s.in_w, s.in_c, x, xn, nullptr, false),
      "BatchedTranspose");
}

// [out_c, kh, kw, in_c] -> [out_c, in_c, kh, kw].
absl::Status ToNchwFilter(const CudaContext& ctx, const WindowShape& s, const float* w, float* wn) {
  return FromCuda(k::BatchedTranspose(ctx.stream, s.out_c, s.kernel_h * s.kernel_w, s.in_c, w, wn,
                                      nullptr, false),
                  "BatchedTranspose");
}

absl::Status ReluInPlace(const CudaContext& ctx, int64_t n, float* y) {
  return FromCuda(k::ReluForward<float>(ctx.stream, n, y, y), "ReluForward");
}

// The fp32 plan: NHWC or NCHW, as measured.
absl::Status Conv2dForwardFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                               const float* x, const float* w, const float* bias, float* y,
                               bool relu) {
  STATUS_RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  const float one = 1.f, zero = 0.f;
  if (p.fwd_nchw) {
    const ConvVariant& v = p.nchw;
    const size_t scratch = NchwForwardScratch(p);
    STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, Fp32ForwardWorkspace(p)));
    char* base = static_cast<char*>(ctx.workspace);
    auto* xn = reinterpret_cast<float*>(base);
    auto* wn = reinterpret_cast<float*>(base + p.in_bytes);
    auto* yn = reinterpret_cast<float*>(base + p.in_bytes + p.filter_bytes);
    STATUS_RETURN_IF_ERROR(ToNchwInput(ctx, s, p, x, xn));
    STATUS_RETURN_IF_ERROR(ToNchwFilter(ctx, s, w, wn));
    CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(ctx.cudnn, &one, v.x.d, xn, v.w.d, wn, v.conv.d,
                                                  v.fwd_algo, base + scratch,
                                                  ctx.workspace_bytes - scratch, &zero, v.y.d, yn));
    CUDA_RETURN_IF_ERROR(
        k::BatchedTranspose(ctx.stream, s.batch, s.out_c, s.out_h * s.out_w, yn, y, bias, false));
    return relu ? ReluInPlace(ctx, s.batch * s.out_elements(), y) : absl::OkStatus();
  }
  const ConvVariant& v = p.nhwc;
  STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, Fp32ForwardWorkspace(p)));
  const float* input = x;
  char* free_space = static_cast<char*>(ctx.workspace);
  size_t free_bytes = ctx.workspace_bytes;
  if (p.padded) {
    auto* padded = reinterpret_cast<float*>(free_space);
    CUDA_RETURN_IF_ERROR(k::PadImages<float>(ctx.stream, s, p.padded_h, p.padded_w, x, padded));
    input = padded;
    free_space += p.padded_bytes;
    free_bytes -= p.padded_bytes;
  }
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(ctx.cudnn, &one, v.x.d, input, v.w.d, w, v.conv.d,
                                                v.fwd_algo, free_space, free_bytes, &zero, v.y.d,
                                                y));
  if (bias != nullptr) {
    CUDNN_RETURN_IF_ERROR(cudnnAddTensor(ctx.cudnn, &one, p.bias.d, bias, &one, v.y.d, y));
  }
  return relu ? ReluInPlace(ctx, s.batch * s.out_elements(), y) : absl::OkStatus();
}

absl::Status Conv2dBackwardFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                                const float* x, const float* w, const float* dy, float* dx,
                                Write dx_write, float* dw, float* dbias, Write param_write) {
  STATUS_RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  const float one = 1.f, zero = 0.f;
  const float param_beta = Acc(param_write) ? 1.f : 0.f;
  STATUS_RETURN_IF_ERROR(
      EnsureWorkspace(ctx, Fp32BackwardWorkspace(s, p, dx != nullptr, dbias != nullptr)));
  if (p.bwd_nchw) {
    const ConvVariant& v = p.nchw;
    const size_t scratch = NchwBackwardScratch(p);
    char* base = static_cast<char*>(ctx.workspace);
    auto* xn = reinterpret_cast<float*>(base);
    auto* dxn = reinterpret_cast<float*>(base + p.in_bytes);
    auto* dyn = reinterpret_cast<float*>(base + 2 * p.in_bytes);
    auto* wn = reinterpret_cast<float*>(base + 2 * p.in_bytes + p.out_bytes);
    auto* dwn = reinterpret_cast<float*>(base + 2 * p.in_bytes + p.out_bytes + p.filter_bytes);
    char* free_space = base + scratch;
    const size_t free_bytes = ctx.workspace_bytes - scratch;
    if (dbias != nullptr) {
      CUDA_RETURN_IF_ERROR(k::ColumnSumFast<float>(ctx.stream, s.batch * s.out_h * s.out_w, s.out_c,
                                                   dy, dbias, Acc(param_write),
                                                   reinterpret_cast<float*>(free_space)));
    }
    STATUS_RETURN_IF_ERROR(ToNchwInput(ctx, s, p, x, xn));
    CUDA_RETURN_IF_ERROR(k::BatchedTranspose(ctx.stream, s.batch, s.out_h * s.out_w, s.out_c, dy,
                                             dyn, nullptr, false));
    CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(ctx.cudnn, &one, v.x.d, xn, v.y.d, dyn,
                                                         v.conv.d, v.bwd_filter_algo, free_space,
                                                         free_bytes, &zero, v.w.d, dwn));
    CUDA_RETURN_IF_ERROR(k::BatchedTranspose(ctx.stream, s.out_c, s.in_c, s.kernel_h * s.kernel_w,
                                             dwn, dw, nullptr, Acc(param_write)));
    if (dx == nullptr) return absl::OkStatus();
    STATUS_RETURN_IF_ERROR(ToNchwFilter(ctx, s, w, wn));
    CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(ctx.cudnn, &one, v.w.d, wn, v.y.d, dyn,
                                                       v.conv.d, v.bwd_data_algo, free_space,
                                                       free_bytes, &zero, v.x.d, dxn));
    if (p.padded) {
      return FromCuda(
          k::CropFromNchw(ctx.stream, s, p.padded_h, p.padded_w, dxn, dx, Acc(dx_write)),
          "CropFromNchw");
    }
    return FromCuda(k::BatchedTranspose(ctx.stream, s.batch, s.in_c, s.in_h * s.in_w, dxn, dx,
                                        nullptr, Acc(dx_write)),
                    "BatchedTranspose");
  }
  const ConvVariant& v = p.nhwc;
  char* free_space = static_cast<char*>(ctx.workspace);
  size_t free_bytes = ctx.workspace_bytes;
  const float* input = x;
  float* dpadded = nullptr;
  if (p.padded) {
    auto* padded = reinterpret_cast<float*>(free_space);
    CUDA_RETURN_IF_ERROR(k::PadImages<float>(ctx.stream, s, p.padded_h, p.padded_w, x, padded));
    input = padded;
    dpadded = reinterpret_cast<float*>(free_space + p.padded_bytes);
    free_space += 2 * p.padded_bytes;
    free_bytes -= 2 * p.padded_bytes;
  }
  if (dbias != nullptr) {
    CUDA_RETURN_IF_ERROR(k::ColumnSumFast<float>(ctx.stream, s.batch * s.out_h * s.out_w, s.out_c,
                                                 dy, dbias, Acc(param_write),
                                                 reinterpret_cast<float*>(free_space)));
  }
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(ctx.cudnn, &one, v.x.d, input, v.y.d, dy,
                                                       v.conv.d, v.bwd_filter_algo, free_space,
                                                       free_bytes, &param_beta, v.w.d, dw));
  if (dx == nullptr) return absl::OkStatus();
  if (!p.padded) {
    const float dx_beta = Acc(dx_write) ? 1.f : 0.f;
    CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(ctx.cudnn, &one, v.w.d, w, v.y.d, dy,
                                                       v.conv.d, v.bwd_data_algo, free_space,
                                                       free_bytes, &dx_beta, v.x.d, dx));
    return absl::OkStatus();
  }
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(ctx.cudnn, &one, v.w.d, w, v.y.d, dy, v.conv.d,
                                                     v.bwd_data_algo, free_space, free_bytes, &zero,
                                                     v.x.d, dpadded));
  return FromCuda(
      k::CropImages<float>(ctx.stream, s, p.padded_h, p.padded_w, dpadded, dx, Acc(dx_write)),
      "CropImages");
}

// A reduced-precision convolution as the fp32 plan on converted copies
// (kept at the head of the workspace).
template <typename T>
absl::Status Conv2dForwardViaFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                                  const T* x, const float* w, const float* bias, T* y, bool relu) {
  STATUS_RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  const int64_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  const size_t x_bytes = Aligned(sizeof(float) * in_n);
  absl::StatusOr<std::unique_ptr<WorkspaceHead>> copies =
      WorkspaceHead::Take(ctx, x_bytes + sizeof(float) * out_n, Fp32ForwardWorkspace(p));
  if (!copies.ok()) return copies.status();
  auto* x32 = reinterpret_cast<float*>((*copies)->data());
  auto* y32 = reinterpret_cast<float*>((*copies)->data() + x_bytes);
  STATUS_RETURN_IF_ERROR(ConvertOn(ctx, in_n, x, x32, nullptr, 1, false, false));
  STATUS_RETURN_IF_ERROR(Conv2dForwardFp32(ctx, s, p, x32, w, bias, y32, false));
  return ConvertOn(ctx, out_n, y32, y, nullptr, 1, false, relu);
}

template <typename T>
absl::Status Conv2dBackwardViaFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                                   const T* x, const float* w, const T* dy, T* dx, Write dx_write,
                                   float* dw, float* dbias, Write param_write) {
  STATUS_RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  const int64_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  const size_t in_bytes = Aligned(sizeof(float) * in_n);
  const size_t out_bytes = Aligned(sizeof(float) * out_n);
  absl::StatusOr<std::unique_ptr<WorkspaceHead>> copies =
      WorkspaceHead::Take(ctx, in_bytes + out_bytes + (dx != nullptr ? in_bytes : 0),
                          Fp32BackwardWorkspace(s, p, dx != nullptr, dbias != nullptr));
  if (!copies.ok()) return copies.status();
  char* base = (*copies)->data();
  auto* x32 = reinterpret_cast<float*>(base);
  auto* dy32 = reinterpret_cast<float*>(base + in_bytes);
  float* dx32 = dx != nullptr ? reinterpret_cast<float*>(base + in_bytes + out_bytes) : nullptr;
  STATUS_RETURN_IF_ERROR(ConvertOn(ctx, in_n, x, x32, nullptr, 1, false, false));
  STATUS_RETURN_IF_ERROR(ConvertOn(ctx, out_n, dy, dy32, nullptr, 1, false, false));
  STATUS_RETURN_IF_ERROR(
      Conv2dBackwardFp32(ctx, s, p, x32, w, dy32, dx32, Write::kOverwrite, dw, dbias, param_write));
  if (dx == nullptr) return absl::OkStatus();
  return ConvertOn(ctx, in_n, dx32, dx, nullptr, 1, Acc(dx_write), false);
}

}  // namespace

template <typename T>
absl::Status Conv2dForward(const CudaContext& ctx, const WindowShape& s, const T* x, const float* w,
                           const float* bias, T* y, bool relu) {
  STATUS_RETURN_IF_ERROR(CheckType<T>(ctx, "Conv2dForward"));
  absl::StatusOr<ConvPlan*> plan = PlanFor(ctx, s);
  if (!plan.ok()) return plan.status();
  ConvPlan& p = **plan;
  if constexpr (kIsFloat<T>) {
    return Conv2dForwardFp32(ctx, s, p, x, w, bias, y, relu);
  } else {
    ChooseReduced(ctx, s, &p);
    if (p.fwd_reduced) return Conv2dForwardReduced<T>(ctx, s, p, x, w, bias, y, relu);
    return Conv2dForwardViaFp32<T>(ctx, s, p, x, w, bias, y, relu);
  }
}

template <typename T>
absl::Status Conv2dBackward(const CudaContext& ctx, const WindowShape& s, const T* x,
                            const float* w, const T* dy, T* dx, Write dx_write, float* dw,
                            float* dbias, Write param_write) {
  STATUS_RETURN_IF_ERROR(CheckType<T>(ctx, "Conv2dBackward"));
  absl::StatusOr<ConvPlan*> plan = PlanFor(ctx, s);
  if (!plan.ok()) return plan.status();
  ConvPlan& p = **plan;
  if constexpr (kIsFloat<T>) {
    return Conv2dBackwardFp32(ctx, s, p, x, w, dy, dx, dx_write, dw, dbias, param_write);
  } else {
    ChooseReduced(ctx, s, &p);
    if (p.bwd_reduced) {
      return Conv2dBackwardReduced<T>(ctx, s, p, x, w, dy, dx, dx_write, dw, dbias, param_write);
    }
    return Conv2dBackwardViaFp32<T>(ctx, s, p, x, w, dy, dx, dx_write, dw, dbias, param_write);
  }
}

// ------------------------------------------------------------ pooling

template <typename T>
absl::Status MaxPoolForward(const CudaContext& ctx, const WindowShape& s, const T* x, T* y) {
  return FromCuda(k::MaxPoolForward<T>(ctx.stream, s, x, y), "MaxPoolForward");
}

template <typename T>
absl::Status MaxPoolBackward(const CudaContext& ctx, const WindowShape& s, const T* x, const T* dy,
                             T* dx, Write dx_write) {
  return FromCuda(k::MaxPoolBackward<T>(ctx.stream, s, x, dy, dx, Acc(dx_write)),
                  "MaxPoolBackward");
}

template <typename T>
absl::Status AvgPoolForward(const CudaContext& ctx, const WindowShape& s, const T* x, T* y) {
  return FromCuda(k::AvgPoolForward<T>(ctx.stream, s, x, y), "AvgPoolForward");
}

template <typename T>
absl::Status AvgPoolBackward(const CudaContext& ctx, const WindowShape& s, const T* dy, T* dx,
                             Write dx_write) {
  return FromCuda(k::AvgPoolBackward<T>(ctx.stream, s, dy, dx, Acc(dx_write)), "AvgPoolBackward");
}

template <typename T>
absl::Status GlobalAvgPoolForward(const CudaContext& ctx, int64_t batch, int64_t spatial,
                                  int64_t channels, const T* x, T* y) {
  return FromCuda(k::GlobalAvgPoolForward<T>(ctx.stream, batch, spatial, channels, x, y),
                  "GlobalAvgPoolForward");
}

template <typename T>
absl::Status GlobalAvgPoolBackward(const CudaContext& ctx, int64_t batch, int64_t spatial,
                                   int64_t channels, const T* dy, T* dx, Write dx_write) {
  return FromCuda(
      k::GlobalAvgPoolBackward<T>(ctx.stream, batch, spatial, channels, dy, dx, Acc(dx_write)),
      "GlobalAvgPoolBackward");
}

// ------------------------------------------------------------ batch norm

// Ours, not cuDNN's: over the [rows, 1, 1, channels] view that NHWC needs,
// cuDNN 9's spatial batch norm ran one reduction per channel over 262144
// rows (ResNet-18 at batch 256) and took most of the step. The partials of
// the column reductions go to the workspace.

template <typename T>
absl::Status BatchNormForwardTraining(const CudaContext& ctx, int64_t rows, int64_t channels,
                                      const T* x, const float* gamma, const float* beta,
                                      float epsilon, float momentum, T* y, float* running_mean,
                                      float* running_var, float* save_mean, float* save_inv_std) {
  absl::StatusOr<float*> partials = ColumnScratch(ctx, rows, channels, 0);
  if (!partials.ok()) return partials.status();
  return FromCuda(k::BatchNormForwardTraining<T>(ctx.stream, rows, channels, x, gamma, beta,
                                                 epsilon, momentum, y, running_mean, running_var,
                                                 save_mean, save_inv_std, *partials),
                  "BatchNormForwardTraining");
}

template <typename T>
absl::Status BatchNormForwardInference(const CudaContext& ctx, int64_t rows, int64_t channels,
                                       const T* x, const float* gamma, const float* beta,
                                       const float* mean, const float* var, float epsilon, T* y) {
  return FromCuda(k::BatchNormForwardInference<T>(ctx.stream, rows, channels, x, gamma, beta, mean,
                                                  var, epsilon, y),
                  "BatchNormForwardInference");
}

template <typename T>
absl::Status BatchNormBackward(const CudaContext& ctx, int64_t rows, int64_t channels, const T* x,
                               const T* dy, const float* gamma, const float* save_mean,
                               const float* save_inv_std, T* dx, Write dx_write, float* dgamma,
                               float* dbeta, Write param_write) {
  absl::StatusOr<float*> scratch = ColumnScratch(ctx, rows, channels, 2 * channels);
  if (!scratch.ok()) return scratch.status();
  float* sums = *scratch + k::ColumnPartialsElements(std::max<int64_t>(rows, 1), channels);
  return FromCuda(
      k::BatchNormBackward<T>(ctx.stream, rows, channels, x, dy, gamma, save_mean, save_inv_std, dx,
                              Acc(dx_write), dgamma, dbeta, Acc(param_write), *scratch, sums),
      "BatchNormBackward");
}

// ------------------------------------------------------------ embedding

template <typename T>
absl::Status EmbeddingForward(const CudaContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                              const float* ids, const float* table, T* y) {
  return FromCuda(k::EmbeddingForward<T>(ctx.stream, num_ids, vocab, dim, ids, table, y),
                  "EmbeddingForward");
}

template <typename T>
absl::Status EmbeddingBackward(const CudaContext& ctx, int64_t num_ids, int64_t vocab, int64_t dim,
                               const float* ids, const T* dy, float* dtable, Write param_write) {
  if (!Acc(param_write)) STATUS_RETURN_IF_ERROR(Zero<float>(ctx, vocab * dim, dtable));
  return FromCuda(k::EmbeddingBackward<T>(ctx.stream, num_ids, vocab, dim, ids, dy, dtable),
                  "EmbeddingBackward");
}

// ------------------------------------------------------------ optimizers

absl::Status ApplyOptimizer(const CudaContext& ctx, OptimizerKind kind,
                            const OptimizerHyperparams& hp, const float* grad, int64_t n,
                            float* param, float* const* slots) {
  TensorUpdate t;
  t.grad = grad;
  t.param = param;
  t.n = n;
  for (int i = 0; i < NumOptimizerSlots(kind); ++i) t.slots[i] = slots[i];
  return ApplyOptimizerMultiTensor(ctx, kind, hp, {t});
}

namespace {

k::OptimizerArgs ResolveArgs(OptimizerKind kind, const OptimizerHyperparams& hp) {
  k::OptimizerArgs args;
  args.kind = static_cast<int>(kind);
  args.lr = hp.learning_rate;
  args.momentum = hp.momentum;
  args.beta1 = hp.beta1;
  args.beta2 = hp.beta2;
  args.epsilon = hp.epsilon;
  args.weight_decay = hp.weight_decay;
  const AdamCorrections c = AdamBiasCorrections(hp);
  args.adam_step_size = c.step_size;
  args.adam_inv_sqrt_bc2 = c.inv_sqrt_bc2;
  return args;
}

// The descriptors of `tensors` and their chunks, packed as one host buffer:
// descriptors, then chunk starts, then chunk tensors.
struct PackedUpdate {
  std::vector<char> host;
  size_t desc_bytes = 0, start_bytes = 0;
  int64_t num_chunks = 0;
};

PackedUpdate Pack(const std::vector<TensorUpdate>& tensors) {
  PackedUpdate packed;
  std::vector<k::OptimizerTensor> descs;
  std::vector<int32_t> chunk_tensor;
  std::vector<int64_t> chunk_start;
  for (const TensorUpdate& u : tensors) {
    if (u.n <= 0) continue;
    const int32_t index = static_cast<int32_t>(descs.size());
    descs.push_back({u.grad, u.param, u.slots[0], u.slots[1], u.n});
    for (int64_t start = 0; start < u.n; start += k::kOptimizerChunk) {
      chunk_tensor.push_back(index);
      chunk_start.push_back(start);
    }
  }
  if (descs.empty()) return packed;
  const size_t desc_bytes = Aligned(descs.size() * sizeof(k::OptimizerTensor));
  const size_t start_bytes = Aligned(chunk_start.size() * sizeof(int64_t));
  const size_t tensor_bytes = chunk_tensor.size() * sizeof(int32_t);
  std::vector<char>& host = packed.host;
  host.resize(desc_bytes + start_bytes + tensor_bytes);
  std::memcpy(host.data(), descs.data(), descs.size() * sizeof(k::OptimizerTensor));
  std::memcpy(host.data() + desc_bytes, chunk_start.data(), chunk_start.size() * sizeof(int64_t));
  std::memcpy(host.data() + desc_bytes + start_bytes, chunk_tensor.data(), tensor_bytes);
  packed.desc_bytes = desc_bytes;
  packed.start_bytes = start_bytes;
  packed.num_chunks = static_cast<int64_t>(chunk_start.size());
  return packed;
}

}  // namespace

absl::Status ApplyOptimizerMultiTensor(const CudaContext& ctx, OptimizerKind kind,
                                       const OptimizerHyperparams& hp,
                                       const std::vector<TensorUpdate>& tensors) {
  const k::OptimizerArgs args = ResolveArgs(kind, hp);
  const PackedUpdate packed = Pack(tensors);
  if (packed.num_chunks == 0) return absl::OkStatus();
  const std::vector<char>& host = packed.host;
  const size_t total = host.size();
  const size_t desc_bytes = packed.desc_bytes, start_bytes = packed.start_bytes;
  STATUS_RETURN_IF_ERROR(EnsureWorkspace(ctx, total));
  char* device = static_cast<char*>(ctx.workspace);
  // From pageable memory the copy has read `host` when it returns.
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host.data(), total, cudaMemcpyHostToDevice, ctx.stream));
  return FromCuda(k::MultiTensorUpdate(
                      ctx.stream, args, reinterpret_cast<const k::OptimizerTensor*>(device),
                      reinterpret_cast<const int32_t*>(device + desc_bytes + start_bytes),
                      reinterpret_cast<const int64_t*>(device + desc_bytes), packed.num_chunks),
                  "MultiTensorUpdate");
}

absl::StatusOr<std::unique_ptr<MultiTensorPlan>> MultiTensorPlan::Create(
    const CudaContext& ctx, const std::vector<TensorUpdate>& tensors) {
  const PackedUpdate packed = Pack(tensors);
  std::unique_ptr<MultiTensorPlan> plan(new MultiTensorPlan());
  plan->desc_bytes_ = packed.desc_bytes;
  plan->start_bytes_ = packed.start_bytes;
  plan->num_chunks_ = packed.num_chunks;
  if (packed.num_chunks == 0) return plan;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx.device));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->device_, packed.host.size()));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(plan->device_, packed.host.data(), packed.host.size(), cudaMemcpyHostToDevice));
  return plan;
}

MultiTensorPlan::~MultiTensorPlan() {
  if (device_ != nullptr) cudaFree(device_);
}

absl::Status MultiTensorPlan::Apply(const CudaContext& ctx, OptimizerKind kind,
                                    const OptimizerHyperparams& hp) const {
  if (num_chunks_ == 0) return absl::OkStatus();
  const char* device = static_cast<const char*>(device_);
  return FromCuda(
      k::MultiTensorUpdate(ctx.stream, ResolveArgs(kind, hp),
                           reinterpret_cast<const k::OptimizerTensor*>(device),
                           reinterpret_cast<const int32_t*>(device + desc_bytes_ + start_bytes_),
                           reinterpret_cast<const int64_t*>(device + desc_bytes_), num_chunks_),
      "MultiTensorUpdate");
}

// ------------------------------------------------------------ instantiations

#define DOWNPOUR_CONVERT_TO(S, D) \
  template absl::Status Convert<S, D>(const CudaContext&, int64_t, const S*, D*);
#define DOWNPOUR_CONVERT_FROM(S)        \
  DOWNPOUR_CONVERT_TO(S, float)         \
  DOWNPOUR_CONVERT_TO(S, __nv_bfloat16) \
  DOWNPOUR_CONVERT_TO(S, __half)
DOWNPOUR_CONVERT_FROM(float)
DOWNPOUR_CONVERT_FROM(__nv_bfloat16)
DOWNPOUR_CONVERT_FROM(__half)
#undef DOWNPOUR_CONVERT_FROM
#undef DOWNPOUR_CONVERT_TO

#define DOWNPOUR_INSTANTIATE(T)                                                                   \
  template absl::Status DenseForward<T>(const CudaContext&, int64_t, int64_t, int64_t, const T*,  \
                                        const float*, const float*, T*);                          \
  template absl::Status DenseBackward<T>(const CudaContext&, int64_t, int64_t, int64_t, const T*, \
                                         const float*, const T*, T*, Write, float*, float*,       \
                                         Write);                                                  \
  template absl::Status ReluForward<T>(const CudaContext&, int64_t, const T*, T*);                \
  template absl::Status ReluBackward<T>(const CudaContext&, int64_t, const T*, const T*, T*,      \
                                        Write);                                                   \
  template absl::Status DropoutForward<T>(const CudaContext&, int64_t, float, uint64_t, uint64_t, \
                                          const T*, T*, uint8_t*);                                \
  template absl::Status DropoutBackward<T>(const CudaContext&, int64_t, float, const uint8_t*,    \
                                           const T*, T*, Write);                                  \
  template absl::Status SoftmaxCrossEntropyAsync<T>(const CudaContext&, int64_t, int64_t,         \
                                                    const T*, const int32_t*, T*, float, double*, \
                                                    unsigned long long*);                         \
  template absl::Status CopyOrAdd<T>(const CudaContext&, int64_t, const T*, T*, Write);           \
  template absl::Status Zero<T>(const CudaContext&, int64_t, T*);                                 \
  template absl::Status Add<T>(const CudaContext&, int64_t, const T*, const T*, T*);              \
  template absl::Status Conv2dForward<T>(const CudaContext&, const WindowShape&, const T*,        \
                                         const float*, const float*, T*, bool);                   \
  template absl::Status Conv2dBackward<T>(const CudaContext&, const WindowShape&, const T*,       \
                                          const float*, const T*, T*, Write, float*, float*,      \
                                          Write);                                                 \
  template absl::Status MaxPoolForward<T>(const CudaContext&, const WindowShape&, const T*, T*);  \
  template absl::Status MaxPoolBackward<T>(const CudaContext&, const WindowShape&, const T*,      \
                                           const T*, T*, Write);                                  \
  template absl::Status AvgPoolForward<T>(const CudaContext&, const WindowShape&, const T*, T*);  \
  template absl::Status AvgPoolBackward<T>(const CudaContext&, const WindowShape&, const T*, T*,  \
                                           Write);                                                \
  template absl::Status GlobalAvgPoolForward<T>(const CudaContext&, int64_t, int64_t, int64_t,    \
                                                const T*, T*);                                    \
  template absl::Status GlobalAvgPoolBackward<T>(const CudaContext&, int64_t, int64_t, int64_t,   \
                                                 const T*, T*, Write);                            \
  template absl::Status BatchNormForwardTraining<T>(const CudaContext&, int64_t, int64_t,         \
                                                    const T*, const float*, const float*, float,  \
                                                    float, T*, float*, float*, float*, float*);   \
  template absl::Status BatchNormForwardInference<T>(const CudaContext&, int64_t, int64_t,        \
                                                     const T*, const float*, const float*,        \
                                                     const float*, const float*, float, T*);      \
  template absl::Status BatchNormBackward<T>(const CudaContext&, int64_t, int64_t, const T*,      \
                                             const T*, const float*, const float*, const float*,  \
                                             T*, Write, float*, float*, Write);                   \
  template absl::Status EmbeddingForward<T>(const CudaContext&, int64_t, int64_t, int64_t,        \
                                            const float*, const float*, T*);                      \
  template absl::Status EmbeddingBackward<T>(const CudaContext&, int64_t, int64_t, int64_t,       \
                                             const float*, const T*, float*, Write);
DOWNPOUR_INSTANTIATE(float)
DOWNPOUR_INSTANTIATE(__nv_bfloat16)
DOWNPOUR_INSTANTIATE(__half)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
