// The network-free heart of `downpour-ps`: one shard of the parameters of any
// number of jobs.
//
// ParameterShard is the interface workers use to push gradients and pull
// parameters; ParameterStore implements it in memory, and rpc/ adapts it to
// gRPC (ParameterServerService) and back (RemoteParameterShard), so callers
// cannot tell a local shard from a remote one.
//
// Thread-safety: ParameterShard implementations are thread-safe.
// ParameterStore locks per job and per partition, so pushes to different
// partitions apply in parallel; no store-wide lock is held while an optimizer
// runs. Ownership: the store owns every partition, its optimizer slots and the
// per-job bookkeeping; a dropped job's memory is freed once the last request
// using it returns.
#ifndef DOWNPOUR_CORE_PARAMETER_STORE_H_
#define DOWNPOUR_CORE_PARAMETER_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/params.h"
#include "proto/job.pb.h"
#include "proto/parameter_server.pb.h"

namespace downpour {

// Tensor bytes travelling beside a request or response header: one or more
// read-only pieces (e.g. the network buffers a message arrived in) whose
// concatenation is the partitions' bytes in header order. A piece is either
// borrowed (the caller keeps it alive while the payload is used) or kept
// alive by a shared owner. Copyable (pieces are shared, never copied);
// thread-compatible.
class Payload {
 public:
  void Append(const char* data, size_t size) { Append(data, size, nullptr); }
  void Append(const char* data, size_t size, std::shared_ptr<const void> owner);

  size_t size() const { return size_; }
  struct Piece {
    const char* data;
    size_t size;
    std::shared_ptr<const void> owner;  // Null when borrowed.
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Copies bytes [offset, offset + n) to `out`.
  // REQUIRES: offset + n <= size().
  void CopyTo(size_t offset, size_t n, char* out) const;

  // The bytes as one string (a copy; for tests and small payloads).
  std::string ToString() const;

 private:
  std::vector<Piece> pieces_;
  size_t size_ = 0;
};

// Bytes per element of a wire dtype (DTYPE_UNSPECIFIED is FLOAT32); 0 for an
// unknown one.
int WireBytesPerElement(DType dtype);

// Converts `n` floats to `dtype` at `out` (WireBytesPerElement(dtype) * n
// bytes), rounding to nearest even; and back. REQUIRES: a known dtype.
void EncodeGradients(DType dtype, const float* in, int64_t n, char* out);
void DecodeGradients(DType dtype, const char* in, int64_t n, float* out);

// One shard of the parameters of every running job.
class ParameterShard {
 public:
  virtual ~ParameterShard() = default;

  // Applies (or, in SYNC mode, accumulates) the gradients of `request`, whose
  // partitions' bytes are `payload`. A request whose request_id was applied
  // before answers duplicate = true and changes nothing.
  virtual absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) = 0;

  // Returns the requested partitions' headers (all of the job's partitions on
  // this shard when `keys` is empty) and sets `payload` to their bytes, once
  // each has version >= min_version and every worker has pushed >=
  // min_worker_steps steps; DeadlineExceeded, naming what it waited for, if
  // that has not happened by `deadline`.
  virtual absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                            Payload* payload) = 0;

  // Push(push, push_payload), then Pull(pull, deadline, pull_payload): one
  // network round trip for a remote shard. An error means the pull did not
  // complete; the push may or may not have been applied (retrying it with
  // the same request_id is safe). The default runs the two calls in turn.
  virtual absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push,
                                                    const Payload& push_payload,
                                                    const PullRequest& pull, absl::Time deadline,
                                                    Payload* pull_payload);

  // Conveniences for in-process callers: the bytes in the messages' own
  // `payload` fields (never used on the wire).
  absl::StatusOr<PushResponse> Push(const PushRequest& request);
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline);
};

class ParameterStore : public ParameterShard {
 public:
  // Sequences remembered per (job, worker_id) above the pruning floor, so
  // reordered requests are still applied once each. A request more than this
  // many sequences older than the newest is taken as already applied.
  static constexpr int kDedupWindow = 4096;

  ParameterStore();
  ~ParameterStore() override;
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Hosts the partitions of `job_id` whose `shard == shard_index`,
  // initialised with InitParamRange(params[tensor_id], spec.seed(), ...) and
  // zeroed optimizer slots. Does nothing (OK) if the job is already hosted.
  // InvalidArgument, naming the field, for a spec or placement the store
  // cannot serve (no workers, unknown optimizer, a range outside its tensor).
  absl::Status AddJob(const std::string& job_id, const JobSpec& spec, int shard_index,
                      const std::vector<ParamInfo>& params,
                      const std::vector<PartitionPlacement>& partitions);

  // Stops hosting `job_id`: pending and later requests for it fail; waiting
  // pulls return Aborted ("job X was dropped"). No-op for an unknown job.
  void DropJob(const std::string& job_id);

  // Records that this shard cannot host `job_id` (AddJob failed): pushes and
  // pulls for it fail with FailedPrecondition carrying `why`, so workers fail
  // the job at once with the shard's reason instead of waiting for it.
  // DropJob forgets it.
  void RefuseJob(const std::string& job_id, const absl::Status& why);

  // Ids of the hosted jobs, sorted.
  std::vector<std::string> JobIds() const;

  // Request ids remembered for exactly-once delivery, over all workers of
  // `job_id` (bounded by kDedupWindow per worker plus those in flight).
  int64_t RememberedRequests(const std::string& job_id) const;

  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override;
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override;

 private:
  struct Job;
  struct Partition;

  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job_id) const;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Status> refused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_CORE_PARAMETER_STORE_H_
