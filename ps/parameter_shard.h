// ParameterShard: what workers ask of one shard of a job's parameters — push
// gradients, pull parameters. ParameterStore (ps/parameter_store.h)
// implements it in memory; rpc/ adapts it to gRPC (ParameterServerService)
// and back (RemoteParameterShard), so a caller cannot tell a local shard from
// a remote one and most tests need no sockets.
//
// Thread-safety: implementations are thread-safe. Tensor bytes travel beside
// the request and response messages as a Payload (common/payload.h).
#ifndef DOWNPOUR_PS_PARAMETER_SHARD_H_
#define DOWNPOUR_PS_PARAMETER_SHARD_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/payload.h"
#include "proto/parameter_server.pb.h"

namespace downpour {

class ParameterShard {
 public:
  virtual ~ParameterShard() = default;

  // Applies (or, in SYNC mode, accumulates) the gradients of `request`, whose
  // partitions' bytes are `payload`. A request whose request_id was applied
  // before answers duplicate = true and changes nothing.
  virtual absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) = 0;

  // Returns the requested partitions' headers (all of the job's partitions on
  // this shard when `keys` is empty) and sets `payload` to their bytes, once
  // each has version >= min_version and every worker has pushed >=
  // min_worker_steps steps; DeadlineExceeded, naming what it waited for, if
  // that has not happened by `deadline`.
  virtual absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                            Payload* payload) = 0;

  // Push(push, push_payload), then Pull(pull, deadline, pull_payload): one
  // network round trip for a remote shard. An error means the pull did not
  // complete; the push may or may not have been applied (retrying it with
  // the same request_id is safe). The default runs the two calls in turn.
  virtual absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push,
                                                    const Payload& push_payload,
                                                    const PullRequest& pull, absl::Time deadline,
                                                    Payload* pull_payload);

  // Ends the calls in flight at once (they return Cancelled) and fails later
  // ones the same way: for a caller that no longer wants the answers (a
  // worker's run that was cancelled, which would otherwise wait out a call
  // to a shard that is gone). Calls to an in-process store end on their own
  // deadlines: the default does nothing.
  virtual void CancelCalls() {}

  // Conveniences for in-process callers: the bytes in the messages' own
  // `payload` fields (never used on the wire).
  absl::StatusOr<PushResponse> Push(const PushRequest& request);
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline);
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_PARAMETER_SHARD_H_
