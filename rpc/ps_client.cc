#include "rpc/ps_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/impl/client_unary_call.h"
#include "rpc/grpc_status.h"

namespace downpour {

std::unique_ptr<RemoteParameterShard> RemoteParameterShard::Create(const std::string& address,
                                                                   const Options& options) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < std::max(1, options.num_channels); ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options.max_message_bytes);
    args.SetMaxSendMessageSize(options.max_message_bytes);
    // Without this, channels with equal arguments share one connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Large HTTP/2 frames and windows: fewer frames and window updates per
    // megabyte of tensor.
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return std::make_unique<RemoteParameterShard>(address, std::move(channels), options);
}

RemoteParameterShard::RemoteParameterShard(std::string address,
                                           std::vector<std::shared_ptr<grpc::Channel>> channels,
                                           const Options& options)
    : address_(std::move(address)), options_(options) {
  for (auto& channel : channels) {
    // What a generated stub holds per method.
    connections_.push_back(std::unique_ptr<Connection>(new Connection{
        channel,
        grpc::internal::RpcMethod(kPushMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel),
        grpc::internal::RpcMethod(kPullMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel),
        grpc::internal::RpcMethod(kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
                                  channel)}));
  }
}

absl::Status RemoteParameterShard::Call(Method method, const TensorMessage& request,
                                        absl::Time deadline, TensorMessage* response) {
  Connection& c =
      *connections_[next_.fetch_add(1, std::memory_order_relaxed) % connections_.size()];
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  const grpc::internal::RpcMethod& rpc = method == Method::kPush   ? c.push
                                         : method == Method::kPull ? c.pull
                                                                   : c.push_pull;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<TensorMessage, TensorMessage>(
      c.channel.get(), rpc, &context, request, response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), absl::StrCat("shard ", address_));
  return absl::OkStatus();
}

absl::StatusOr<PushResponse> RemoteParameterShard::Push(const PushRequest& request,
                                                        const Payload& payload) {
  TensorMessage message, reply;
  message.header = request.SerializeAsString();
  message.payload = payload;
  RETURN_IF_ERROR(Call(Method::kPush, message, absl::Now() + options_.push_timeout, &reply));
  PushResponse response;
  if (!response.ParseFromString(reply.header)) {
    return absl::InternalError(absl::StrCat("shard ", address_, ": malformed PushResponse"));
  }
  return response;
}

absl::StatusOr<PullResponse> RemoteParameterShard::Pull(const PullRequest& request,
                                                        absl::Time deadline, Payload* payload) {
  TensorMessage message, reply;
  message.header = request.SerializeAsString();
  RETURN_IF_ERROR(Call(Method::kPull, message, deadline, &reply));
  PullResponse response;
  if (!response.ParseFromString(reply.header)) {
    return absl::InternalError(absl::StrCat("shard ", address_, ": malformed PullResponse"));
  }
  *payload = std::move(reply.payload);
  return response;
}

absl::StatusOr<PushPullResponse> RemoteParameterShard::PushPull(const PushRequest& push,
                                                                const Payload& push_payload,
                                                                const PullRequest& pull,
                                                                absl::Time deadline,
                                                                Payload* pull_payload) {
  TensorMessage message, reply;
  {
    PushPullRequest header;
    *header.mutable_push() = push;
    *header.mutable_pull() = pull;
    message.header = header.SerializeAsString();
  }
  message.payload = push_payload;
  RETURN_IF_ERROR(Call(Method::kPushPull, message, deadline, &reply));
  PushPullResponse response;
  if (!response.ParseFromString(reply.header)) {
    return absl::InternalError(absl::StrCat("shard ", address_, ": malformed PushPullResponse"));
  }
  *pull_payload = std::move(reply.payload);
  return response;
}

}  // namespace downpour
