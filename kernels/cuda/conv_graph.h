// One direction of a convolution through cuDNN's graph (backend) API: a
// one-operation graph, and the execution plan chosen among the engine
// configurations cuDNN's heuristics list for it, each timed on the device
// (as PyTorch's cudnn.benchmark does through cudnn-frontend). The legacy
// cudnnFind* API (conv_plan.h) reaches only the engines behind its algorithm
// enums; on sm_90 the graph API's list holds faster ones (ResNet-18's NHWC
// TF32 weight gradients: 3x).
//
// Engines are filtered by what the caller's math allows: never one that
// down-converts fp32 inputs or reduces in reduced precision, and no tensor
// cores for strict fp32 (a TF32 result would leave the CPU twin's
// tolerance). The plan's alpha is 1 and its beta fixed (0: overwrite, 1:
// accumulate), as cuDNN bakes both into the operation.
//
// Thread safety: as the context that runs it. Ownership: a GraphConv owns
// its descriptors.
#ifndef DOWNPOUR_KERNELS_CUDA_CONV_GRAPH_H_
#define DOWNPOUR_KERNELS_CUDA_CONV_GRAPH_H_

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/context.h"

namespace downpour {
namespace kernels {
namespace cuda {

enum class ConvDirection { kForward, kBackwardFilter, kBackwardData };

// What cuDNN convolves: an input of n x c x h x w in `format`, a filter of
// k x c x r x s in the same format, an output of n x k x out_h x out_w,
// symmetric padding, unit dilation, in `type` with float accumulation.
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t k = 0, r = 0, s = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NHWC;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  // Bytes of the input, filter and output.
  size_t InputBytes() const;
  size_t FilterBytes() const;
  size_t OutputBytes() const;
};

// Buffers a convolution is timed on (the caller's; contents are overwritten).
struct ConvScratch {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

class GraphConv {
 public:
  // Builds the graph of `direction` over `g` with beta (0 or 1), times
  // every engine configuration the heuristics give that `tensor_cores`
  // allows and that needs at most scratch.workspace_bytes, on ctx's stream
  // with `scratch`'s buffers, and keeps the fastest. NotFound when no
  // configuration qualifies.
  static absl::StatusOr<std::unique_ptr<GraphConv>> Find(const CudaContext& ctx,
                                                         const ConvGeometry& g,
                                                         ConvDirection direction, float beta,
                                                         bool tensor_cores,
                                                         const ConvScratch& scratch);
  ~GraphConv();
  GraphConv(const GraphConv&) = delete;
  GraphConv& operator=(const GraphConv&) = delete;

  // Runs the plan on ctx's stream. In the forward, `in` is x, `filter` w and
  // `out` y; backward filter: `in` x, `filter` dw (written), `out` dy;
  // backward data: `in` dx (written), `filter` w, `out` dy. Needs
  // workspace_bytes() of `workspace`. FailedPrecondition when a pointer is
  // not aligned as the plan assumes (the caller then runs another way).
  absl::Status Run(const CudaContext& ctx, const void* in, const void* filter, const void* out,
                   void* workspace) const;

  // Whether every pointer meets the alignment the plan was built for.
  static bool Aligned(const void* in, const void* filter, const void* out);

  size_t workspace_bytes() const { return workspace_bytes_; }
  // The median of its timed runs.
  float ms() const { return ms_; }
  // cuDNN's global index of the chosen engine (for logs).
  int64_t engine() const { return engine_; }
  // Whether cuDNN notes the chosen engine as using tensor cores (never
  // where Find's `tensor_cores` was false).
  bool tensor_cores() const { return tensor_cores_; }

 private:
  GraphConv() = default;
  cudnnBackendDescriptor_t plan_ = nullptr;
  size_t workspace_bytes_ = 0;
  float ms_ = 0;
  int64_t engine_ = -1;
  bool tensor_cores_ = false;
};

// Median milliseconds of `runs` calls of `run` on ctx's stream after one
// untimed call; an error if any call fails.
absl::StatusOr<float> TimeOnStream(const CudaContext& ctx, int runs,
                                   const std::function<absl::Status()>& run);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_CONV_GRAPH_H_
