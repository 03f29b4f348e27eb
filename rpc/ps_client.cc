#include "rpc/ps_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "rpc/grpc_status.h"

namespace downpour {

std::unique_ptr<RemoteParameterShard> RemoteParameterShard::Create(const std::string& address,
                                                                   const Options& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  return std::make_unique<RemoteParameterShard>(
      address, grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args),
      options);
}

RemoteParameterShard::RemoteParameterShard(std::string address,
                                           std::shared_ptr<grpc::Channel> channel,
                                           const Options& options)
    : address_(std::move(address)),
      options_(options),
      channel_(std::move(channel)),
      stub_(ParameterServer::NewStub(channel_)) {}

absl::StatusOr<PushResponse> RemoteParameterShard::Push(const PushRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.push_timeout));
  PushResponse response;
  const grpc::Status status = stub_->Push(&context, request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), absl::StrCat("shard ", address_));
  return response;
}

absl::StatusOr<PullResponse> RemoteParameterShard::Pull(const PullRequest& request,
                                                        absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  PullResponse response;
  const grpc::Status status = stub_->Pull(&context, request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), absl::StrCat("shard ", address_));
  return response;
}

}  // namespace downpour
