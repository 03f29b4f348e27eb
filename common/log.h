// Timestamped one-line log messages on stderr, prefixed with the program's
// name. Thread-safe.
#ifndef DOWNPOUR_COMMON_LOG_H_
#define DOWNPOUR_COMMON_LOG_H_

#include <string>

#include "absl/strings/string_view.h"

namespace downpour {

// Sets the prefix of every line (the daemon's name); call once in main.
void SetLogPrefix(const std::string& prefix);

void Log(absl::string_view message);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_LOG_H_
