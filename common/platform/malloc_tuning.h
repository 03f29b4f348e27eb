// Process-wide allocator settings for the daemons that move tensor-sized
// buffers every step.
#ifndef DOWNPOUR_COMMON_PLATFORM_MALLOC_TUNING_H_
#define DOWNPOUR_COMMON_PLATFORM_MALLOC_TUNING_H_

namespace downpour {

// glibc returns every freed buffer over its mmap threshold to the kernel and
// faults a fresh one in on the next step; per-step message buffers of a few
// MiB then cost page faults on both ends of every exchange (about 10% of the
// shard's time in a 1 MiB push+pull profile). This keeps buffers up to
// 64 MiB in the heap and the heap's top up to 256 MiB untrimmed. Call once at
// the start of main.
void KeepTensorBuffersMapped();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_PLATFORM_MALLOC_TUNING_H_
