// MemoryCap: the accounting behind BackendOptions::memory_limit. A backend
// takes each block it allocates from the cap before allocating it, and the
// block's DeviceMemory gives it back when freed (its release hook), so the
// cap sees what the backend holds at every moment. The limit is ours, not
// the device's: it makes a GPU behave as a smaller one, so that "this model
// does not fit one GPU" holds (and is tested) on a large card.
//
// Thread-safe (an atomic count): memory may be freed on any thread. Held by
// its backend (and by MemoryCaps, for backends that share it); every
// DeviceMemory it counted must be gone before it is.
#ifndef DOWNPOUR_KERNELS_MEMORY_CAP_H_
#define DOWNPOUR_KERNELS_MEMORY_CAP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"

namespace downpour {
namespace kernels {

class MemoryCap {
 public:
  // `limit` <= 0: no limit (blocks are still counted). `device` names the
  // device in errors ("cpu", "cuda:1").
  MemoryCap(int64_t limit, std::string device) : limit_(limit), device_(std::move(device)) {}
  MemoryCap(const MemoryCap&) = delete;
  MemoryCap& operator=(const MemoryCap&) = delete;

  // Counts `bytes` more, where `others` bytes are held outside the count (a
  // GPU's workspace and weight copies): OK, or ResourceExhausted (nothing
  // counted) when held + others + bytes would pass the limit, e.g.
  //   cuda:1: allocating 512.0 MiB would hold 8.3 GiB of device memory, over
  //   the limit of 8.0 GiB (--device_memory_limit); 7.8 GiB held
  absl::Status Take(size_t bytes, int64_t others);
  // Uncounts `bytes` (REQUIRES: taken before).
  void Give(size_t bytes) { held_.fetch_sub(static_cast<int64_t>(bytes)); }
  // DeviceMemory's release hook: `context` is the MemoryCap.
  static void Release(void* context, size_t bytes) {
    static_cast<MemoryCap*>(context)->Give(bytes);
  }
  // `memory` (just allocated, of a taken size) with the hook that gives its
  // bytes back when it is freed.
  DeviceMemory Track(void* ptr, size_t bytes, DeviceMemory::FreeFunction free) {
    return DeviceMemory(ptr, bytes, free, &MemoryCap::Release, this);
  }

  int64_t held() const { return held_.load(); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  const std::string device_;
  std::atomic<int64_t> held_{0};
};

// One cap per device, shared by every backend made with them
// (BackendOptions::shared_caps): the limit bounds what those backends hold
// together on each device. (What a GPU backend holds outside the count, its
// workspace and weight copies, is its own only.) Thread-safe.
class MemoryCaps {
 public:
  // `limit` <= 0: no limit (blocks are still counted).
  explicit MemoryCaps(int64_t limit) : limit_(limit) {}
  MemoryCaps(const MemoryCaps&) = delete;
  MemoryCaps& operator=(const MemoryCaps&) = delete;

  // The cap of `device` ("cpu", "cuda:1"), made at the first call.
  std::shared_ptr<MemoryCap> For(const std::string& device);
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<MemoryCap>> caps_ ABSL_GUARDED_BY(mu_);
};

// The cap a backend of `options` on `device` counts against: the shared
// caps' for the device, or one of its own with options.memory_limit.
std::shared_ptr<MemoryCap> CapFor(const BackendOptions& options, const std::string& device);

// "512.0 MiB", "8.3 GiB", "100 bytes".
std::string DescribeBytes(int64_t bytes);

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_MEMORY_CAP_H_
