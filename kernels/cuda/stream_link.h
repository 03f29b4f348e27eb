// The StreamLink of kernels/stream_link.h over CUDA backends: rank r's work
// is backend r's compute stream; copies are cudaMemcpyPeerAsync on the
// issuing rank's stream (over NVLink where peer access could be enabled,
// through the host otherwise), signals are events recorded on one stream
// and waited for by another (cudaStreamWaitEvent: the host never blocks).
//
// Thread safety and ownership as kernels/stream_link.h says.
#ifndef DOWNPOUR_KERNELS_CUDA_STREAM_LINK_H_
#define DOWNPOUR_KERNELS_CUDA_STREAM_LINK_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/stream_link.h"

namespace downpour {
namespace kernels {
namespace cuda {

// `signals_per_rank` events on each backend's device; peer access enabled
// between every pair of distinct devices that allows it (an error of the
// runtime otherwise). The calling thread's current device is left as it
// was. kernels/factory.h's CreateStreamLink checks the backends and calls
// this. REQUIRES: every backend is a CudaBackend (backend.h).
absl::StatusOr<std::unique_ptr<StreamLink>> CreateCudaStreamLink(
    const std::vector<ComputeBackend*>& backends, int signals_per_rank);

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_STREAM_LINK_H_
