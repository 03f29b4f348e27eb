// RemoteParameterShard: a ParameterShard on another machine, reached over
// gRPC (the remote client of the three layers), so a worker cannot tell it
// from a local ParameterStore. Tensor bytes travel beside the header
// (rpc/tensor_wire.h): a push is sent from the caller's memory, a pull's
// payload refers to the buffers it arrived in.
//
// Thread-safe: calls may be made concurrently from any thread; they are
// spread over Options::num_channels connections, because one HTTP/2
// connection (one socket, one gRPC poller) does not fill loopback or a fast
// link. PushPull exchanges travel on long-lived bidirectional streams, so a
// step boundary pays for no new HTTP/2 stream and the calling thread polls
// for its own answer. A shard on the same host lends each stream a shared
// memory segment (rpc/shared_segment.h): the exchange's tensor bytes go
// through it and only the headers through the connection. Every call has a
// deadline; errors come back as absl::Status prefixed with the shard's
// address ("shard HOST:PORT: ...").
#ifndef DOWNPOUR_RPC_REMOTE_PARAMETER_SHARD_H_
#define DOWNPOUR_RPC_REMOTE_PARAMETER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "ps/parameter_shard.h"
#include "rpc/tensor_wire.h"

namespace downpour {

class RemoteParameterShard final : public ParameterShard {
 public:
  struct Options {
    // Deadline of one Push call (one attempt; the caller decides whether
    // and for how long to retry: ExchangeOptions::push_timeout).
    absl::Duration push_attempt_timeout = absl::Seconds(30);
    // Largest message received (a Pull of many partitions can be large).
    int max_message_bytes = 256 << 20;
    // Connections to the shard; calls go round-robin.
    int num_channels = 4;
    // PushPull exchanges go over long-lived /PushPullStream streams (one per
    // concurrent caller, kept open between calls) instead of a unary call
    // each. A stream that fails or times out is closed and the call fails
    // as a unary one would (the caller's retry opens a new stream); a shard
    // without the method is called unary from then on.
    bool use_streams = true;
    // A stream first asks the shard to map a shared memory segment of this
    // process (/PushPullSharedMemoryStream), through which its exchanges'
    // tensor bytes then travel. A shard on another host, of another user,
    // older or with shared memory off refuses, and this client stops asking
    // it: its streams carry the bytes themselves.
    bool use_shared_memory = true;
    // Told once, at the first PushPull, whether shared memory is used with
    // this shard and if not why (null: not told).
    std::function<void(const std::string&)> log;
    // TLS (rpc/security.h: MakeChannelCredentials); null: plaintext.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    // Tests: a stream exchange whose deadline passed sleeps this long
    // before it cancels the call (a worker frozen just then: SIGSTOP, a
    // paused VM), so the shard's answer arrives meanwhile.
    absl::Duration testing_stall_at_deadline = absl::ZeroDuration();
  };

  // Connects (lazily, with options.credentials) to the shard at `address`
  // (HOST:PORT).
  static std::unique_ptr<RemoteParameterShard> Create(const std::string& address,
                                                      const Options& options);
  static std::unique_ptr<RemoteParameterShard> Create(const std::string& address) {
    return Create(address, Options());
  }

  // Uses existing channels to `address` (named in errors).
  // REQUIRES: !channels.empty().
  RemoteParameterShard(std::string address, std::vector<std::shared_ptr<grpc::Channel>> channels,
                       const Options& options);

  using ParameterShard::Pull;
  using ParameterShard::Push;
  // REQUIRES: borrowed payload pieces stay valid until the call returns.
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override;
  // `deadline` becomes the call's gRPC deadline; the shard answers
  // DeadlineExceeded, naming what it waited for, shortly before it.
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override;
  // One call: the shard applies the push, then answers the pull. `deadline`
  // bounds both, as for Pull.
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload) override;

  // Every call in flight ends with Cancelled, and every later one fails so
  // at once (see ParameterShard).
  void CancelCalls() override;

  const std::string& address() const { return address_; }

  // What went through shared memory segments so far, over every stream.
  struct SharedMemoryStats {
    int64_t segments = 0;  // Attached.
    int64_t push_bytes = 0;
    int64_t pull_bytes = 0;
    // Exchanges signalled through a segment's doorbell (not sent over the
    // connection).
    int64_t signalled = 0;
  };
  SharedMemoryStats shared_memory_stats() const;

  ~RemoteParameterShard() override;

 private:
  struct Connection {
    std::shared_ptr<grpc::Channel> channel;
    grpc::internal::RpcMethod push;
    grpc::internal::RpcMethod pull;
    grpc::internal::RpcMethod push_pull;
    grpc::internal::RpcMethod push_pull_stream;
    grpc::internal::RpcMethod push_pull_shared_memory_stream;
  };
  enum class Method { kPush, kPull, kPushPull };
  absl::Status Call(Method method, const TensorMessage& request, absl::Time deadline,
                    TensorMessage* response);
  class Stream;
  // Registers a call's context, which CancelCalls cancels, for the
  // registration's lifetime; refused() (nothing registered) once the calls
  // are cancelled.
  class InFlight;
  // What a call of this client says once its calls are cancelled.
  absl::Status CallsCancelled() const;
  // One exchange on an idle stream (or a new one); the stream goes back to
  // the idle list only if the exchange left it usable and its segment is
  // large enough for the largest exchange seen. `*unsupported`: the shard
  // has no streams.
  absl::StatusOr<PushPullResponse> StreamPushPull(const PushRequest& push,
                                                  const Payload& push_payload,
                                                  const PullRequest& pull, absl::Time deadline,
                                                  Payload* pull_payload, bool* unsupported);
  // A new stream, with a shared memory segment sized for a push of
  // `push_bytes` when the shard takes one.
  absl::StatusOr<std::unique_ptr<Stream>> OpenStream(int64_t push_bytes, absl::Time deadline);
  // Tells options_.log `message`, the first time only.
  void ReportTransport(const std::string& message);

  const std::string address_;
  const Options options_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::atomic<uint64_t> next_{0};
  std::atomic<bool> streams_unsupported_{false};
  std::atomic<bool> shared_memory_refused_{false};
  std::atomic<bool> transport_reported_{false};
  // The largest push and pull payloads seen: new segments are sized for them.
  std::atomic<int64_t> largest_push_{0};
  std::atomic<int64_t> largest_pull_{0};
  std::atomic<int64_t> segments_attached_{0};
  std::atomic<int64_t> segment_push_bytes_{0};
  std::atomic<int64_t> segment_pull_bytes_{0};
  // Streamed exchanges by the way they went, and pulls done again.
  enum Way { kSignalled, kNoDoorbell, kPullAreaHeld, kPushTooLarge, kHeaderTooLarge, kNumWays };
  std::atomic<int64_t> ways_[kNumWays] = {};
  std::atomic<int64_t> pulled_again_{0};
  // Before the idle streams: a stream is registered while it exists.
  absl::Mutex calls_mu_;
  bool calls_cancelled_ ABSL_GUARDED_BY(calls_mu_) = false;
  std::vector<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(calls_mu_);
  absl::Mutex streams_mu_;
  std::vector<std::unique_ptr<Stream>> idle_streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_REMOTE_PARAMETER_SHARD_H_
