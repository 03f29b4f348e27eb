// Process-wide allocator settings for the daemons that move tensor-sized
// buffers every step, and the hand-back of a job's memory once it is freed.
// Thread-safe (glibc's malloc is; ReleaseMemoryFreedBy serialises its
// callers).
#ifndef DOWNPOUR_COMMON_PLATFORM_MALLOC_TUNING_H_
#define DOWNPOUR_COMMON_PLATFORM_MALLOC_TUNING_H_

#include <functional>

namespace downpour {

// glibc returns every freed buffer over its mmap threshold to the kernel and
// faults a fresh one in on the next step; per-step message buffers of a few
// MiB then cost page faults on both ends of every exchange (about 10% of the
// shard's time in a 1 MiB push+pull profile). This keeps buffers up to
// 64 MiB in the heap and the heap's top up to 256 MiB untrimmed. Call once at
// the start of main.
void KeepTensorBuffersMapped();

// glibc gives threads up to 8 malloc arenas per core, and each arena keeps
// what its threads freed for reuse by its threads only: a daemon whose
// threads come and go with every job (trainers, exchange pools, readers, a
// shard's waiters) ends up holding a job's peak once per arena. Bounding the
// arenas to max(4, cores / 4) bounds that (bench/soak.py); contention stays
// low because small blocks come from each thread's cache and a step
// allocates few large ones. Call once at the start of main, before any
// thread starts.
void LimitMallocArenas();

// Runs `free_memory`, code that frees what a job held (its model, batches
// and buffers, its partitions), then hands the freed memory back to the
// kernel. glibc trims a heap's top only inside free() and only past the
// trim threshold above (more than a thread arena's heap can hold), and
// malloc_trim returns the free pages inside every arena but never a thread
// arena's top, where a job's memory ends up once it is all freed: so the
// threshold is lowered while `free_memory` runs (frees of other threads
// meanwhile trim too, costing them a few page faults once), then restored,
// then malloc_trim returns the rest. Takes milliseconds.
// REQUIRES: KeepTensorBuffersMapped was called (its threshold is restored).
void ReleaseMemoryFreedBy(const std::function<void()>& free_memory);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_PLATFORM_MALLOC_TUNING_H_
