// Timestamped one-line log messages on stderr, prefixed with the program's
// name. Thread-safe.
#ifndef DOWNPOUR_COMMON_LOG_H_
#define DOWNPOUR_COMMON_LOG_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace downpour {

// Sets the prefix of every line (the daemon's name); call once in main.
void SetLogPrefix(const std::string& prefix);

void Log(absl::string_view message);

// Called with every message Log writes from now on (null: none), after it is
// written and outside the log's lock; it must not call Log itself. A node
// daemon uses it to forward its jobs' lines to the coordinator.
void SetLogObserver(std::function<void(absl::Time, absl::string_view)> observer);

// Prints "<prefix>: <message of status>" on stderr — one sentence, no stack
// trace — and returns 1, the exit status of a daemon that cannot start.
int ExitWithError(const absl::Status& status);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_LOG_H_
