#include "rpc/remote_parameter_shard.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/support/async_stream.h"
#include "rpc/grpc_status.h"
#include "rpc/keepalive.h"
#include "rpc/segment_doorbell.h"
#include "rpc/shared_segment.h"

namespace downpour {

class RemoteParameterShard::InFlight {
 public:
  InFlight(RemoteParameterShard* shard, grpc::ClientContext* context) : shard_(shard) {
    absl::MutexLock lock(&shard_->calls_mu_);
    if (shard_->calls_cancelled_) return;
    context_ = context;
    shard_->in_flight_.push_back(context);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() {
    if (context_ == nullptr) return;
    absl::MutexLock lock(&shard_->calls_mu_);
    std::vector<grpc::ClientContext*>& calls = shard_->in_flight_;
    calls.erase(std::find(calls.begin(), calls.end(), context_));
  }

  bool refused() const { return context_ == nullptr; }

 private:
  RemoteParameterShard* const shard_;
  grpc::ClientContext* context_ = nullptr;
};

absl::Status RemoteParameterShard::CallsCancelled() const {
  return absl::CancelledError(
      absl::StrCat("shard ", address_, ": calls cancelled (their caller stopped)"));
}

void RemoteParameterShard::CancelCalls() {
  absl::MutexLock lock(&calls_mu_);
  calls_cancelled_ = true;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
}

// One open /PushPullStream (or /PushPullSharedMemoryStream) call with its
// own completion queue, which the thread making an exchange polls itself (no
// hand-off to gRPC's threads). Thread-compatible: one exchange at a time.
// Once an exchange fails the stream is broken() and only good for
// destruction, which cancels the call and waits for its pending operations.
// Its call is registered with its shard client's CancelCalls while it exists.
//
// A stream with a segment lays it out as [header][push area][pull area]. The
// push area is rewritten only after the shard has answered the exchange
// that read it; the pull area is offered to the shard only while no pull
// payload handed out before points into it. A broken stream's segment is
// never written again (the shard may still be reading or writing it), only
// unmapped once the last payload into it is gone.
class RemoteParameterShard::Stream {
 public:
  // With a segment: its push area (from kHeaderBytes), then its pull area,
  // then its doorbell (SegmentDoorbell::kBytes).
  Stream(RemoteParameterShard* owner, grpc::ChannelInterface* channel,
         const grpc::internal::RpcMethod& method, absl::Duration stall_at_deadline,
         std::shared_ptr<SharedSegment> segment = nullptr, int64_t push_area = 0,
         int64_t pull_area = 0)
      : context_(std::make_unique<grpc::ClientContext>()),
        in_flight_(std::in_place, owner, context_.get()),
        stall_at_deadline_(stall_at_deadline),
        segment_(std::move(segment)) {
    if (segment_ != nullptr) {
      push_area_ = push_area;
      pull_offset_ = SharedSegment::kHeaderBytes + push_area;
      pull_area_ = pull_area;
      doorbell_offset_ = pull_offset_ + pull_area;
    }
    // The call's metadata goes out with the first exchange (starting it
    // apart would use the write's operation slot, and cost a wait).
    context_->set_initial_metadata_corked(true);
    stream_ = grpc::internal::ClientAsyncReaderWriterFactory<TensorMessage, TensorMessage>::Create(
        channel, &cq_, method, context_.get(), /*start=*/true, nullptr);
    // The client's calls are cancelled: the first exchange fails so.
    if (in_flight_->refused()) context_->TryCancel();
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  ~Stream() {
    if (!finished_) {
      context_->TryCancel();
      Finish(absl::InfiniteFuture());
    }
    in_flight_.reset();
    context_.reset();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  bool broken() const { return broken_; }
  bool has_segment() const { return segment_ != nullptr; }
  int64_t push_area() const { return push_area_; }
  int64_t pull_area() const { return pull_area_; }

  // The first message of a shared-memory stream: the shard maps the segment
  // or ends the stream saying why not.
  absl::Status Attach(absl::Time deadline) {
    PushPullStreamRequest header;
    *header.mutable_attach() = segment_->attach();
    header.mutable_attach()->set_doorbell_offset(doorbell_offset_);
    header.mutable_attach()->set_doorbell_layout(SegmentDoorbell::kLayout);
    TensorMessage request;
    request.header = header.SerializeAsString();
    ASSIGN_OR_RETURN(TensorMessage response, Exchange(request, deadline));
    PushPullStreamResponse answer;
    if (!answer.ParseFromString(response.header)) {
      broken_ = true;
      return absl::InternalError("malformed answer to a shared memory segment's attach");
    }
    if (answer.code() != 0) {
      broken_ = true;
      return absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
    }
    if (answer.doorbell() && answer.doorbell_layout() == SegmentDoorbell::kLayout) {
      doorbell_.emplace(segment_->data() + doorbell_offset_);
      // A read kept pending from now on: it ends when the stream does (the
      // shard gone), which a wait for the doorbell notices.
      ArmRead();
    }
    return absl::OkStatus();
  }

  bool has_doorbell() const { return doorbell_.has_value(); }

  // One push-pull. The push's bytes go through the segment when there is
  // one and they fit, the pull's come back through it when they fit and the
  // pull area is free; `*segment_push_bytes` and `*segment_pull_bytes` say
  // how many did. An error the shard answered (the stream stays usable) is
  // returned as the unary call's status would be.
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload, int64_t* segment_push_bytes,
                                            int64_t* segment_pull_bytes, int* why_not,
                                            int64_t* pull_not_sent) {
    *segment_push_bytes = *segment_pull_bytes = *pull_not_sent = 0;
    *pull_payload = Payload();
    PushPullStreamRequest header;
    *header.mutable_exchange()->mutable_push() = push;
    *header.mutable_exchange()->mutable_pull() = pull;
    header.set_timeout_us(std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
    TensorMessage request;
    int64_t pull_capacity = 0;
    if (segment_ != nullptr) {
      SharedSegmentExchange* place = header.mutable_segment();
      const int64_t push_bytes = static_cast<int64_t>(push_payload.size());
      if (push_bytes <= push_area_) {
        char* out = segment_->data() + SharedSegment::kHeaderBytes;
        for (const Payload::Piece& piece : push_payload.pieces()) {
          std::memcpy(out, piece.data, piece.size);
          out += piece.size;
        }
        place->set_push_in_segment(true);
        place->set_push_offset(SharedSegment::kHeaderBytes);
        place->set_push_bytes(push_bytes);
        *segment_push_bytes = push_bytes;
      } else {
        request.payload = push_payload;
      }
      if (pull_lease_.expired()) pull_capacity = pull_area_;
      place->set_pull_offset(pull_offset_);
      place->set_pull_capacity(pull_capacity);
    } else {
      request.payload = push_payload;
    }
    request.header = header.SerializeAsString();
    PushPullStreamResponse answer;
    // Through the doorbell where its push is in the segment, its header
    // fits, and the pull area is free for the answer.
    *why_not = !doorbell_.has_value()                ? kNoDoorbell
               : !header.segment().push_in_segment() ? kPushTooLarge
               : pull_capacity == 0                  ? kPullAreaHeld
               : static_cast<int64_t>(request.header.size()) > SegmentDoorbell::kRequestBytes
                   ? kHeaderTooLarge
                   : kSignalled;
    if (*why_not == kSignalled) {
      ASSIGN_OR_RETURN(std::string reply, Signal(request.header, deadline));
      if (!answer.ParseFromString(reply)) {
        broken_ = true;
        return absl::InternalError("malformed PushPullStreamResponse in the doorbell");
      }
    } else {
      ASSIGN_OR_RETURN(TensorMessage reply, Exchange(request, deadline));
      if (!answer.ParseFromString(reply.header)) {
        broken_ = true;
        return absl::InternalError("malformed PushPullStreamResponse");
      }
      if (reply.payload.size() != 0 && answer.segment().pull_in_segment()) {
        broken_ = true;
        return absl::InternalError("the shard answered pull bytes both in the segment and beside");
      }
      *pull_payload = std::move(reply.payload);
    }
    if (answer.code() != 0) {
      const grpc::Status error(static_cast<grpc::StatusCode>(answer.code()), answer.message(),
                               answer.details());
      return FromGrpcStatus(error);
    }
    if (answer.segment().pull_not_sent()) {
      // Through the doorbell, too large for the pull area: the caller pulls
      // again, and a segment of its size follows.
      *pull_not_sent = std::max<int64_t>(1, answer.segment().pull_bytes());
    } else if (answer.segment().pull_in_segment()) {
      const int64_t bytes = answer.segment().pull_bytes();
      if (pull_capacity == 0 || bytes < 0 || bytes > pull_capacity) {
        broken_ = true;
        return absl::InternalError(absl::StrCat(
            "the shard answered ", bytes, " bytes in a shared memory area of ", pull_capacity));
      }
      // The payload keeps the mapping, and the pull area out of the next
      // exchanges, for as long as the caller holds it.
      auto lease = std::make_shared<std::shared_ptr<SharedSegment>>(segment_);
      pull_lease_ = lease;
      *pull_payload = Payload();
      pull_payload->Append(segment_->data() + pull_offset_, bytes, std::move(lease));
      *segment_pull_bytes = bytes;
    }
    return std::move(*answer.mutable_exchange());
  }

  // Sends `request` and waits until `deadline` for its answer. The answer
  // is read into the stream's own reply_: a read still pending when this
  // gives up may complete as the stream closes, after the caller is gone.
  absl::StatusOr<TensorMessage> Exchange(const TensorMessage& request, absl::Time deadline) {
    pending_[kWrite] = true;
    stream_->Write(request, Tag(kWrite));
    // With a doorbell the read is pending already.
    if (!pending_[kRead]) ArmRead();
    const auto wait_until = absl::ToChronoTime(deadline);
    while (pending_[kWrite] || pending_[kRead]) {
      void* tag;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, wait_until) != grpc::CompletionQueue::GOT_EVENT) {
        return GiveUp("Deadline Exceeded waiting for the shard's answer on its stream");
      }
      pending_[reinterpret_cast<intptr_t>(tag)] = false;
      if (!ok) return Ended(deadline);
    }
    TensorMessage reply = std::exchange(reply_, TensorMessage());
    if (doorbell_.has_value()) ArmRead();
    return reply;
  }

