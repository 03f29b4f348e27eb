#include "kernels/cuda/conv_plan.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/status.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = internal;

int AsInt(int64_t v) { return static_cast<int>(v); }

// The time of an algorithm cudnnFind did not measure (a heuristic choice):
// slower than any measured one.
constexpr float kUnmeasured = 1e9f;

// The math types of a variant: the one its descriptor is measured with, and
// those of the algorithms cudnnFind measured that it may keep. An algorithm
// then runs in the math type it was measured in (ConvVariant's *_math).
struct ConvMath {
  cudnnMathType_t descriptor;
  unsigned allowed;  // Bit m: math type m.
  bool Allows(cudnnMathType_t m) const { return (allowed >> static_cast<unsigned>(m)) & 1u; }
};

constexpr unsigned MathBit(cudnnMathType_t m) { return 1u << static_cast<unsigned>(m); }

// fp32 tensors. Strict: FMA kernels only, so results stay within fp32
// rounding of the CPU twin. TF32 allowed (PyTorch's cudnn.allow_tf32):
// default math on the descriptor, which permits TF32 tensor ops on sm_80 and
// later, and the fastest of what cudnnFind measured in default, tensor-op or
// FMA math; never CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which may round fp32
// inputs to fp16.
ConvMath Fp32Math(Tf32Policy tf32) {
  if (!Tf32Convolutions(tf32)) return {CUDNN_FMA_MATH, MathBit(CUDNN_FMA_MATH)};
  return {CUDNN_DEFAULT_MATH,
          MathBit(CUDNN_DEFAULT_MATH) | MathBit(CUDNN_TENSOR_OP_MATH) | MathBit(CUDNN_FMA_MATH)};
}

// bf16/fp16 tensors: tensor ops, and only algorithms measured in them (one
// measured in another math type had failed with CUDNN_STATUS_BAD_PARAM
// when run with these descriptors).
constexpr ConvMath kReducedMath = {CUDNN_TENSOR_OP_MATH, MathBit(CUDNN_TENSOR_OP_MATH)};

absl::Status MakeVariant(const WindowShape& s, cudnnTensorFormat_t format, int64_t in_h,
                         int64_t in_w, int64_t pad_h, int64_t pad_w, cudnnMathType_t math,
                         ConvVariant* v) {
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
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v->conv.d, math));
  v->fwd_math = v->bwd_filter_math = v->bwd_data_math = math;
  v->geometry = GeometryOf(s, format, CUDNN_DATA_FLOAT, in_h, in_w, pad_h, pad_w);
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
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v->conv.d, kReducedMath.descriptor));
  v->fwd_math = v->bwd_filter_math = v->bwd_data_math = kReducedMath.descriptor;
  v->geometry =
      GeometryOf(s, CUDNN_TENSOR_NHWC, type, p.conv_in_h, p.conv_in_w, p.conv_pad_h, p.conv_pad_w);
  return absl::OkStatus();
}

absl::Status MakePlan(const WindowShape& s, Tf32Policy tf32, ConvPlan* p) {
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
  const cudnnMathType_t math = Fp32Math(tf32).descriptor;
  RETURN_IF_ERROR(MakeVariant(s, CUDNN_TENSOR_NHWC, in_h, in_w, pad_h, pad_w, math, &p->nhwc));
  RETURN_IF_ERROR(MakeVariant(s, CUDNN_TENSOR_NCHW, in_h, in_w, pad_h, pad_w, math, &p->nchw));
  CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(p->bias.d, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                                   1, AsInt(s.out_c), 1, 1));
  return absl::OkStatus();
}

// Conv plan logging (SetConvPlanLogging).
std::atomic<bool> log_conv_plans{false};

