#include "rpc/shard_service.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "common/net_address.h"
#include "common/status.h"
#include "common/thread_name.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "rpc/auth.h"
#include "rpc/grpc_status.h"
#include "rpc/segment_doorbell.h"

namespace downpour {
namespace {

// Whether a connection's peer (grpc's "ipv4:A:P", "ipv6:[A]:P", "unix:...")
// is on this host: a unix socket, or an address this host holds.
bool IsLocalPeer(const std::string& peer) {
  if (absl::StartsWith(peer, "unix:")) return true;
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return false;
  absl::StatusOr<HostPort> address = ParseHostPort(peer.substr(5));
  return address.ok() && IsThisHostAddress(address->host);
}

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
  // `shared_memory`: serves /PushPullSharedMemoryStream, whose first
  // message attaches a segment.
  PushPullStreamReactor(ParameterServerService* service, grpc::CallbackServerContext* context,
                        bool shared_memory)
      : service_(service),
        context_(context),
        peer_(service->CallerOf(*context)),
        call_deadline_(absl::FromChrono(context->deadline())),
        awaiting_segment_(shared_memory) {
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
    if (awaiting_segment_) {
      // Mapped, or the stream ends saying why not (the worker then opens a
      // /PushPullStream).
      awaiting_segment_ = false;
      absl::StatusOr<std::shared_ptr<SharedSegment>> segment =
          service_->AttachSegment(peer_, context_->peer(), header, &reservation_);
      request_ = TensorMessage();
      if (!segment.ok()) {
        Finish(ToGrpcStatus(segment.status()));
        return;
      }
      segment_ = *std::move(segment);
      PushPullStreamResponse attached;
      if (header.attach().doorbell_offset() > 0 && service_->options_.doorbell &&
          header.attach().doorbell_layout() == SegmentDoorbell::kLayout) {
        if (absl::Status rung = StartDoorbell(header.attach().doorbell_offset()); !rung.ok()) {
          Finish(ToGrpcStatus(rung));
          return;
        }
        // (No thread for it: the exchanges come over the stream.)
        attached.set_doorbell(doorbell_.has_value());
        attached.set_doorbell_layout(SegmentDoorbell::kLayout);
      }
      response_ = TensorMessage();
      response_.header = attached.SerializeAsString();
      StartWrite(&response_);
      return;
    }
    absl::StatusOr<Pushed> pushed = AdmitAndPush(header, request_.payload, received);
    // The request's buffers go back to gRPC before the answer is written.
    request_ = TensorMessage();
    if (!pushed.ok()) {
      AnswerError(pushed.status());
      return;
    }
    pull_area_ = pushed->pull_area;
    pull_capacity_ = pushed->pull_capacity;
    const absl::Time deadline = pushed->deadline;
    // A pull that is ready now is answered here; one that has to wait for
    // other workers waits on its own thread, never blocking gRPC's.
    ParameterShard* shard = service_->shard_;
    response_ = TensorMessage();
    absl::StatusOr<PullResponse> pulled =
        shard->Pull(header.exchange().pull(), absl::InfinitePast(), &response_.payload);
    if (pulled.ok() || !absl::IsDeadlineExceeded(pulled.status())) {
      Answer(pushed->push, std::move(pulled), received);
      return;
    }
    // The new waiter may answer, and the worker send its next request, before
    // `waiter_` holds it: it answers only once this has stored its handle.
    absl::MutexLock lock(&waiter_mu_);
    ReapWaiter();  // Ended with the previous answer.
    waiter_ = std::thread([this, shard, pull = header.exchange().pull(), deadline, received,
                           push = std::move(pushed->push)]() mutable {
      absl::StatusOr<PullResponse> pulled = shard->Pull(pull, deadline, &response_.payload);
      { absl::MutexLock stored(&waiter_mu_); }
      Answer(push, std::move(pulled), received);
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
    // A doorbell thread in the middle of an exchange answers it first (a
    // pull's wait cut short: PullSlices); the last of the two deletes the
    // reactor, so no gRPC thread waits for it.
    if (doorbell_thread_.joinable()) {
      stopping_.store(true, std::memory_order_release);
      doorbell_->WakeRequestWaiter();
      doorbell_thread_.detach();
    }
    Release();
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

  // An exchange's push, applied: when its pull must be answered by, where
  // the pull's bytes may go (null: in the answer's message) and the push's
  // answer.
  struct Pushed {
    absl::Time deadline;
    char* pull_area = nullptr;
    int64_t pull_capacity = 0;
    PushResponse push;
  };
  // Admits the exchange `header` (arrived at `received`, its push's bytes
  // in its message's `message_payload` or in the segment) and applies its
  // push: what both ways of an exchange, the stream's and the doorbell's,
  // do first.
  absl::StatusOr<Pushed> AdmitAndPush(const PushPullStreamRequest& header,
                                      const Payload& message_payload, absl::Time received) {
    Pushed pushed;
    pushed.deadline = service_->PullDeadline(std::min(
        call_deadline_, header.timeout_us() > 0 ? received + absl::Microseconds(header.timeout_us())
                                                : absl::InfiniteFuture()));
    RETURN_IF_ERROR(service_->AdmitExchange(peer_, header.exchange()));
    Payload push_payload;
    RETURN_IF_ERROR(PlaceInSegment(header, message_payload, &push_payload, &pushed.pull_area,
                                   &pushed.pull_capacity));
    ASSIGN_OR_RETURN(pushed.push, service_->shard_->Push(header.exchange().push(), push_payload));
    return pushed;
  }

  // The push's payload of the exchange `header`: the bytes of its message
  // (`message_payload`), or those it names in the segment; and where the
  // pull's bytes may go (`*pull_area`, null: in the answer's message).
  absl::Status PlaceInSegment(const PushPullStreamRequest& header, const Payload& message_payload,
                              Payload* push_payload, char** pull_area,
                              int64_t* pull_capacity) const {
    *pull_area = nullptr;
    *pull_capacity = 0;
    if (header.has_attach()) {
      return absl::InvalidArgumentError(
          "attach belongs in a shared memory stream's first message only");
    }
    if (!header.has_segment()) {
      *push_payload = message_payload;
      return absl::OkStatus();
    }
    if (segment_ == nullptr) {
      return absl::InvalidArgumentError(
          "segment names shared memory on a stream that has none attached");
    }
    const SharedSegmentExchange& place = header.segment();
    if (place.pull_capacity() > 0) {
      ASSIGN_OR_RETURN(*pull_area, segment_->Range(place.pull_offset(), place.pull_capacity(),
                                                   "segment.pull_offset", "segment.pull_capacity"));
      *pull_capacity = place.pull_capacity();
    }
    if (!place.push_in_segment()) {
      *push_payload = message_payload;
      return absl::OkStatus();
    }
    if (message_payload.size() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment.push_in_segment is set, yet the message carries ",
                       message_payload.size(), " bytes of its own"));
    }
    ASSIGN_OR_RETURN(const char* bytes,
                     segment_->Range(place.push_offset(), place.push_bytes(), "segment.push_offset",
                                     "segment.push_bytes"));
    *push_payload = Payload();
    push_payload->Append(bytes, place.push_bytes(), segment_);
    push_payload->set_shared(true);  // The worker can write it while the store reads.
    return absl::OkStatus();
  }

  // Writes the exchange's answer (response_.payload holds the pull's bytes,
  // copied into the segment's pull area when they fit).
  // `received`: when the exchange's request arrived (the answer says how
  // long the shard held it).
  void Answer(const PushResponse& push, absl::StatusOr<PullResponse> pull, absl::Time received) {
    if (!pull.ok()) {
      AnswerError(pull.status());
      return;
    }
    PushPullStreamResponse reply;
    *reply.mutable_exchange()->mutable_push() = push;
    *reply.mutable_exchange()->mutable_pull() = *std::move(pull);
    const int64_t bytes = static_cast<int64_t>(response_.payload.size());
    if (pull_area_ != nullptr && bytes <= pull_capacity_) {
      response_.payload.CopyTo(0, bytes, pull_area_);
      response_.payload = Payload();
      reply.mutable_segment()->set_pull_in_segment(true);
      reply.mutable_segment()->set_pull_bytes(bytes);
    }
    reply.mutable_exchange()->set_handled_us(absl::ToInt64Microseconds(absl::Now() - received));
    response_.header = reply.SerializeAsString();
    StartWrite(&response_);
  }
  void AnswerError(const absl::Status& error) {
    response_ = TensorMessage();
    response_.header = ErrorReply(error).SerializeAsString();
    StartWrite(&response_);
  }
  // The status a unary call would end with, in the stream's answer.
  static PushPullStreamResponse ErrorReply(const absl::Status& error) {
    const grpc::Status status = ToGrpcStatus(error);
    PushPullStreamResponse reply;
    reply.set_code(static_cast<int>(status.error_code()));
    reply.set_message(status.error_message());
    reply.set_details(status.error_details());
    return reply;
  }

  // The doorbell at `offset` of the segment (rpc/segment_doorbell.h): a
  // thread of this stream's answers the exchanges signalled there.
  absl::Status StartDoorbell(int64_t offset) {
    if (offset % 64 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("attach.doorbell_offset ", offset, " is not a multiple of 64"));
    }
    ASSIGN_OR_RETURN(char* at, segment_->Range(offset, SegmentDoorbell::kBytes,
                                               "attach.doorbell_offset", "its doorbell's bytes"));
    doorbell_.emplace(at);
    owners_.store(2);
    service_->doorbells_->Add(1);
    try {
      doorbell_thread_ = std::thread([this, running = service_->doorbells_] {
        NameThisThread("shard-doorbell");
        uint32_t seen = 0;
        while (!stopping_.load(std::memory_order_acquire)) {
          const uint32_t sequence = doorbell_->AwaitRequest(seen, absl::Milliseconds(100));
          if (sequence == seen || stopping_.load(std::memory_order_acquire)) continue;
          seen = sequence;
          const absl::Time received = absl::Now();
          std::string answer = AnswerSignalled(received).SerializeAsString();
          if (static_cast<int64_t>(answer.size()) > SegmentDoorbell::kAnswerBytes) {
            // Never written past the area (an error's own sentence, say).
            answer = ErrorReply(absl::InternalError(
                                    absl::StrCat("the exchange's answer of ", answer.size(),
                                                 " bytes exceeds the doorbell's answer area")))
                         .SerializeAsString();
          }
          // Observed before the worker is woken: once it has the answer,
          // the exchange is counted.
          if (Histogram* seconds = service_->options_.signalled_seconds) {
            seconds->Observe(absl::ToDoubleSeconds(absl::Now() - received));
          }
          doorbell_->Answer(sequence, answer);
        }
        Release();
        running->Add(-1);
      });
    } catch (const std::system_error&) {
      // No thread for it: the stream's exchanges come over the connection.
      owners_.store(1);
      service_->doorbells_->Add(-1);
      doorbell_.reset();
    }
    return absl::OkStatus();
  }
  // The stream's end (OnDone) and its doorbell thread each release the
  // reactor; the last deletes it.
  void Release() {
    if (owners_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // Pulls in slices of at most 200 ms up to `deadline`, so that a pull
  // waiting for other workers is given up soon once the stream is gone.
  absl::StatusOr<PullResponse> PullSlices(const PullRequest& pull, absl::Time deadline,
                                          Payload* payload) {
    const absl::Time began = absl::Now();
    while (true) {
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(200));
      absl::StatusOr<PullResponse> pulled = service_->shard_->Pull(pull, slice, payload);
      if (pulled.ok() || !absl::IsDeadlineExceeded(pulled.status())) return pulled;
      if (slice >= deadline || stopping_.load(std::memory_order_acquire)) {
        // The store's sentence times its last slice only.
        return Annotate(pulled.status(),
                        absl::StrCat("waited ",
                                     absl::FormatDuration(
                                         absl::Trunc(absl::Now() - began, absl::Milliseconds(1))),
                                     " in all"));
      }
    }
  }

  // The answer to the exchange signalled through the doorbell, `received`
  // then: as the stream's, its push in the segment and its pull waited for
  // here (this thread is the stream's own).
  PushPullStreamResponse AnswerSignalled(absl::Time received) {
    absl::StatusOr<std::string> bytes = doorbell_->Request();
    if (!bytes.ok()) return ErrorReply(bytes.status());
    PushPullStreamRequest header;
    if (!header.ParseFromString(*bytes)) {
      return ErrorReply(absl::InvalidArgumentError("malformed PushPullStreamRequest header"));
    }
    if (!header.has_exchange() || !header.segment().push_in_segment()) {
      return ErrorReply(absl::InvalidArgumentError(
          absl::StrCat("a header signalled through the doorbell must be an exchange with its push "
                       "in the segment; this one ",
                       !header.has_exchange() ? "has no exchange" : "carries no push there")));
    }
    absl::StatusOr<Pushed> pushed = AdmitAndPush(header, Payload(), received);
    if (!pushed.ok()) return ErrorReply(pushed.status());
    Payload pull_payload;
    absl::StatusOr<PullResponse> pulled =
        PullSlices(header.exchange().pull(), pushed->deadline, &pull_payload);
    if (!pulled.ok()) return ErrorReply(pulled.status());
    PushPullStreamResponse reply;
    *reply.mutable_exchange()->mutable_push() = std::move(pushed->push);
    const int64_t pull_bytes = static_cast<int64_t>(pull_payload.size());
    reply.mutable_segment()->set_pull_bytes(pull_bytes);
    // (The answer's framing past its parts: a few bytes a field.)
    if (pull_bytes <= pushed->pull_capacity &&
        static_cast<int64_t>(reply.ByteSizeLong() + pulled->ByteSizeLong()) + 64 <=
            SegmentDoorbell::kAnswerBytes) {
      if (pull_bytes > 0) pull_payload.CopyTo(0, pull_bytes, pushed->pull_area);
      *reply.mutable_exchange()->mutable_pull() = *std::move(pulled);
      reply.mutable_segment()->set_pull_in_segment(true);
    } else {
      // Its bytes or its header too large for their areas: pulled again
      // over the connection (the push stays applied once).
      reply.mutable_segment()->set_pull_not_sent(true);
    }
    reply.mutable_exchange()->set_handled_us(absl::ToInt64Microseconds(absl::Now() - received));
    return reply;
  }

  ParameterServerService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string peer_;  // The caller's node certificate names it.
  // The stream's deadline (read once: the doorbell thread may outlive the
  // context by the exchange in hand).
  const absl::Time call_deadline_;
  TensorMessage request_;
  TensorMessage response_;
  absl::Mutex waiter_mu_;
  std::thread waiter_;
  // The first message is to attach a segment (a shared-memory stream).
  bool awaiting_segment_;
  // The attached segment (null without), mapped until the stream ends.
  std::unique_ptr<SharedSegmentQuota::Reservation> reservation_;
  std::shared_ptr<SharedSegment> segment_;
  // The current exchange's: where its pull's bytes may go (null: in the
  // message).
  char* pull_area_ = nullptr;
  int64_t pull_capacity_ = 0;
  // The segment's doorbell, once the attach named one, and the thread that
  // answers it until the stream is done.
  std::optional<SegmentDoorbell> doorbell_;
  std::thread doorbell_thread_;
  std::atomic<bool> stopping_{false};
  // Who holds the reactor: the stream (until OnDone) and, once started,
  // the doorbell's thread.
  std::atomic<int> owners_{1};
};

ParameterServerService::ParameterServerService(ParameterShard* shard, Options options)
    : shard_(shard),
      options_(options),
      segment_quota_(options.max_segments_per_worker, options.max_segment_bytes_per_worker) {
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
  AddMethod(new grpc::internal::RpcServiceMethod(
      kPushPullSharedMemoryStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING, nullptr));
  // The fourth and fifth methods added (indices 3, 4) are served with the
  // callback API.
  for (const bool shared_memory : {false, true}) {
    MarkMethodCallback(shared_memory ? 4 : 3,
                       new grpc::internal::CallbackBidiHandler<TensorMessage, TensorMessage>(
                           [this, shared_memory](grpc::CallbackServerContext* context) {
                             return new PushPullStreamReactor(this, context, shared_memory);
                           }));
  }
}

ParameterServerService::~ParameterServerService() {
  absl::MutexLock lock(&doorbells_->mu);
  doorbells_->mu.Await(absl::Condition(
      +[](Running* running)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(running->mu) { return running->threads == 0; },
      doorbells_.get()));
}

absl::StatusOr<std::shared_ptr<SharedSegment>> ParameterServerService::AttachSegment(
    const std::string& peer, const std::string& address, const PushPullStreamRequest& request,
    std::unique_ptr<SharedSegmentQuota::Reservation>* reservation) {
  if (!options_.shared_memory) {
    return absl::FailedPreconditionError("shared memory is off on this shard (--shared_memory)");
  }
  if (!IsLocalPeer(address)) {
    return absl::FailedPreconditionError(
        "shared memory is for workers on this shard's host; this caller is not");
  }
  if (options_.authorize && peer.empty()) {
    return absl::UnauthenticatedError(
        "a shard serves nodes only, and the caller presented no node certificate");
  }
  if (!request.has_attach() || request.has_exchange() || request.has_segment()) {
    return absl::InvalidArgumentError(
        "the first message of a shared memory stream must attach its segment, and only that");
  }
  const SharedSegmentAttach& attach = request.attach();
  RETURN_IF_ERROR(SharedSegment::CheckAttach(attach, options_.max_segment_bytes_per_worker));
  ASSIGN_OR_RETURN(*reservation, segment_quota_.Reserve(attach.pid(), attach.size()));
  absl::StatusOr<std::shared_ptr<SharedSegment>> segment =
      SharedSegment::Open(attach, options_.max_segment_bytes_per_worker);
  if (!segment.ok()) {
    reservation->reset();
    return Annotate(segment.status(), "shared memory segment refused");
  }
  return segment;
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
  const absl::Time received = absl::Now();
  PushPullRequest header;
  if (!header.ParseFromString(request->header)) return BadHeader("PushPullRequest");
  if (absl::Status denied = AdmitExchange(CallerOf(*context), header); !denied.ok()) {
    return ToGrpcStatus(denied);
  }
  absl::StatusOr<PushPullResponse> result = shard_->PushPull(
      header.push(), request->payload, header.pull(), PullDeadline(*context), &response->payload);
  if (!result.ok()) return ToGrpcStatus(result.status());
  result->set_handled_us(absl::ToInt64Microseconds(absl::Now() - received));
  response->header = result->SerializeAsString();
  return grpc::Status::OK;
}

}  // namespace downpour
