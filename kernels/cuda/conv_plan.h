// Convolution plans: for one WindowShape and precision, the cuDNN
// descriptors and the algorithms of each direction, measured once with
// cudnnFind (as PyTorch's cudnn.benchmark) and cached in the context (see
// CudaContext), so later convolutions of that shape only run (conv.cc).
//
// fp32 plans measure NHWC straight on the tensors and NCHW on copies
// transposed in the workspace, and keep the faster per direction, transposes
// included: cuDNN 9's fp32 (FMA) kernels for NHWC are few and slow (VGG:
// 25-50x the NCHW ones). Where the context's Tf32Policy allows convolutions,
// fp32 descriptors take cuDNN's default math (TF32 tensor ops permitted) and
// the fastest algorithm is kept whether cudnnFind measured it with tensor
// ops or FMA (as PyTorch with cudnn.allow_tf32); otherwise FMA only.
// bf16/fp16 plans add a tensor-op NHWC variant on the reduced tensors and
// keep, per direction, it or the fp32 plan on converted copies, whichever
// measured faster where those copies are small.
//
// Thread safety: as the context (one host thread at a time); the plan
// logging switch is process-wide and thread-safe. Ownership: the context
// owns its plans; a plan owns its descriptors.
#ifndef DOWNPOUR_KERNELS_CUDA_CONV_PLAN_H_
#define DOWNPOUR_KERNELS_CUDA_CONV_PLAN_H_

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/conv_graph.h"
#include "kernels/types.h"

namespace downpour {
namespace kernels {
namespace cuda {

// Diagnostics: when on, every convolution plan prints its measured
// algorithms (algo, ms, workspace bytes, math type, status) and its choice
// to stderr the first time a shape is seen. Process-wide; off by default.
void SetConvPlanLogging(bool on);

// Owners of cuDNN descriptors, destroyed with the scope.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { cudnnCreateTensorDescriptor(&d); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { cudnnCreateFilterDescriptor(&d); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { cudnnCreateConvolutionDescriptor(&d); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// Descriptors and chosen algorithms of one convolution in one memory layout.
struct ConvVariant {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnConvolutionFwdAlgo_t fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  size_t fwd_bytes = 0, bwd_filter_bytes = 0, bwd_data_bytes = 0;
  // Measured by cudnnFind; kUnmeasured (conv_plan.cc) when only a heuristic
  // choice fitted.
  float fwd_ms = 0, bwd_filter_ms = 0, bwd_data_ms = 0;
  // The math type each chosen algorithm was measured in (cudnnFind reports
  // an algorithm once per math type it ran it in; a heuristic choice takes
  // the descriptor's). cuDNN selects the kernel by algorithm and math type,
  // so a direction sets its own on `conv` before it runs (Run*).
  cudnnMathType_t fwd_math = CUDNN_FMA_MATH, bwd_filter_math = CUDNN_FMA_MATH,
                  bwd_data_math = CUDNN_FMA_MATH;
  // What the descriptors describe, for the graph API.
  ConvGeometry geometry;
  // Where the context allows the graph API (CudaContext::conv_graph) and a
  // graph plan timed faster than the legacy algorithm: the plan of each
  // direction, indexed by beta (0: overwrite, 1: accumulate; the forward
  // only overwrites). The *_bytes above then cover both ways and *_ms is
  // the faster one's time, both timed alike (conv_graph.h TimeOnStream).
  std::unique_ptr<GraphConv> fwd_graph, bwd_filter_graph[2], bwd_data_graph[2];
};

// What cuDNN convolves for `s`: an input of in_h x in_w (padded plans: the
// padded copy's) with symmetric padding pad_h, pad_w, in `format` and `type`.
ConvGeometry GeometryOf(const WindowShape& s, cudnnTensorFormat_t format, cudnnDataType_t type,
                        int64_t in_h, int64_t in_w, int64_t pad_h, int64_t pad_w);

// One direction of `v` on ctx's stream: its graph plan where it has one and
// the pointers suit it, else the legacy call with the algorithm and math
// type measured. `workspace` holds `workspace_bytes` (at least the
// direction's *_bytes). Alpha is 1; `accumulate` adds to the output.
absl::Status RunForward(const CudaContext& ctx, const ConvVariant& v, const void* x, const void* w,
                        void* y, void* workspace, size_t workspace_bytes);
absl::Status RunBackwardFilter(const CudaContext& ctx, const ConvVariant& v, const void* x,
                               const void* dy, void* dw, bool accumulate, void* workspace,
                               size_t workspace_bytes);
absl::Status RunBackwardData(const CudaContext& ctx, const ConvVariant& v, const void* w,
                             const void* dy, void* dx, bool accumulate, void* workspace,
                             size_t workspace_bytes);

// Everything cuDNN needs for one convolution of `s`, in both layouts: NHWC
// straight on the tensors, or NCHW on copies transposed in the workspace.
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

// The cached plan of `s` in ctx's precision and TF32 policy (descriptors
// made on first use; no algorithm chosen yet).
absl::StatusOr<ConvPlan*> PlanFor(const CudaContext& ctx, const WindowShape& s);

// Measures both layouts the first time `s` is seen and picks one for the
// forward and one for the backward (or takes ctx.conv_layout's).
absl::Status ChooseLayouts(const CudaContext& ctx, const WindowShape& s, ConvPlan* p);

// bf16/fp16 contexts: the tensor-op NHWC variant on the reduced tensors
// (padded plans convolve a padded copy), measured the first time `s` is
// seen. A shape cuDNN cannot run reduced (reduced_ok false) runs the fp32
// plan on converted copies.
void ChooseReduced(const CudaContext& ctx, const WindowShape& s, ConvPlan* p);

// The scratch the NCHW path keeps beside cuDNN's own workspace.
size_t NchwForwardScratch(const ConvPlan& p);
size_t NchwBackwardScratch(const ConvPlan& p);

// Column-sum partials (dbias) share cuDNN's part of the workspace: they are
// consumed before the convolution that follows them on the stream.
size_t BiasScratch(const WindowShape& s);

// The workspace the fp32 plan's forward / backward asks for.
size_t Fp32ForwardWorkspace(const ConvPlan& p);
size_t Fp32BackwardWorkspace(const WindowShape& s, const ConvPlan& p, bool dx, bool dbias);

// The reduced backward's scratch before cuDNN's workspace: the padded input
// and its gradient (padded plans), the filter gradient, and room for a
// filter copy.
size_t ReducedBackwardScratch(const ConvPlan& p);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_CONV_PLAN_H_
