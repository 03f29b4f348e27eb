// Timestamped one-line log messages on stderr, prefixed with the program's
// name. Thread-safe.
#ifndef DOWNPOUR_COMMON_LOG_H_
#define DOWNPOUR_COMMON_LOG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace downpour {

// Sets the prefix of every line (the daemon's name); call once in main.
void SetLogPrefix(const std::string& prefix);

void Log(absl::string_view message);

// Prints "<prefix>: <message of status>" on stderr — one sentence, no stack
// trace — and returns 1, the exit status of a daemon that cannot start.
int ExitWithError(const absl::Status& status);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_LOG_H_
