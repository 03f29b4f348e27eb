#include "rpc/ps_service.h"

#include <algorithm>

#include "rpc/grpc_status.h"

namespace downpour {

ParameterServerService::ParameterServerService(ParameterShard* shard, Options options)
    : shard_(shard), options_(options) {}

grpc::Status ParameterServerService::Push(grpc::ServerContext* /*context*/,
                                          const PushRequest* request, PushResponse* response) {
  absl::StatusOr<PushResponse> result = shard_->Push(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Pull(grpc::ServerContext* context, const PullRequest* request,
                                          PullResponse* response) {
  const absl::Time now = absl::Now();
  absl::Time deadline =
      std::min(absl::FromChrono(context->deadline()), now + options_.max_pull_wait);
  // Give up a little before the caller does, so it gets the shard's sentence
  // saying what was missing rather than a bare "Deadline Exceeded".
  const absl::Duration margin = std::min(absl::Milliseconds(100), (deadline - now) / 10);
  if (margin > absl::ZeroDuration()) deadline -= margin;
  absl::StatusOr<PullResponse> result = shard_->Pull(*request, deadline);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace downpour