  // Signals the exchange whose header is `header` through the doorbell and
  // waits until `deadline` for its answer's header, watching the stream:
  // should it end (the shard gone), so does the wait.
  absl::StatusOr<std::string> Signal(const std::string& header, absl::Time deadline) {
    // A stream that ended while idle (its shard gone) is not rung.
    RETURN_IF_ERROR(CheckStream(deadline));
    const uint32_t sequence = doorbell_->Ring(header);
    while (!doorbell_->AwaitAnswer(sequence,
                                   std::min(absl::Milliseconds(20), deadline - absl::Now()))) {
      RETURN_IF_ERROR(CheckStream(deadline));
      if (absl::Now() >= deadline) {
        return GiveUp("Deadline Exceeded waiting for the shard's answer through shared memory");
      }
    }
    absl::StatusOr<std::string> answer = doorbell_->Answer();
    if (!answer.ok()) broken_ = true;
    return answer;
  }
  // A doorbell stream's pending read, looked at without waiting: it ends
  // only with the stream (the shard writes nothing on a stream it answers
  // through the doorbell).
  absl::Status CheckStream(absl::Time deadline) {
    void* tag;
    bool ok = false;
    // A deadline in the past, not now: gRPC rounds deadlines up to its
    // millisecond clock, and `now` would wait up to a millisecond.
    if (cq_.AsyncNext(&tag, &ok, gpr_inf_past(GPR_CLOCK_MONOTONIC)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return absl::OkStatus();
    }
    pending_[reinterpret_cast<intptr_t>(tag)] = false;
    if (!ok) return Ended(deadline);
    broken_ = true;
    context_->TryCancel();
    return absl::InternalError("the shard wrote on a stream it answers through shared memory");
  }

  void ArmRead() {
    pending_[kRead] = true;
    stream_->Read(&reply_, Tag(kRead));
  }
  // The stream is given up at its deadline (the shard may still answer the
  // exchange, to no one).
  absl::Status GiveUp(absl::string_view why) {
    broken_ = true;
    if (stall_at_deadline_ > absl::ZeroDuration()) absl::SleepFor(stall_at_deadline_);
    context_->TryCancel();
    return absl::DeadlineExceededError(why);
  }
  // The call is over: its status says why.
  absl::Status Ended(absl::Time deadline) {
    broken_ = true;
    const grpc::Status status = Finish(deadline);
    if (!status.ok()) return FromGrpcStatus(status);
    return absl::UnavailableError("the shard closed the stream");
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
  std::optional<InFlight> in_flight_;                                    // Of context_.
  grpc::ClientAsyncReaderWriter<TensorMessage, TensorMessage>* stream_;  // In the call's arena.
  const absl::Duration stall_at_deadline_;
  // Where the pending read writes (Exchange).
  TensorMessage reply_;
  bool pending_[kNumOps] = {};
  bool broken_ = false;
  bool finished_ = false;
  // Null on a stream without shared memory.
  const std::shared_ptr<SharedSegment> segment_;
  int64_t push_area_ = 0;  // At kHeaderBytes.
  int64_t pull_offset_ = 0;
  int64_t pull_area_ = 0;
  int64_t doorbell_offset_ = 0;
  // Once the shard took the doorbell.
  std::optional<SegmentDoorbell> doorbell_;
  // Held by the last pull payload handed out from the pull area.
  std::weak_ptr<std::shared_ptr<SharedSegment>> pull_lease_;
};

namespace {

constexpr int64_t kPage = 4096;
// The smallest pull area of a new segment.
constexpr int64_t kMinPullArea = 64 << 10;

int64_t RoundUpToPage(int64_t n) { return (n + kPage - 1) / kPage * kPage; }

// An area for exchanges of up to `n` bytes, with room to grow: the next
// power of two (at least a page). Exchanges whose sizes vary from step to
// step (sparse rows) then outgrow a segment a few times, not at every new
// largest size (each replacement costs a new stream, memfd and mapping).
int64_t AreaFor(int64_t n) {
  int64_t area = kPage;
  while (area < n) area *= 2;
  return area;
}

// A refusal (another host or user, an older shard, shared memory off, a
// segment the shard would not map) rather than a passing failure: the client
// stops asking.
bool IsRefusal(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
      return false;
    default:
      return true;
  }
}

}  // namespace

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
    // A shard whose host or link is gone ends its calls in about 12 s,
    // cancelled ones too (rpc/keepalive.h).
    SetClientKeepalive(&args);
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
                                  channel),
        grpc::internal::RpcMethod(kPushPullSharedMemoryStreamMethod,
                                  grpc::internal::RpcMethod::BIDI_STREAMING, channel)}));
  }
}

