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

// One shard of the parameters of every running job.
class ParameterShard {
 public:
  virtual ~ParameterShard() = default;

  // Applies (or, in SYNC mode, accumulates) the gradients of `request`.
  // A request whose request_id was applied before answers duplicate = true
  // and changes nothing.
  virtual absl::StatusOr<PushResponse> Push(const PushRequest& request) = 0;

  // Returns the requested partitions (all of the job's partitions on this
  // shard when `keys` is empty) once each has version >= min_version and every
  // worker has pushed >= min_worker_steps steps; DeadlineExceeded, naming what
  // it waited for, if that has not happened by `deadline`.
  virtual absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline) = 0;
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

  // Ids of the hosted jobs, sorted.
  std::vector<std::string> JobIds() const;

  absl::StatusOr<PushResponse> Push(const PushRequest& request) override;
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline) override;

 private:
  struct Job;
  struct Partition;

  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job_id) const;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_CORE_PARAMETER_STORE_H_
