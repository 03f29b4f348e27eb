#include "rpc/remote_parameter_shard.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/support/async_stream.h"
#include "rpc/grpc_status.h"

namespace downpour {

// One open /PushPullStream call with its own completion queue, which the
// thread making an exchange polls itself (no hand-off to gRPC's threads).
// Thread-compatible: one exchange at a time. Once an exchange fails the
// stream is broken() and only good for destruction, which cancels the call
// and waits for its pending operations.
class RemoteParameterShard::Stream {
 public:
  Stream(grpc::ChannelInterface* channel, const grpc::internal::RpcMethod& method)
      : context_(std::make_unique<grpc::ClientContext>()) {
    // The call's metadata goes out with the first exchange (starting it
    // apart would use the write's operation slot, and cost a wait).
    context_->set_initial_metadata_corked(true);
    stream_ = grpc::internal::ClientAsyncReaderWriterFactory<TensorMessage, TensorMessage>::Create(
        channel, &cq_, method, context_.get(), /*start=*/true, nullptr);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  ~Stream() {
    if (!finished_) {
      context_->TryCancel();
      Finish(absl::InfiniteFuture());
    }
    context_.reset();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  bool broken() const { return broken_; }

  // Sends `request` and waits until `deadline` for its answer.
  absl::Status Exchange(const TensorMessage& request, absl::Time deadline,
                        TensorMessage* response) {
    pending_[kWrite] = pending_[kRead] = true;
    stream_->Write(request, Tag(kWrite));
    stream_->Read(response, Tag(kRead));
    const auto wait_until = absl::ToChronoTime(deadline);
    while (pending_[kWrite] || pending_[kRead]) {
      void* tag;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, wait_until) != grpc::CompletionQueue::GOT_EVENT) {
        broken_ = true;
        context_->TryCancel();
        return absl::DeadlineExceededError(
            "Deadline Exceeded waiting for the shard's answer on its stream");
      }
      pending_[reinterpret_cast<intptr_t>(tag)] = false;
      if (!ok) {
        // The call is over: its status says why.
        broken_ = true;
        const grpc::Status status = Finish(deadline);
        if (!status.ok()) return FromGrpcStatus(status);
        return absl::UnavailableError("the shard closed the stream");
      }
    }
    return absl::OkStatus();
  }

 private:
  enum Op : intptr_t { kWrite, kRead, kFinish, kNumOps };
  static void* Tag(Op op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op)); }

  // Asks for the call's status and waits for every pending operation; a
  // call still running at `deadline` is cancelled, which ends them at once.
  grpc::Status Finish(absl::Time deadline) {
    grpc::Status status;
    finished_ = true;
    const auto wait_until = absl::ToChronoTime(deadline);
    bool cancelled = false;
    // A pending read may still expect the initial metadata, which Finish
    // would ask for too: gRPC allows one such operation at a time.
    auto drain = [&] {
      while (pending_[kWrite] || pending_[kRead] || pending_[kFinish]) {
        void* tag;
        bool ok;
        if (cq_.AsyncNext(&tag, &ok,
                          cancelled ? std::chrono::system_clock::time_point::max() : wait_until) !=
            grpc::CompletionQueue::GOT_EVENT) {
          context_->TryCancel();
          cancelled = true;
          continue;
        }
        pending_[reinterpret_cast<intptr_t>(tag)] = false;
      }
    };
    drain();
    pending_[kFinish] = true;
    stream_->Finish(&status, Tag(kFinish));
    drain();
    if (cancelled) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "Deadline Exceeded closing the stream to the shard");
    }
    return status;
  }

  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientContext> context_;
  grpc::ClientAsyncReaderWriter<TensorMessage, TensorMessage>* stream_;  // In the call's arena.
  bool pending_[kNumOps] = {};
  bool broken_ = false;
  bool finished_ = false;
};

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
    // The windows above are fixed: no bandwidth-delay probing pings (each
    // one a wake-up of both ends). (GRPC_ARG_MINIMAL_STACK is not for us: it
    // drops the client's deadline filter, so a call to a frozen shard would
    // never end.)
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    channels.push_back(grpc::CreateCustomChannel(
        address,
        options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
        args));
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
        grpc::internal::RpcMethod(kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel),
        grpc::internal::RpcMethod(kPushPullStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
                                  channel)}));
  }
}

RemoteParameterShard::~RemoteParameterShard() = default;

absl::Status RemoteParameterShard::StreamCall(const TensorMessage& request, absl::Time deadline,
                                              TensorMessage* response) {
  std::unique_ptr<Stream> stream;
  {
    absl::MutexLock lock(&streams_mu_);
    if (!idle_streams_.empty()) {
      stream = std::move(idle_streams_.back());
      idle_streams_.pop_back();
    }
  }
  const bool reused = stream != nullptr;
  auto open = [this] {
    Connection& c =
        *connections_[next_.fetch_add(1, std::memory_order_relaxed) % connections_.size()];
    return std::make_unique<Stream>(c.channel.get(), c.push_pull_stream);
  };
  if (!reused) stream = open();
  absl::Status status = stream->Exchange(request, deadline, response);
  if (!status.ok() && reused && absl::IsUnavailable(status) && absl::Now() < deadline) {
    // An idle stream whose connection went away (a restarted shard): once
    // more on a new one. The push keeps its request id, so it is applied
    // once either way.
    stream = open();
    status = stream->Exchange(request, deadline, response);
  }
  if (!stream->broken()) {
    absl::MutexLock lock(&streams_mu_);
    idle_streams_.push_back(std::move(stream));
  }
  if (!status.ok()) return Annotate(status, absl::StrCat("shard ", address_));
  return absl::OkStatus();
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
  RETURN_IF_ERROR(
      Call(Method::kPush, message, absl::Now() + options_.push_attempt_timeout, &reply));
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
  message.payload = push_payload;
  if (options_.use_streams && !streams_unsupported_.load(std::memory_order_relaxed)) {
    PushPullStreamRequest header;
    *header.mutable_exchange()->mutable_push() = push;
    *header.mutable_exchange()->mutable_pull() = pull;
    header.set_timeout_us(std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
    message.header = header.SerializeAsString();
    absl::Status status = StreamCall(message, deadline, &reply);
    if (absl::IsUnimplemented(status)) {
      // A shard from before the stream: unary from now on.
      streams_unsupported_.store(true, std::memory_order_relaxed);
    } else {
      RETURN_IF_ERROR(status);
      PushPullStreamResponse answer;
      if (!answer.ParseFromString(reply.header)) {
        return absl::InternalError(
            absl::StrCat("shard ", address_, ": malformed PushPullStreamResponse"));
      }
      if (answer.code() != 0) {
        const grpc::Status error(static_cast<grpc::StatusCode>(answer.code()), answer.message(),
                                 answer.details());
        return Annotate(FromGrpcStatus(error), absl::StrCat("shard ", address_));
      }
      *pull_payload = std::move(reply.payload);
      return std::move(*answer.mutable_exchange());
    }
  }
  {
    PushPullRequest header;
    *header.mutable_push() = push;
    *header.mutable_pull() = pull;
    message.header = header.SerializeAsString();
  }
  RETURN_IF_ERROR(Call(Method::kPushPull, message, deadline, &reply));
  PushPullResponse response;
  if (!response.ParseFromString(reply.header)) {
    return absl::InternalError(absl::StrCat("shard ", address_, ": malformed PushPullResponse"));
  }
  *pull_payload = std::move(reply.payload);
  return response;
}

}  // namespace downpour
