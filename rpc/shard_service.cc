#include "rpc/shard_service.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "rpc/auth.h"
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

class ParameterServerService::PushPullStreamReactor final
    : public grpc::ServerBidiReactor<TensorMessage, TensorMessage> {
 public:
  PushPullStreamReactor(ParameterServerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), peer_(service->CallerOf(*context)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker closed or dropped the stream.
      Finish(grpc::Status::OK);
      return;
    }
    const absl::Time received = absl::Now();
    PushPullStreamRequest header;
    if (!header.ParseFromString(request_.header)) {
      Finish(BadHeader("PushPullStreamRequest"));
      return;
    }
    const absl::Time deadline = service_->PullDeadline(
        std::min(absl::FromChrono(context_->deadline()),
                 header.timeout_us() > 0 ? received + absl::Microseconds(header.timeout_us())
                                         : absl::InfiniteFuture()));
    if (absl::Status denied = service_->AdmitExchange(peer_, header.exchange()); !denied.ok()) {
      AnswerError(denied);
      return;
    }
    ParameterShard* shard = service_->shard_;
    absl::StatusOr<PushResponse> pushed = shard->Push(header.exchange().push(), request_.payload);
    // The request's buffers go back to gRPC before the answer is written.
    request_ = TensorMessage();
    if (!pushed.ok()) {
      AnswerError(pushed.status());
      return;
    }
    // A pull that is ready now is answered here; one that has to wait for
    // other workers waits on its own thread, never blocking gRPC's.
    response_ = TensorMessage();
    absl::StatusOr<PullResponse> pulled =
        shard->Pull(header.exchange().pull(), absl::InfinitePast(), &response_.payload);
    if (pulled.ok() || !absl::IsDeadlineExceeded(pulled.status())) {
      Answer(*pushed, std::move(pulled));
      return;
    }
    // The new waiter may answer, and the worker send its next request, before
    // `waiter_` holds it: it answers only once this has stored its handle.
    absl::MutexLock lock(&waiter_mu_);
    ReapWaiter();  // Ended with the previous answer.
    waiter_ = std::thread([this, shard, pull = header.exchange().pull(), deadline,
                           push = *std::move(pushed)]() mutable {
      absl::StatusOr<PullResponse> pulled = shard->Pull(pull, deadline, &response_.payload);
      { absl::MutexLock stored(&waiter_mu_); }
      Answer(push, std::move(pulled));
    });
  }

  void OnWriteDone(bool ok) override {
    response_ = TensorMessage();
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    ReapWaiter();
    delete this;
  }

 private:
  // The waiter thread has answered (or is answering): joined, or detached
  // when this runs on it — gRPC may run a reaction inline in the call that
  // started it (a write on a stream the worker has cancelled), and a thread
  // cannot join itself. A detached waiter touches nothing of the reactor
  // after its answer.
  void ReapWaiter() {
    if (!waiter_.joinable()) return;
    if (waiter_.get_id() == std::this_thread::get_id()) {
      waiter_.detach();
    } else {
      waiter_.join();
    }
  }

  // Writes the exchange's answer (response_.payload holds the pull's bytes).
  void Answer(const PushResponse& push, absl::StatusOr<PullResponse> pull) {
    if (!pull.ok()) {
      AnswerError(pull.status());
      return;
    }
    PushPullStreamResponse reply;
    *reply.mutable_exchange()->mutable_push() = push;
    *reply.mutable_exchange()->mutable_pull() = *std::move(pull);
    response_.header = reply.SerializeAsString();
    StartWrite(&response_);
  }
  void AnswerError(const absl::Status& error) {
    // The status a unary call would end with, in the stream's answer.
    const grpc::Status status = ToGrpcStatus(error);
    PushPullStreamResponse reply;
    reply.set_code(static_cast<int>(status.error_code()));
    reply.set_message(status.error_message());
    reply.set_details(status.error_details());
    response_ = TensorMessage();
    response_.header = reply.SerializeAsString();
    StartWrite(&response_);
  }

  ParameterServerService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string peer_;  // The caller's node certificate names it.
  TensorMessage request_;
  TensorMessage response_;
  absl::Mutex waiter_mu_;
  std::thread waiter_;
};

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
  AddMethod(new grpc::internal::RpcServiceMethod(
      kPushPullStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING, nullptr));
  // The fourth method added (index 3) is served with the callback API.
  MarkMethodCallback(3, new grpc::internal::CallbackBidiHandler<TensorMessage, TensorMessage>(
                            [this](grpc::CallbackServerContext* context) {
                              return new PushPullStreamReactor(this, context);
                            }));
}

absl::Time ParameterServerService::PullDeadline(const grpc::ServerContext& context) const {
  return PullDeadline(absl::FromChrono(context.deadline()));
}

absl::Time ParameterServerService::PullDeadline(absl::Time caller_deadline) const {
  const absl::Time now = absl::Now();
  absl::Time deadline = std::min(caller_deadline, now + options_.max_pull_wait);
  // Give up a little before the caller does, so it gets the shard's sentence
  // saying what was missing rather than a bare "Deadline Exceeded".
  const absl::Duration margin = std::min(absl::Milliseconds(100), (deadline - now) / 10);
  if (margin > absl::ZeroDuration()) deadline -= margin;
  return deadline;
}

std::string ParameterServerService::CallerOf(const grpc::ServerContextBase& context) const {
  // Read off the TLS session only where callers are authorized: the plain
  // path's every push and pull skips it.
  return options_.authorize ? PeerNodeId(context) : std::string();
}

absl::Status ParameterServerService::Admit(const std::string& peer, const std::string& job_id,
                                           int rank) const {
  if (!options_.authorize) return absl::OkStatus();
  if (peer.empty()) {
    return absl::UnauthenticatedError(
        "a shard serves nodes only, and the caller presented no node certificate");
  }
  return options_.authorize(peer, job_id, rank);
}

absl::Status ParameterServerService::AdmitExchange(const std::string& peer,
                                                   const PushPullRequest& exchange) const {
  if (exchange.has_push()) {
    RETURN_IF_ERROR(Admit(peer, exchange.push().job_id(), exchange.push().worker_rank()));
  }
  return Admit(peer, exchange.pull().job_id(), exchange.pull().worker_rank());
}

grpc::Status ParameterServerService::Push(grpc::ServerContext* context,
                                          const TensorMessage* request, TensorMessage* response) {
  PushRequest header;
  if (!header.ParseFromString(request->header)) return BadHeader("PushRequest");
  if (absl::Status denied = Admit(CallerOf(*context), header.job_id(), header.worker_rank());
      !denied.ok()) {
    return ToGrpcStatus(denied);
  }
  absl::StatusOr<PushResponse> result = shard_->Push(header, request->payload);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->header = result->SerializeAsString();
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Pull(grpc::ServerContext* context,
                                          const TensorMessage* request, TensorMessage* response) {
  PullRequest header;
  if (!header.ParseFromString(request->header)) return BadHeader("PullRequest");
  if (absl::Status denied = Admit(CallerOf(*context), header.job_id(), header.worker_rank());
      !denied.ok()) {
    return ToGrpcStatus(denied);
  }
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
  if (absl::Status denied = AdmitExchange(CallerOf(*context), header); !denied.ok()) {
    return ToGrpcStatus(denied);
  }
  absl::StatusOr<PushPullResponse> result = shard_->PushPull(
      header.push(), request->payload, header.pull(), PullDeadline(*context), &response->payload);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->header = result->SerializeAsString();
  return grpc::Status::OK;
}

}  // namespace downpour