template <typename Perf, typename Algo>
void LogPlan(const char* direction, const char* layout, const WindowShape& s, const Perf* perf,
             int returned, Algo chosen, cudnnMathType_t chosen_math) {
  if (!log_conv_plans.load()) return;
  std::fprintf(stderr,
               "conv %s %s n=%lld in=%lldx%lldx%lld out=%lldx%lldx%lld k=%lldx%lld stride=%lld: "
               "chose %d math %d;",
               direction, layout, static_cast<long long>(s.batch), static_cast<long long>(s.in_h),
               static_cast<long long>(s.in_w), static_cast<long long>(s.in_c),
               static_cast<long long>(s.out_h), static_cast<long long>(s.out_w),
               static_cast<long long>(s.out_c), static_cast<long long>(s.kernel_h),
               static_cast<long long>(s.kernel_w), static_cast<long long>(s.stride_h),
               static_cast<int>(chosen), static_cast<int>(chosen_math));
  for (int i = 0; i < returned; ++i) {
    std::fprintf(stderr, " [algo %d %.3f ms %zu B math %d status %d]",
                 static_cast<int>(perf[i].algo), perf[i].time, perf[i].memory,
                 static_cast<int>(perf[i].mathType), static_cast<int>(perf[i].status));
  }
  std::fprintf(stderr, "\n");
}

// PickAlgo: the fastest measured algorithm that succeeded, was measured in
// a math type `math` allows (cudnnFind also reports algorithms in others:
// FMA only for strict fp32, so no TF32; tensor ops for bf16/fp16) and fits
// in `free_bytes` (PickHeuristic: the first heuristic choice that fits
// otherwise).
// Algorithms measured within this fraction of the fastest count as ties
// (cudnnFind's times move more than that between calls); among ties the one
// with the least workspace wins, since every byte of it is device memory.
constexpr float kAlgoTimeTolerance = 1.05f;

template <typename Perf, typename Algo>
bool PickAlgo(const Perf* perf, int returned, size_t free_bytes, Algo* algo, size_t* bytes,
              int* index, const ConvMath& math) {
  auto eligible = [&](const Perf& p) {
    return p.status == CUDNN_STATUS_SUCCESS && p.memory <= free_bytes && math.Allows(p.mathType);
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

// Device bandwidth assumed when a layout change is weighed against a faster
// convolution: bytes read plus written per millisecond (2.5 TB/s, under the
// H100's and H200's measured copy rates).
constexpr double kTransposeBytesPerMs = 2.5e9;

double TransposeMs(size_t bytes) { return 2.0 * static_cast<double>(bytes) / kTransposeBytesPerMs; }

// One direction of FindAlgorithms: `find(count, &returned, perf)` is
// cudnnFind (which reports each algorithm in up to two math types, hence
// room for twice the algorithm count), `heuristic(count, &returned, perf)`
// cuDNN's heuristic list, `workspace(algo, &bytes)` an algorithm's
// workspace size (both with the descriptor's math type, which a heuristic
// choice then runs in).
template <int kCount, typename Perf, typename Algo, typename Find, typename Heuristic,
          typename Workspace>
absl::Status FindDirection(const char* direction, const char* layout, const WindowShape& s,
                           size_t limit, const ConvMath& math, Find find, Heuristic heuristic,
                           Workspace workspace, Algo* algo, size_t* bytes, float* ms,
                           cudnnMathType_t* algo_math) {
  Perf perf[2 * kCount];
  int returned = 0;
  CUDNN_RETURN_IF_ERROR(find(2 * kCount, &returned, perf));
  int chosen = -1;
  if (PickAlgo(perf, returned, limit, algo, bytes, &chosen, math)) {
    *ms = perf[chosen].time;
    *algo_math = perf[chosen].mathType;
  } else {
    CUDNN_RETURN_IF_ERROR(heuristic(kCount, &returned, perf));
    PickHeuristic(perf, returned, limit, algo);
    CUDNN_RETURN_IF_ERROR(workspace(*algo, bytes));
    *ms = kUnmeasured;
    *algo_math = math.descriptor;
  }
  LogPlan(direction, layout, s, perf, returned, *algo, *algo_math);
  return absl::OkStatus();
}

// The legacy calls of each direction, with v's algorithm and math type.
absl::Status LegacyForward(const CudaContext& ctx, const ConvVariant& v, const void* x,
                           const void* w, void* y, void* workspace, size_t workspace_bytes) {
  const float one = 1.f, zero = 0.f;
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v.conv.d, v.fwd_math));
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(ctx.cudnn, &one, v.x.d, x, v.w.d, w, v.conv.d,
                                                v.fwd_algo, workspace, workspace_bytes, &zero,
                                                v.y.d, y));
  return absl::OkStatus();
}