RemoteParameterShard::~RemoteParameterShard() {
  // What the streams did, said once the client goes (a job's end).
  int64_t exchanges = 0;
  for (const auto& way : ways_) exchanges += way.load(std::memory_order_relaxed);
  if (options_.log == nullptr || exchanges == 0) return;
  auto n = [this](int way) { return ways_[way].load(std::memory_order_relaxed); };
  options_.log(absl::StrCat(
      "shard ", address_, ": ", exchanges, " exchanges on streams, ", n(kSignalled),
      " signalled through shared memory; over the connection ", n(kNoDoorbell),
      " on streams without a doorbell, ", n(kPullAreaHeld), " with the pull area still held, ",
      n(kPushTooLarge), " with a push too large for the segment, ", n(kHeaderTooLarge),
      " with a header too large; ", pulled_again_.load(), " pulls too large, pulled again; ",
      segments_attached_.load(), " segments mapped"));
}

RemoteParameterShard::SharedMemoryStats RemoteParameterShard::shared_memory_stats() const {
  SharedMemoryStats stats;
  stats.segments = segments_attached_.load(std::memory_order_relaxed);
  stats.push_bytes = segment_push_bytes_.load(std::memory_order_relaxed);
  stats.pull_bytes = segment_pull_bytes_.load(std::memory_order_relaxed);
  stats.signalled = ways_[kSignalled].load(std::memory_order_relaxed);
  return stats;
}

