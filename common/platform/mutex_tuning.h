// Abseil's Mutex, as Debian builds it (without NDEBUG), checks every lock
// against a process-wide graph of lock orders to find deadlocks: a global
// spin lock taken on each Mutex::Lock. In a daemon that takes mutexes on
// every request from many threads, that check is the hottest lock of all
// (16% of a shard's time in a click-model profile). The daemons turn it off
// at start; tests keep it on, so lock-order mistakes are still caught.
#ifndef DOWNPOUR_COMMON_PLATFORM_MUTEX_TUNING_H_
#define DOWNPOUR_COMMON_PLATFORM_MUTEX_TUNING_H_

namespace downpour {

// Call once at the start of main, before any thread starts.
void SkipMutexDeadlockDetection();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_PLATFORM_MUTEX_TUNING_H_
