// ParameterServerService: the gRPC face of a ParameterShard (the server
// adapter of the three layers; the logic lives in ps/parameter_store).
// Push, Pull and PushPull (a push then a pull, one round trip) are unary
// RPCs, PushPullStream carries PushPull exchanges on long-lived streams
// (callback API), and PushPullSharedMemoryStream does too with the tensor
// bytes in a shared memory segment of a worker on this host, mapped for as
// long as the stream lasts (rpc/shared_segment.h). Otherwise the bytes travel
// beside the header
// (rpc/tensor_wire.h): a push is applied straight from the buffers it arrived
// in, a pull answers from one snapshot buffer without another copy. Each call
// runs on its own server thread, so concurrent pushes of different
// partitions are applied in parallel (the store locks per partition).
//
// Thread-safe (the shard is). Does not own the shard, which must outlive the
// service. A Pull waits on the handling thread until its condition holds or
// the call's deadline (capped at Options::max_pull_wait) passes; the server's
// thread pool must allow for as many concurrent waiting pulls as workers.
#ifndef DOWNPOUR_RPC_SHARD_SERVICE_H_
#define DOWNPOUR_RPC_SHARD_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/service_type.h"
#include "proto/parameter_server.pb.h"
#include "ps/parameter_shard.h"
#include "rpc/shared_segment.h"
#include "rpc/tensor_wire.h"

namespace downpour {

class ParameterServerService final : public grpc::Service {
 public:
  struct Options {
    // Longest a Pull waits, whatever (or without) the caller's deadline.
    absl::Duration max_pull_wait = absl::Seconds(60);
    // Set where callers prove who they are (TLS): every request must come
    // from a node certificate (rpc/auth.h), and this says whether node
    // `peer` may push and pull as rank `rank` of job `job_id`.
    std::function<absl::Status(const std::string& peer, const std::string& job_id, int rank)>
        authorize;
    // Map the shared memory segments of workers on this host
    // (/PushPullSharedMemoryStream); false: that stream is refused, and the
    // workers send their bytes over the connection.
    bool shared_memory = true;
    // Answer the exchanges a worker signals through its segment's doorbell
    // (rpc/segment_doorbell.h) on a thread of the stream's; false (the
    // shard's --doorbell=false, as a shard from before the doorbell): their
    // headers go over the connection.
    bool doorbell = true;
    // Observes each exchange answered through a doorbell, from the shard's
    // thread taking its signal to its answer (such exchanges pass through no
    // gRPC handler, so the server's handling histogram does not see them);
    // null: not observed.
    Histogram* signalled_seconds = nullptr;
    // What one worker process may have mapped at once; a stream past it
    // carries its bytes over the connection.
    int max_segments_per_worker = 64;
    int64_t max_segment_bytes_per_worker = int64_t{4} << 30;
  };

  explicit ParameterServerService(ParameterShard* shard) : ParameterServerService(shard, {}) {}
  ParameterServerService(ParameterShard* shard, Options options);
  // Waits for the streams' doorbell threads, which outlive their streams
  // until their exchange in hand is answered (a pull's wait is cut short).
  ~ParameterServerService() override;

  grpc::Status Push(grpc::ServerContext* context, const TensorMessage* request,
                    TensorMessage* response);
  grpc::Status Pull(grpc::ServerContext* context, const TensorMessage* request,
                    TensorMessage* response);
  grpc::Status PushPull(grpc::ServerContext* context, const TensorMessage* request,
                        TensorMessage* response);

  // The shared memory segments mapped now, over every worker.
  const SharedSegmentQuota& shared_segments() const { return segment_quota_; }

 private:
  // The deadline a pull waits until: the caller's (capped at max_pull_wait),
  // less a margin.
  absl::Time PullDeadline(const grpc::ServerContext& context) const;
  absl::Time PullDeadline(absl::Time deadline) const;
  // OK when options_.authorize admits node `peer` ("" without a node
  // certificate) to job `job_id` as rank `rank`; AdmitExchange, to both
  // halves of a push-pull.
  // The node the caller's certificate names, read only when
  // options_.authorize is set ("" otherwise).
  std::string CallerOf(const grpc::ServerContextBase& context) const;
  absl::Status Admit(const std::string& peer, const std::string& job_id, int rank) const;
  absl::Status AdmitExchange(const std::string& peer, const PushPullRequest& exchange) const;

  // Serves /PushPullStream: PushPull exchanges, one after the other, on a
  // long-lived stream, handled by the callback API on the thread that read
  // the request (no hand-off to a handler thread). A pull that has to wait
  // (SYNC, SSP) waits on a thread of its own, not on gRPC's. Serves
  // /PushPullSharedMemoryStream too.
  class PushPullStreamReactor;
  // Checks and maps the segment a shared-memory stream's first message
  // describes, counted against its worker's quota until `*reservation` is
  // released. `address` is the connection's (grpc::ServerContext::peer):
  // only a caller on this host, a unix socket or one of this network
  // namespace's own addresses, is heard, so no other machine can have the
  // shard look into its host's processes.
  absl::StatusOr<std::shared_ptr<SharedSegment>> AttachSegment(
      const std::string& peer, const std::string& address, const PushPullStreamRequest& request,
      std::unique_ptr<SharedSegmentQuota::Reservation>* reservation);

  // The streams' doorbell threads running (of streams ended or not), which
  // the destructor waits for; each holds the count until it has said it
  // ended.
  struct Running {
    absl::Mutex mu;
    int threads ABSL_GUARDED_BY(mu) = 0;
    void Add(int n) ABSL_LOCKS_EXCLUDED(mu) {
      absl::MutexLock lock(&mu);
      threads += n;
    }
  };

  ParameterShard* const shard_;
  const Options options_;
  SharedSegmentQuota segment_quota_;
  const std::shared_ptr<Running> doorbells_ = std::make_shared<Running>();
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SHARD_SERVICE_H_
