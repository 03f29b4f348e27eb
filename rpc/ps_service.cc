#include "rpc/ps_service.h"

#include <algorithm>

#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "rpc/grpc_status.h"

namespace downpour {
namespace {

using Handler =
    grpc::internal::RpcMethodHandler<ParameterServerService, TensorMessage, TensorMessage>;

grpc::Status BadHeader(const char* what) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      std::string("malformed ") + what + " header");
}

}  // namespace

ParameterServerService::ParameterServerService(ParameterShard* shard, Options options)
    : shard_(shard), options_(options) {
  // What generated code does for a proto service, with our message type.
  AddMethod(new grpc::internal::RpcServiceMethod(
      kPushMethod, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler(std::mem_fn(&ParameterServerService::Push), this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler(std::mem_fn(&ParameterServerService::Pull), this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler(std::mem_fn(&ParameterServerService::PushPull), this)));
}

absl::Time ParameterServerService::PullDeadline(const grpc::ServerContext& context) const {
  const absl::Time now = absl::Now();
  absl::Time deadline =
      std::min(absl::FromChrono(context.deadline()), now + options_.max_pull_wait);
  // Give up a little before the caller does, so it gets the shard's sentence
  // saying what was missing rather than a bare "Deadline Exceeded".
  const absl::Duration margin = std::min(absl::Milliseconds(100), (deadline - now) / 10);
  if (margin > absl::ZeroDuration()) deadline -= margin;
  return deadline;
}

grpc::Status ParameterServerService::Push(grpc::ServerContext* /*context*/,
                                          const TensorMessage* request, TensorMessage* response) {
  PushRequest header;
  if (!header.ParseFromString(request->header)) return BadHeader("PushRequest");
  absl::StatusOr<PushResponse> result = shard_->Push(header, request->payload);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->header = result->SerializeAsString();
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Pull(grpc::ServerContext* context,
                                          const TensorMessage* request, TensorMessage* response) {
  PullRequest header;
  if (!header.ParseFromString(request->header)) return BadHeader("PullRequest");
  absl::StatusOr<PullResponse> result =
      shard_->Pull(header, PullDeadline(*context), &response->payload);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->header = result->SerializeAsString();
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::PushPull(grpc::ServerContext* context,
                                              const TensorMessage* request,
                                              TensorMessage* response) {
  PushPullRequest header;
  if (!header.ParseFromString(request->header)) return BadHeader("PushPullRequest");
  absl::StatusOr<PushPullResponse> result = shard_->PushPull(
      header.push(), request->payload, header.pull(), PullDeadline(*context), &response->payload);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->header = result->SerializeAsString();
  return grpc::Status::OK;
}

}  // namespace downpour
