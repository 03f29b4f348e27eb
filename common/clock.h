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

// Splits a span of work into consecutive parts: each Add adds the seconds
// since the last Add (or since construction) to the part it is given.
class Laps {
 public:
  Laps() : last_(MonotonicSeconds()) {}
  void Add(double* part) {
    const double now = MonotonicSeconds();
    *part += now - last_;
    last_ = now;
  }

 private:
  double last_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_CLOCK_H_