absl::Status LegacyBackwardFilter(const CudaContext& ctx, const ConvVariant& v, const void* x,
                                  const void* dy, void* dw, bool accumulate, void* workspace,
                                  size_t workspace_bytes) {
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v.conv.d, v.bwd_filter_math));
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(ctx.cudnn, &one, v.x.d, x, v.y.d, dy,
                                                       v.conv.d, v.bwd_filter_algo, workspace,
                                                       workspace_bytes, &beta, v.w.d, dw));
  return absl::OkStatus();
}

absl::Status LegacyBackwardData(const CudaContext& ctx, const ConvVariant& v, const void* w,
                                const void* dy, void* dx, bool accumulate, void* workspace,
                                size_t workspace_bytes) {
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(v.conv.d, v.bwd_data_math));
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(ctx.cudnn, &one, v.w.d, w, v.y.d, dy, v.conv.d,
                                                     v.bwd_data_algo, workspace, workspace_bytes,
                                                     &beta, v.x.d, dx));
  return absl::OkStatus();
}

// Device memory freed with the scope.
struct DeviceBuffer {
  void* p = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p != nullptr) cudaFree(p);
  }
  // A failure is returned and cleared from the device (the next launch's
  // check must not see it).
  absl::Status Allocate(const CudaContext& ctx, size_t bytes) {
    absl::Status status = FromCuda(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc");
    if (!status.ok()) p = nullptr;
    if (status.ok()) status = FromCuda(cudaMemsetAsync(p, 0, bytes, ctx.stream), "cudaMemsetAsync");
    if (!status.ok()) (void)cudaGetLastError();
    return status;
  }
};

// The most workspace graph engines are timed with (and so may keep), and
// the least worth timing them with.
constexpr size_t kMaxGraphWorkspace = size_t{512} << 20;
constexpr size_t kMinGraphWorkspace = size_t{16} << 20;

// One direction's choice between its legacy algorithm (`legacy`, timed on
// the scratch when its workspace fits `scratch_bytes`) and the fastest
// graph plan of `find(beta)`. The graph's plan is kept where faster: in
// graph[0], and in graph[1] its beta-1 twin where the direction
// `accumulates`. *bytes then covers both ways; *ms is the kept one's time.
void ChooseDirection(const CudaContext& ctx, const char* direction, const char* layout,
                     const WindowShape& s, size_t scratch_bytes,
                     const std::function<absl::Status()>& legacy,
                     const std::function<absl::StatusOr<std::unique_ptr<GraphConv>>(float)>& find,
                     bool accumulates, std::unique_ptr<GraphConv>* graph, size_t* bytes,
                     float* ms) {
  // The legacy algorithm's time: timed alike where its workspace fits the
  // scratch, else cudnnFind's own (kUnmeasured for a heuristic choice).
  float legacy_ms = *ms;
  if (*bytes <= scratch_bytes) {
    absl::StatusOr<float> timed = TimeOnStream(ctx, 3, legacy);
    if (timed.ok()) legacy_ms = *timed;
  }
  absl::StatusOr<std::unique_ptr<GraphConv>> best = find(0.f);
  // Faster, and by more than the legacy picker's tie margin where it needs
  // more workspace (every byte of which is device memory).
  const bool use_graph =
      best.ok() && (*best)->ms() < legacy_ms &&
      ((*best)->workspace_bytes() <= *bytes || (*best)->ms() * kAlgoTimeTolerance < legacy_ms);
  if (log_conv_plans.load()) {
    const std::string graph_text =
        best.ok() ? absl::StrFormat("engine %d %.3f ms %zu B", (*best)->engine(), (*best)->ms(),
                                    (*best)->workspace_bytes())
                  : std::string(best.status().message());
    std::fprintf(stderr,
                 "conv %s %s n=%lld in=%lldx%lldx%lld out=%lldx%lldx%lld k=%lld: legacy %.3f ms, "
                 "graph %s -> %s\n",
                 direction, layout, static_cast<long long>(s.batch), static_cast<long long>(s.in_h),
                 static_cast<long long>(s.in_w), static_cast<long long>(s.in_c),
                 static_cast<long long>(s.out_h), static_cast<long long>(s.out_w),
                 static_cast<long long>(s.out_c), static_cast<long long>(s.kernel_h),
                 legacy_ms == kUnmeasured ? -1.0 : legacy_ms, graph_text.c_str(),
                 use_graph ? "graph" : "legacy");
  }
  if (!use_graph) {
    if (legacy_ms != kUnmeasured) *ms = legacy_ms;
    return;
  }
  *ms = (*best)->ms();
  *bytes = std::max(*bytes, (*best)->workspace_bytes());
  graph[0] = *std::move(best);
  if (!accumulates) return;
  absl::StatusOr<std::unique_ptr<GraphConv>> twin = find(1.f);
  if (!twin.ok()) return;
  *bytes = std::max(*bytes, (*twin)->workspace_bytes());
  graph[1] = *std::move(twin);
}

