// The one policy by which a worker asks a job's shard again, shared by the
// dense exchange (worker/param_exchange.h) and the sparse one
// (worker/sparse_exchange.h), for pushes, pulls and both in one call.
//
// An error that passes is retried with the same request until the caller's
// give-up time: a timeout, a lost connection, a shard that does not host
// the job yet (it is restoring it, or the job is moving and this run will
// be cancelled), or one not yet told that this worker took its rank over
// (PermissionDenied; a worker whose rank went elsewhere gets it too, until
// it hears so and cancels). A push keeps its request id, so the shard
// applies it once however often it is sent. Any other error (a refused request, a
// divergence) fails at once. An attempt that failed well within its slice
// (refused at once) is followed by a pause that grows from 20 ms to 1 s, so
// an unreachable shard is not asked in a busy loop; one that waited its
// slice out (a pull waiting for other workers) is made again at once.
//
// Functions only; thread-safe.
#ifndef DOWNPOUR_WORKER_SHARD_RETRY_H_
#define DOWNPOUR_WORKER_SHARD_RETRY_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace downpour {

// Whether a shard's answer `status` is worth asking again.
bool IsRetryableShardError(const absl::Status& status);

// Calls attempt(deadline), deadline = min(give_up, now + slice), until it
// returns OK, an error that does not pass, or an error once give_up has
// passed; that error comes back annotated with `what` ("pulling from shard
// 2"); an Unavailable one (a connection lost) as DeadlineExceeded once
// give_up has passed. Before each attempt, cancelled() returning true ends
// the call with Cancelled("job ended"). An attempt that keeps its own
// deadline (a push: the shard client's) may ignore the one it is given.
absl::Status CallShardWithRetries(absl::string_view what, absl::Time give_up, absl::Duration slice,
                                  const std::function<bool()>& cancelled,
                                  const std::function<absl::Status(absl::Time deadline)>& attempt);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_SHARD_RETRY_H_
