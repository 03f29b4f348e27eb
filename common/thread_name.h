// NameThisThread: gives the calling thread a name that top -H, perf's
// `--sort comm`, gdb's `info threads` and /proc/<pid>/task/*/comm show
// (Linux keeps 15 characters; longer names are cut there).
#ifndef DOWNPOUR_COMMON_THREAD_NAME_H_
#define DOWNPOUR_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>

#include "absl/strings/string_view.h"

namespace downpour {

inline void NameThisThread(absl::string_view name) {
  if (name.empty()) return;
  const std::string cut(name.substr(0, 15));
  // A failure leaves the inherited name: nothing depends on it.
  (void)pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_THREAD_NAME_H_