void RemoteParameterShard::ReportTransport(const std::string& message) {
  if (options_.log && !transport_reported_.exchange(true)) {
    options_.log(absl::StrCat("shard ", address_, ": ", message));
  }
}

absl::StatusOr<std::unique_ptr<RemoteParameterShard::Stream>> RemoteParameterShard::OpenStream(
    int64_t push_bytes, absl::Time deadline) {
  Connection& c =
      *connections_[next_.fetch_add(1, std::memory_order_relaxed) % connections_.size()];
  if (!options_.use_shared_memory) {
    ReportTransport("shared memory off; tensors go over the connection");
  } else if (!shared_memory_refused_.load(std::memory_order_relaxed)) {
    // Sized for the largest exchange seen (AreaFor); a pull is guessed at
    // twice the push (half-width gradients, full-width parameters) until
    // one is seen. (An INT8 job's first pull, the published copy whole in
    // float32, is four times its push: it goes over gRPC, and the segments
    // made after it are sized for it.)
    const int64_t cap = RoundUpToPage(options_.max_message_bytes);
    const int64_t push_area =
        std::min(cap, AreaFor(std::max(push_bytes, largest_push_.load(std::memory_order_relaxed))));
    const int64_t pull_area =
        std::min(cap, AreaFor(std::max({largest_pull_.load(std::memory_order_relaxed),
                                        2 * push_bytes, kMinPullArea})));
    absl::Status attached;
    absl::StatusOr<std::shared_ptr<SharedSegment>> segment = SharedSegment::Create(
        SharedSegment::kHeaderBytes + push_area + pull_area + SegmentDoorbell::kBytes);
    if (segment.ok()) {
      auto stream = std::make_unique<Stream>(
          this, c.channel.get(), c.push_pull_shared_memory_stream,
          options_.testing_stall_at_deadline, *std::move(segment), push_area, pull_area);
      attached = stream->Attach(deadline);
      if (attached.ok()) {
        segments_attached_.fetch_add(1, std::memory_order_relaxed);
        ReportTransport(stream->has_doorbell()
                            ? "tensors go through shared memory (same host), and the exchanges "
                              "are signalled through it"
                            : "tensors go through shared memory (same host)");
        return stream;
      }
    } else {
      attached = segment.status();
    }
    if (IsRefusal(attached)) {
      shared_memory_refused_.store(true, std::memory_order_relaxed);
      ReportTransport(absl::StrCat("shared memory not used (", attached.message(),
                                   "); tensors go over the connection"));
    } else if (absl::IsResourceExhausted(attached)) {
      // This process has as many segments mapped there as the shard allows.
      ReportTransport(absl::StrCat("shared memory not used for now (", attached.message(),
                                   "); tensors go over the connection"));
    } else {
      // The shard is not answering: the exchange fails as it would have.
      return attached;
    }
  }
  return std::make_unique<Stream>(this, c.channel.get(), c.push_pull_stream,
                                  options_.testing_stall_at_deadline);
}

