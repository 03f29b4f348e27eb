#include "ps/memory_budget.h"

namespace downpour {

MemoryBudget::MemoryBudget(int64_t limit_bytes) : limit_(limit_bytes > 0 ? limit_bytes : 0) {}

bool MemoryBudget::TryReserve(int64_t bytes) {
  if (limit_ == 0) {
    used_.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  // Relaxed: the counter orders nothing else; holders publish their memory
  // under their own locks.
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - used) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

void MemoryBudget::Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

}  // namespace downpour