// Times v's legacy algorithms and the graph API's engines on buffers of its
// shape and keeps, per direction, a graph plan where one is faster. Leaves
// the legacy choice where the buffers cannot be had.
absl::Status TuneGraphs(const CudaContext& ctx, const WindowShape& s, const char* layout,
                        size_t limit, const ConvMath& math, ConvVariant* v) {
  const ConvGeometry& g = v->geometry;
  DeviceBuffer x, w, y, workspace;
  RETURN_IF_ERROR(x.Allocate(ctx, g.InputBytes()));
  RETURN_IF_ERROR(w.Allocate(ctx, g.FilterBytes()));
  RETURN_IF_ERROR(y.Allocate(ctx, g.OutputBytes()));
  size_t bytes = std::min(limit, kMaxGraphWorkspace);
  while (cudaMalloc(&workspace.p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    workspace.p = nullptr;
    bytes /= 2;
    if (bytes < kMinGraphWorkspace) {
      return absl::ResourceExhaustedError("no device memory to time convolution engines in");
    }
  }
  const ConvScratch scratch = {x.p, w.p, y.p, workspace.p, bytes};
  const bool tensor_cores = math.descriptor != CUDNN_FMA_MATH;
  auto find = [&](ConvDirection direction) {
    return [&ctx, &g, &scratch, tensor_cores, direction](float beta) {
      return GraphConv::Find(ctx, g, direction, beta, tensor_cores, scratch);
    };
  };
  ChooseDirection(
      ctx, "forward", layout, s, bytes,
      [&] { return LegacyForward(ctx, *v, x.p, w.p, y.p, workspace.p, bytes); },
      find(ConvDirection::kForward), /*accumulates=*/false, &v->fwd_graph, &v->fwd_bytes,
      &v->fwd_ms);
  ChooseDirection(
      ctx, "backward-filter", layout, s, bytes,
      [&] { return LegacyBackwardFilter(ctx, *v, x.p, y.p, w.p, false, workspace.p, bytes); },
      find(ConvDirection::kBackwardFilter), /*accumulates=*/true, v->bwd_filter_graph,
      &v->bwd_filter_bytes, &v->bwd_filter_ms);
  ChooseDirection(
      ctx, "backward-data", layout, s, bytes,
      [&] { return LegacyBackwardData(ctx, *v, w.p, y.p, x.p, false, workspace.p, bytes); },
      find(ConvDirection::kBackwardData), /*accumulates=*/true, v->bwd_data_graph,
      &v->bwd_data_bytes, &v->bwd_data_ms);
  // Whatever failed on the way was cleared; what was queued has run.
  (void)cudaGetLastError();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  return absl::OkStatus();
}

// Measures the algorithms of all three directions of `v` (cudnnFind, as
// PyTorch's cudnn.benchmark) with math.descriptor on its descriptor, and
// keeps the fastest in a math type `math` allows that fits `limit` bytes of
// workspace, or the first heuristic choice that fits.
absl::Status FindAlgorithms(const CudaContext& ctx, const WindowShape& s, const char* layout,
                            size_t limit, ConvVariant* v, const ConvMath& math) {
  cudnnHandle_t h = ctx.cudnn;
  const cudnnTensorDescriptor_t x = v->x.d, y = v->y.d;
  const cudnnFilterDescriptor_t w = v->w.d;
  const cudnnConvolutionDescriptor_t c = v->conv.d;
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(c, math.descriptor));
  RETURN_IF_ERROR((FindDirection<CUDNN_CONVOLUTION_FWD_ALGO_COUNT, cudnnConvolutionFwdAlgoPerf_t>(
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
      &v->fwd_algo, &v->fwd_bytes, &v->fwd_ms, &v->fwd_math)));
  RETURN_IF_ERROR(
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
          &v->bwd_filter_algo, &v->bwd_filter_bytes, &v->bwd_filter_ms, &v->bwd_filter_math)));
  RETURN_IF_ERROR(
      (FindDirection<CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, cudnnConvolutionBwdDataAlgoPerf_t>(
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
          &v->bwd_data_algo, &v->bwd_data_bytes, &v->bwd_data_ms, &v->bwd_data_math)));
  // fp16 tensors stay on the legacy algorithms: with graph engines, one of
  // three GPU runs of model_gpu_test's fp16 check had a step whose filter
  // gradients were 25% off fp32's (bf16 and fp32 held in all three).
  if (!ctx.conv_graph || v->geometry.type == CUDNN_DATA_HALF) return absl::OkStatus();
  const absl::Status tuned = TuneGraphs(ctx, s, layout, limit, math, v);
  if (!tuned.ok() && log_conv_plans.load()) {
    std::fprintf(stderr, "conv %s: graph engines not timed: %s\n", layout,
                 std::string(tuned.message()).c_str());
  }
  return absl::OkStatus();
}