absl::StatusOr<PushPullResponse> RemoteParameterShard::StreamPushPull(
    const PushRequest& push, const Payload& push_payload, const PullRequest& pull,
    absl::Time deadline, Payload* pull_payload, bool* unsupported) {
  *unsupported = false;
  const int64_t push_bytes = static_cast<int64_t>(push_payload.size());
  std::unique_ptr<Stream> stream;
  {
    absl::MutexLock lock(&streams_mu_);
    if (!idle_streams_.empty()) {
      stream = std::move(idle_streams_.back());
      idle_streams_.pop_back();
    }
  }
  const bool reused = stream != nullptr;
  absl::StatusOr<PushPullResponse> result = absl::UnavailableError("no stream");
  int64_t via_push = 0, via_pull = 0, pull_not_sent = 0;
  int why_not = kNoDoorbell;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (stream == nullptr) {
      absl::StatusOr<std::unique_ptr<Stream>> opened = OpenStream(push_bytes, deadline);
      if (!opened.ok()) return Annotate(opened.status(), absl::StrCat("shard ", address_));
      stream = *std::move(opened);
    }
    result = stream->PushPull(push, push_payload, pull, deadline, pull_payload, &via_push,
                              &via_pull, &why_not, &pull_not_sent);
    // An idle stream whose connection went away (a restarted shard): once
    // more on a new one. The push keeps its request id, so it is applied
    // once either way.
    if (result.ok() || attempt > 0 || !reused || !absl::IsUnavailable(result.status()) ||
        absl::Now() >= deadline) {
      break;
    }
    stream.reset();
  }
  // The push is applied; a pull too large for the stream's pull area comes
  // again over the connection (its error, which names the shard, is the
  // exchange's; the stream is sound).
  absl::Status pulled_again;
  if (result.ok() && pull_not_sent > 0) {
    absl::StatusOr<PullResponse> pulled = Pull(pull, deadline, pull_payload);
    if (pulled.ok()) {
      *result->mutable_pull() = *std::move(pulled);
    } else {
      pulled_again = pulled.status();
    }
  }
  if (result.ok()) {
    segment_push_bytes_.fetch_add(via_push, std::memory_order_relaxed);
    segment_pull_bytes_.fetch_add(via_pull, std::memory_order_relaxed);
    ways_[why_not].fetch_add(1, std::memory_order_relaxed);
    if (pull_not_sent > 0) pulled_again_.fetch_add(1, std::memory_order_relaxed);
    int64_t seen = largest_push_.load(std::memory_order_relaxed);
    while (push_bytes > seen && !largest_push_.compare_exchange_weak(seen, push_bytes)) {
    }
    const int64_t pulled = std::max(static_cast<int64_t>(pull_payload->size()), pull_not_sent);
    seen = largest_pull_.load(std::memory_order_relaxed);
    while (pulled > seen && !largest_pull_.compare_exchange_weak(seen, pulled)) {
    }
  }
  // A segment too small for what this client exchanges is replaced: the next
  // call opens a stream with a larger one (up to the largest message).
  const int64_t cap = RoundUpToPage(options_.max_message_bytes);
  const bool outgrown =
      stream->has_segment() &&
      (stream->push_area() < std::min(cap, largest_push_.load(std::memory_order_relaxed)) ||
       stream->pull_area() < std::min(cap, largest_pull_.load(std::memory_order_relaxed)));
  const bool broken = stream->broken();
  if (!broken && !outgrown) {
    absl::MutexLock lock(&streams_mu_);
    idle_streams_.push_back(std::move(stream));
  }
  if (!result.ok()) {
    // A shard from before the stream ends it at once.
    *unsupported = broken && absl::IsUnimplemented(result.status());
    return Annotate(result.status(), absl::StrCat("shard ", address_));
  }
  if (!pulled_again.ok()) return pulled_again;
  return result;
}

absl::Status RemoteParameterShard::Call(Method method, const TensorMessage& request,
                                        absl::Time deadline, TensorMessage* response) {
  Connection& c =
      *connections_[next_.fetch_add(1, std::memory_order_relaxed) % connections_.size()];
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  const InFlight in_flight(this, &context);
  if (in_flight.refused()) return CallsCancelled();
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
  {
    // Cancelled: no stream (nor segment) is opened only to be refused.
    absl::MutexLock lock(&calls_mu_);
    if (calls_cancelled_) {
      return CallsCancelled();
    }
  }
  if (options_.use_streams && !streams_unsupported_.load(std::memory_order_relaxed)) {
    bool unsupported;
    absl::StatusOr<PushPullResponse> response =
        StreamPushPull(push, push_payload, pull, deadline, pull_payload, &unsupported);
    if (!unsupported) return response;
    // A shard from before the stream: unary from now on.
    streams_unsupported_.store(true, std::memory_order_relaxed);
  }
  ReportTransport("no streams; tensors go over the connection");
  TensorMessage message, reply;
  message.payload = push_payload;
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
