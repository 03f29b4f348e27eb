#include "ps/parameter_shard.h"

#include "common/status.h"

namespace downpour {

absl::StatusOr<PushResponse> ParameterShard::Push(const PushRequest& request) {
  Payload payload;
  payload.Append(request.payload().data(), request.payload().size());
  return Push(request, payload);
}

absl::StatusOr<PushPullResponse> ParameterShard::PushPull(const PushRequest& push,
                                                          const Payload& push_payload,
                                                          const PullRequest& pull,
                                                          absl::Time deadline,
                                                          Payload* pull_payload) {
  PushPullResponse response;
  ASSIGN_OR_RETURN(*response.mutable_push(), Push(push, push_payload));
  ASSIGN_OR_RETURN(*response.mutable_pull(), Pull(pull, deadline, pull_payload));
  return response;
}

absl::StatusOr<PullResponse> ParameterShard::Pull(const PullRequest& request, absl::Time deadline) {
  Payload payload;
  absl::StatusOr<PullResponse> response = Pull(request, deadline, &payload);
  if (response.ok()) response->set_payload(payload.ToString());
  return response;
}

}  // namespace downpour
