#include "common/duration_flag.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& name, const std::string& text) {
  double count = 0;
  if (absl::SimpleAtod(text, &count) && count >= 0) return absl::Seconds(count);
  if (absl::EndsWith(text, "d") && absl::SimpleAtod(text.substr(0, text.size() - 1), &count) &&
      count >= 0) {
    return absl::Hours(24 * count);
  }
  absl::Duration d;
  if (absl::ParseDuration(text, &d) && d >= absl::ZeroDuration()) return d;
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, "=", text, " is not a duration (e.g. 7d, 36h, 90s, or 0)"));
}

}  // namespace downpour
