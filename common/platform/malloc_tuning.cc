#include "common/platform/malloc_tuning.h"

#include <malloc.h>

#include <algorithm>
#include <mutex>
#include <thread>

namespace downpour {
namespace {

constexpr int kMmapThreshold = 64 << 20;
constexpr int kTrimThreshold = 256 << 20;

}  // namespace

void KeepTensorBuffersMapped() {
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
}

void LimitMallocArenas() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  mallopt(M_ARENA_MAX, std::max(4, cores / 4));
}

void ReleaseMemoryFreedBy(const std::function<void()>& free_memory) {
  // One caller at a time, so the threshold is restored after the last.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  // 0: a free that reaches a heap's top trims it down to M_TOP_PAD.
  mallopt(M_TRIM_THRESHOLD, 0);
  free_memory();
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
  malloc_trim(0);
}

}  // namespace downpour
