// MemoryBudget: the byte budget of one parameter shard process (its
// --memory_limit flag), shared by everything the shard holds that grows with
// what workers send (sparse embedding tables' rows, ps/sparse_table.h). Holders
// reserve before they allocate and release what they free, so the budget's
// used() is what they hold; a refused reservation is where a holder evicts
// or fails with ResourceExhausted, instead of the process being killed for
// memory.
//
// Holders reserve in chunks (a slab block, an index), not per row: each call
// is one atomic read-modify-write.
//
// Thread-safety: thread-safe and lock-free (atomics only). Ownership: the
// shard's main owns the budget and passes a pointer down; it must outlive
// every holder.
#ifndef DOWNPOUR_PS_MEMORY_BUDGET_H_
#define DOWNPOUR_PS_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace downpour {

class MemoryBudget {
 public:
  // `limit_bytes` 0 (or less): no limit; used() still counts.
  explicit MemoryBudget(int64_t limit_bytes);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Reserves `bytes` and returns true, or returns false, reserving nothing
  // and counting a refusal, when used() + bytes would pass the limit.
  // REQUIRES: bytes >= 0.
  bool TryReserve(int64_t bytes);
  // Gives back `bytes` reserved before.
  // REQUIRES: bytes >= 0, and no more than this holder reserved.
  void Release(int64_t bytes);

  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }
  // The number of TryReserve calls that returned false.
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  const int64_t limit_;  // 0: unlimited.
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> refusals_{0};
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_MEMORY_BUDGET_H_
