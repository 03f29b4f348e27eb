// StreamLink: ordered copies and signals between the work queues of
// several backends, so that a model split into pipeline stages
// (model/pipeline.h) hands activations and their gradients from device to
// device without the host waiting. Rank r is the r-th backend given to
// kernels/factory.h's CreateStreamLink.
//
// On GPUs each rank's work is its backend's compute stream: Copy queues a
// peer copy (NVLink or PCIe, peer access enabled where the devices allow
// it) on one rank's stream, Mark records an event on it and Wait makes
// another rank's stream wait for that event, all without blocking the
// host. On the CPU everything happens when called: a copy is a memcpy and
// signals are ordered by the callers' own threads.
//
// Thread safety: calls for distinct ranks may come from distinct threads
// (one thread per rank, each having made its backend current); a Wait must
// come after the Mark it waits for (the callers hand that over between
// their threads, e.g. under a mutex), else it waits for an earlier mark or
// none. Owns its events; the backends and buffers stay the caller's and
// must outlive it.
#ifndef DOWNPOUR_KERNELS_STREAM_LINK_H_
#define DOWNPOUR_KERNELS_STREAM_LINK_H_

#include <cstddef>

#include "absl/status/status.h"

namespace downpour {
namespace kernels {

class StreamLink {
 public:
  virtual ~StreamLink() = default;
  virtual int size() const = 0;
  // Queues on rank `on`'s work, after what it has queued so far, a copy of
  // `bytes` from `src` (memory of rank `src_rank`'s backend) to `dst`
  // (memory of rank `dst_rank`'s).
  // REQUIRES: ranks in [0, size()); the calling thread's current device is
  // rank `on`'s.
  virtual absl::Status Copy(int on, void* dst, int dst_rank, const void* src, int src_rank,
                            size_t bytes) = 0;
  // Marks signal `id` of rank `rank` where the work it has queued so far
  // ends (a later Mark of the same signal replaces this one for later
  // Waits). REQUIRES: 0 <= id < the signals per rank it was created with;
  // the calling thread's current device is rank `rank`'s.
  virtual absl::Status Mark(int rank, int id) = 0;
  // Work rank `rank` queues after this call waits until rank `from` has
  // reached its signal `id` as last marked.
  virtual absl::Status Wait(int rank, int from, int id) = 0;
};

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_STREAM_LINK_H_