// The most the fp32 copies of a reduced convolution's tensors and the fp32
// plan's workspace may take where that plan is merely faster (not where it
// is the only one).
constexpr int64_t kMaxStagingBytes = int64_t{64} << 20;

}  // namespace

// Every plan of a context, by shape, precision and TF32 policy.
struct ConvPlanCache {
  std::map<std::array<int64_t, 16>, std::unique_ptr<ConvPlan>> plans;
};

ConvGeometry GeometryOf(const WindowShape& s, cudnnTensorFormat_t format, cudnnDataType_t type,
                        int64_t in_h, int64_t in_w, int64_t pad_h, int64_t pad_w) {
  ConvGeometry g;
  g.n = s.batch;
  g.c = s.in_c;
  g.h = in_h;
  g.w = in_w;
  g.k = s.out_c;
  g.r = s.kernel_h;
  g.s = s.kernel_w;
  g.out_h = s.out_h;
  g.out_w = s.out_w;
  g.pad_h = pad_h;
  g.pad_w = pad_w;
  g.stride_h = s.stride_h;
  g.stride_w = s.stride_w;
  g.format = format;
  g.type = type;
  return g;
}

void SetConvPlanLogging(bool on) { log_conv_plans.store(on); }

namespace {

// `graph` where there is one and the workspace and the pointers suit it (in
// GraphConv::Run's order), else the legacy call (a template: this runs per
// convolution per step, and a std::function could allocate).
template <typename Legacy>
absl::Status GraphOrLegacy(const CudaContext& ctx, const GraphConv* graph, const void* in,
                           const void* filter, const void* out, void* workspace,
                           size_t workspace_bytes, const Legacy& legacy) {
  if (graph != nullptr && graph->workspace_bytes() <= workspace_bytes &&
      GraphConv::Aligned(in, filter, out)) {
    return graph->Run(ctx, in, filter, out, workspace);
  }
  return legacy();
}

}  // namespace

absl::Status RunForward(const CudaContext& ctx, const ConvVariant& v, const void* x, const void* w,
                        void* y, void* workspace, size_t workspace_bytes) {
  return GraphOrLegacy(ctx, v.fwd_graph.get(), x, w, y, workspace, workspace_bytes,
                       [&] { return LegacyForward(ctx, v, x, w, y, workspace, workspace_bytes); });
}

absl::Status RunBackwardFilter(const CudaContext& ctx, const ConvVariant& v, const void* x,
                               const void* dy, void* dw, bool accumulate, void* workspace,
                               size_t workspace_bytes) {
  return GraphOrLegacy(ctx, v.bwd_filter_graph[accumulate ? 1 : 0].get(), x, dw, dy, workspace,
                       workspace_bytes, [&] {
                         return LegacyBackwardFilter(ctx, v, x, dy, dw, accumulate, workspace,
                                                     workspace_bytes);
                       });
}

absl::Status RunBackwardData(const CudaContext& ctx, const ConvVariant& v, const void* w,
                             const void* dy, void* dx, bool accumulate, void* workspace,
                             size_t workspace_bytes) {
  return GraphOrLegacy(
      ctx, v.bwd_data_graph[accumulate ? 1 : 0].get(), dx, w, dy, workspace, workspace_bytes, [&] {
        return LegacyBackwardData(ctx, v, w, dy, dx, accumulate, workspace, workspace_bytes);
      });
}

