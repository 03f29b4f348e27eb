// SplitMix64: a counter-based generator (element i needs no state), so a
// value drawn from (seed, i) is the same on every backend and whatever order
// the elements are drawn in. Parameter initialisation (spec/params) and
// dropout masks (kernels/types.h) draw from it. Pure; thread-safe.
#ifndef DOWNPOUR_COMMON_SPLITMIX64_H_
#define DOWNPOUR_COMMON_SPLITMIX64_H_

#include <cstdint>

#include "common/host_device.h"

namespace downpour {

DOWNPOUR_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SPLITMIX64_H_
