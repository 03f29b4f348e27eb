// Monotonic time in the units logs and rates use.
#ifndef DOWNPOUR_COMMON_CLOCK_H_
#define DOWNPOUR_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace downpour {

// Seconds on a monotonic clock (durations and rates).
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_CLOCK_H_
