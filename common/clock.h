// Wall and monotonic time in the units the wire and logs use.
#ifndef DOWNPOUR_COMMON_CLOCK_H_
#define DOWNPOUR_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace downpour {

// Milliseconds since the Unix epoch (timestamps stored in job state).
inline int64_t WallMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Seconds on a monotonic clock (durations and rates).
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_CLOCK_H_