absl::StatusOr<ConvPlan*> PlanFor(const CudaContext& ctx, const WindowShape& s) {
  if (ctx.conv_plans == nullptr) ctx.conv_plans = std::make_shared<ConvPlanCache>();
  const std::array<int64_t, 16> key = {s.batch,
                                       s.in_h,
                                       s.in_w,
                                       s.in_c,
                                       s.out_h,
                                       s.out_w,
                                       s.out_c,
                                       s.kernel_h,
                                       s.kernel_w,
                                       s.stride_h,
                                       s.stride_w,
                                       s.pad_top,
                                       s.pad_left,
                                       static_cast<int64_t>(ctx.compute),
                                       static_cast<int64_t>(ctx.tf32),
                                       static_cast<int64_t>(ctx.conv_graph)};
  auto it = ctx.conv_plans->plans.find(key);
  if (it != ctx.conv_plans->plans.end()) return it->second.get();
  auto plan = std::make_unique<ConvPlan>();
  RETURN_IF_ERROR(MakePlan(s, ctx.tf32, plan.get()));
  ConvPlan* raw = plan.get();
  ctx.conv_plans->plans.emplace(key, std::move(plan));
  return raw;
}

size_t NchwForwardScratch(const ConvPlan& p) { return p.in_bytes + p.filter_bytes + p.out_bytes; }
size_t NchwBackwardScratch(const ConvPlan& p) {
  return 2 * p.in_bytes + p.out_bytes + 2 * p.filter_bytes;
}

size_t BiasScratch(const WindowShape& s) {
  return Aligned(sizeof(float) * k::ColumnPartialsElements(s.batch * s.out_h * s.out_w, s.out_c));
}

size_t Fp32ForwardWorkspace(const ConvPlan& p) {
  return p.fwd_nchw ? NchwForwardScratch(p) + p.nchw.fwd_bytes : p.padded_bytes + p.nhwc.fwd_bytes;
}
size_t Fp32BackwardWorkspace(const WindowShape& s, const ConvPlan& p, bool dx, bool dbias) {
  const ConvVariant& v = p.bwd_nchw ? p.nchw : p.nhwc;
  const size_t cudnn = std::max(
      {v.bwd_filter_bytes, dx ? v.bwd_data_bytes : size_t{0}, dbias ? BiasScratch(s) : size_t{0}});
  return (p.bwd_nchw ? NchwBackwardScratch(p) : 2 * p.padded_bytes) + cudnn;
}

absl::Status ChooseLayouts(const CudaContext& ctx, const WindowShape& s, ConvPlan* p) {
  if (p->chosen) return absl::OkStatus();
  const bool measure_nhwc = ctx.conv_layout != ConvLayout::kNchw;
  const bool measure_nchw = ctx.conv_layout != ConvLayout::kNhwc;
  const ConvMath math = Fp32Math(ctx.tf32);
  if (measure_nhwc) {
    RETURN_IF_ERROR(
        FindAlgorithms(ctx, s, "nhwc", kMaxWorkspaceBytes - 2 * p->padded_bytes, &p->nhwc, math));
  }
  if (measure_nchw) {
    RETURN_IF_ERROR(FindAlgorithms(ctx, s, "nchw", kMaxWorkspaceBytes - NchwBackwardScratch(*p),
                                   &p->nchw, math));
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

size_t ReducedBackwardScratch(const ConvPlan& p) {
  return 2 * (p.padded ? p.in16_bytes : 0) + 2 * p.filter16_bytes;
}

void ChooseReduced(const CudaContext& ctx, const WindowShape& s, ConvPlan* p) {
  if (p->reduced_chosen) return;
  p->reduced_chosen = true;
  p->in16_bytes = Reduced16Bytes(s.batch * p->conv_in_h * p->conv_in_w * s.in_c);
  p->filter16_bytes = Reduced16Bytes(s.out_c * s.patch_elements());
  absl::Status st = MakeReducedVariant(s, ReducedCudnnType(ctx.compute), *p, &p->reduced);
  if (st.ok()) {
    st = FindAlgorithms(ctx, s, "reduced", kMaxWorkspaceBytes - ReducedBackwardScratch(*p),
                        &p->reduced, kReducedMath);
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

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
