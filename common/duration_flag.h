// Duration flags as operators write them: plain seconds ("90", "0"), Go-style
// ("36h", "10m30s"), or whole days ("7d"); never negative.
#ifndef DOWNPOUR_COMMON_DURATION_FLAG_H_
#define DOWNPOUR_COMMON_DURATION_FLAG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace downpour {

// The duration `text` of flag --`name`; InvalidArgument naming the flag and
// the forms it takes otherwise.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& name, const std::string& text);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_DURATION_FLAG_H_
