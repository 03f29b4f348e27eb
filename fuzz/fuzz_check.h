// FUZZ_CHECK: an invariant a fuzz target checks beyond "no crash" (e.g. a spec
// that passes validation also passes shape inference). A broken one prints
// the condition and the message and aborts, which libFuzzer reports as a
// crash with the input that caused it.
#ifndef DOWNPOUR_FUZZ_FUZZ_CHECK_H_
#define DOWNPOUR_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

#define FUZZ_CHECK(condition, ...)                                                               \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s: %s\n", __FILE__, __LINE__, #condition, \
                   ::absl::StrCat(__VA_ARGS__).c_str());                                         \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)

#endif  // DOWNPOUR_FUZZ_FUZZ_CHECK_H_
