#include "worker/shard_retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace downpour {

bool IsRetryableShardError(const absl::Status& status) {
  // NotFound: the shard does not host the job yet. PermissionDenied: the
  // shard has not yet heard that this worker took its rank over.
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status) ||
         absl::IsNotFound(status) || absl::IsPermissionDenied(status);
}

absl::Status CallShardWithRetries(absl::string_view what, absl::Time give_up, absl::Duration slice,
                                  const std::function<bool()>& cancelled,
                                  const std::function<absl::Status(absl::Time deadline)>& attempt) {
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    if (cancelled()) return absl::CancelledError("job ended");
    const absl::Time started = absl::Now();
    const absl::Status status = attempt(std::min(give_up, started + slice));
    if (status.ok()) return status;
    if (!IsRetryableShardError(status)) return Annotate(status, what);
    if (absl::Now() >= give_up) {
      // Out of time on a connection that failed (one the keepalive ended:
      // a frozen or cut-off shard): the deadline is what ended the call,
      // the connection's error why. A shard's own refusal (NotFound,
      // PermissionDenied) is said as it is.
      if (!absl::IsUnavailable(status)) return Annotate(status, what);
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": no answer before the deadline; the last: ", status.message()));
    }
    if (absl::Now() - started < slice / 2) {
      absl::SleepFor(std::min(pause, give_up - absl::Now()));
      pause = std::min(pause * 2, absl::Seconds(1));
    }
  }
}

}  // namespace downpour
