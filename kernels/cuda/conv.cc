// Convolutions through cuDNN with the plans of conv_plan.h: fp32 in NHWC or
// on NCHW copies, bf16/fp16 on the reduced tensors, or bf16/fp16 through the
// fp32 plan on converted copies (whichever the plan chose per direction).
// Each direction runs as conv_plan.h's Run* say: its graph plan, or the
// legacy algorithm in the math type it was measured in (FMA, or TF32 tensor
// ops where the context's Tf32Policy allowed them).
#include <cudnn.h>

#include <algorithm>
#include <memory>

#include "kernels/cuda/conv_plan.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/layers_internal.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace {

namespace k = internal;
using internal::Acc;
using internal::CheckType;
using internal::ConvertOn;
using internal::kIsFloat;
using internal::WeightsToReduced;

template <typename T>
absl::Status Conv2dForwardReduced(const CudaContext& ctx, const WindowShape& s, const ConvPlan& p,
                                  const T* x, const float* w, const float* bias, T* y, bool relu) {
  const ConvVariant& v = p.reduced;
  const size_t padded = p.padded ? p.in16_bytes : 0;
  const size_t scratch = padded + p.filter16_bytes;
  RETURN_IF_ERROR(EnsureWorkspace(ctx, scratch + v.fwd_bytes));
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
  RETURN_IF_ERROR(
      RunForward(ctx, v, input, *w16, y, base + scratch, ctx.workspace_bytes - scratch));
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
  RETURN_IF_ERROR(EnsureWorkspace(
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
  RETURN_IF_ERROR(
      RunBackwardFilter(ctx, v, input, dy, dw16, /*accumulate=*/false, free_space, free_bytes));
  RETURN_IF_ERROR(ConvertOn(ctx, filter_n, dw16, dw, nullptr, 1, Acc(param_write), false));
  if (dx == nullptr) return absl::OkStatus();
  absl::StatusOr<const T*> w16 = WeightsToReduced<T>(ctx, filter_n, w, w16_scratch);
  if (!w16.ok()) return w16.status();
  if (!p.padded) {
    return RunBackwardData(ctx, v, *w16, dy, dx, Acc(dx_write), free_space, free_bytes);
  }
  RETURN_IF_ERROR(
      RunBackwardData(ctx, v, *w16, dy, dx_padded, /*accumulate=*/false, free_space, free_bytes));
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
    RETURN_IF_ERROR(EnsureWorkspace(ctx, Aligned(bytes) + rest));
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
  RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  if (p.fwd_nchw) {
    const ConvVariant& v = p.nchw;
    const size_t scratch = NchwForwardScratch(p);
    RETURN_IF_ERROR(EnsureWorkspace(ctx, Fp32ForwardWorkspace(p)));
    char* base = static_cast<char*>(ctx.workspace);
    auto* xn = reinterpret_cast<float*>(base);
    auto* wn = reinterpret_cast<float*>(base + p.in_bytes);
    auto* yn = reinterpret_cast<float*>(base + p.in_bytes + p.filter_bytes);
    RETURN_IF_ERROR(ToNchwInput(ctx, s, p, x, xn));
    RETURN_IF_ERROR(ToNchwFilter(ctx, s, w, wn));
    RETURN_IF_ERROR(RunForward(ctx, v, xn, wn, yn, base + scratch, ctx.workspace_bytes - scratch));
    CUDA_RETURN_IF_ERROR(
        k::BatchedTranspose(ctx.stream, s.batch, s.out_c, s.out_h * s.out_w, yn, y, bias, false));
    return relu ? ReluInPlace(ctx, s.batch * s.out_elements(), y) : absl::OkStatus();
  }
  const ConvVariant& v = p.nhwc;
  RETURN_IF_ERROR(EnsureWorkspace(ctx, Fp32ForwardWorkspace(p)));
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
  RETURN_IF_ERROR(RunForward(ctx, v, input, w, y, free_space, free_bytes));
  if (bias != nullptr) {
    const float one = 1.f;
    CUDNN_RETURN_IF_ERROR(cudnnAddTensor(ctx.cudnn, &one, p.bias.d, bias, &one, v.y.d, y));
  }
  return relu ? ReluInPlace(ctx, s.batch * s.out_elements(), y) : absl::OkStatus();
}

absl::Status Conv2dBackwardFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                                const float* x, const float* w, const float* dy, float* dx,
                                Write dx_write, float* dw, float* dbias, Write param_write) {
  RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  RETURN_IF_ERROR(
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
    RETURN_IF_ERROR(ToNchwInput(ctx, s, p, x, xn));
    CUDA_RETURN_IF_ERROR(k::BatchedTranspose(ctx.stream, s.batch, s.out_h * s.out_w, s.out_c, dy,
                                             dyn, nullptr, false));
    RETURN_IF_ERROR(
        RunBackwardFilter(ctx, v, xn, dyn, dwn, /*accumulate=*/false, free_space, free_bytes));
    CUDA_RETURN_IF_ERROR(k::BatchedTranspose(ctx.stream, s.out_c, s.in_c, s.kernel_h * s.kernel_w,
                                             dwn, dw, nullptr, Acc(param_write)));
    if (dx == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(ToNchwFilter(ctx, s, w, wn));
    RETURN_IF_ERROR(
        RunBackwardData(ctx, v, wn, dyn, dxn, /*accumulate=*/false, free_space, free_bytes));
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
  RETURN_IF_ERROR(
      RunBackwardFilter(ctx, v, input, dy, dw, Acc(param_write), free_space, free_bytes));
  if (dx == nullptr) return absl::OkStatus();
  if (!p.padded) {
    return RunBackwardData(ctx, v, w, dy, dx, Acc(dx_write), free_space, free_bytes);
  }
  RETURN_IF_ERROR(
      RunBackwardData(ctx, v, w, dy, dpadded, /*accumulate=*/false, free_space, free_bytes));
  return FromCuda(
      k::CropImages<float>(ctx.stream, s, p.padded_h, p.padded_w, dpadded, dx, Acc(dx_write)),
      "CropImages");
}

// A reduced-precision convolution as the fp32 plan on converted copies
// (kept at the head of the workspace).
template <typename T>
absl::Status Conv2dForwardViaFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                                  const T* x, const float* w, const float* bias, T* y, bool relu) {
  RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
  const int64_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  const size_t x_bytes = Aligned(sizeof(float) * in_n);
  absl::StatusOr<std::unique_ptr<WorkspaceHead>> copies =
      WorkspaceHead::Take(ctx, x_bytes + sizeof(float) * out_n, Fp32ForwardWorkspace(p));
  if (!copies.ok()) return copies.status();
  auto* x32 = reinterpret_cast<float*>((*copies)->data());
  auto* y32 = reinterpret_cast<float*>((*copies)->data() + x_bytes);
  RETURN_IF_ERROR(ConvertOn(ctx, in_n, x, x32, nullptr, 1, false, false));
  RETURN_IF_ERROR(Conv2dForwardFp32(ctx, s, p, x32, w, bias, y32, false));
  return ConvertOn(ctx, out_n, y32, y, nullptr, 1, false, relu);
}

template <typename T>
absl::Status Conv2dBackwardViaFp32(const CudaContext& ctx, const WindowShape& s, ConvPlan& p,
                                   const T* x, const float* w, const T* dy, T* dx, Write dx_write,
                                   float* dw, float* dbias, Write param_write) {
  RETURN_IF_ERROR(ChooseLayouts(ctx, s, &p));
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
  RETURN_IF_ERROR(ConvertOn(ctx, in_n, x, x32, nullptr, 1, false, false));
  RETURN_IF_ERROR(ConvertOn(ctx, out_n, dy, dy32, nullptr, 1, false, false));
  RETURN_IF_ERROR(
      Conv2dBackwardFp32(ctx, s, p, x32, w, dy32, dx32, Write::kOverwrite, dw, dbias, param_write));
  if (dx == nullptr) return absl::OkStatus();
  return ConvertOn(ctx, in_n, dx32, dx, nullptr, 1, Acc(dx_write), false);
}

}  // namespace

template <typename T>
absl::Status Conv2dForward(const CudaContext& ctx, const WindowShape& s, const T* x, const float* w,
                           const float* bias, T* y, bool relu) {
  RETURN_IF_ERROR(CheckType<T>(ctx, "Conv2dForward"));
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
  RETURN_IF_ERROR(CheckType<T>(ctx, "Conv2dBackward"));
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

#define DOWNPOUR_INSTANTIATE(T)                                                              \
  template absl::Status Conv2dForward<T>(const CudaContext&, const WindowShape&, const T*,   \
                                         const float*, const float*, T*, bool);              \
  template absl::Status Conv2dBackward<T>(const CudaContext&, const WindowShape&, const T*,  \
                                          const float*, const T*, T*, Write, float*, float*, \
                                          Write);
DOWNPOUR_FOR_EACH_ACTIVATION_TYPE(DOWNPOUR_INSTANTIATE)
#undef DOWNPOUR_INSTANTIATE

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
