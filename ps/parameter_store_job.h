// The per-job state of ParameterStore (ps/parameter_store.h): a hosted
// partition (values, optimizer slots, version, SYNC sum) and a hosted job
// (its partitions, workers' progress and presence, exactly-once window,
// checkpoint capture, sparse tables). Private to the store's implementation
// (ps/parameter_store.cc); nothing else includes it.
//
// Thread-safety and locking: as each field's comment and annotations say.
// Lock order: a partition's mu, then the job's capture_mu, then its mu.
#ifndef DOWNPOUR_PS_PARAMETER_STORE_JOB_H_
#define DOWNPOUR_PS_PARAMETER_STORE_JOB_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/optimizer.h"
#include "proto/job.pb.h"
#include "ps/memory_budget.h"
#include "ps/parameter_arrays.h"
#include "ps/parameter_store.h"
#include "ps/published_copy.h"
#include "ps/rank_ordered_sum.h"
#include "ps/request_dedup.h"
#include "ps/shard_capture.h"
#include "ps/sparse_store.h"

namespace downpour {
namespace store_internal {

// A partition's key: (tensor id, partition).
using KeyPair = std::pair<int32_t, int32_t>;

inline std::string KeyName(int32_t tensor_id, int32_t partition) {
  return absl::StrCat(tensor_id, "/", partition);
}

}  // namespace store_internal

struct ParameterStore::Partition {
  Partition(int32_t tensor_id_in, int32_t partition_in, int64_t offset_in, int64_t n)
      : tensor_id(tensor_id_in), partition(partition_in), offset(offset_in), num_elements(n) {}

  std::string Name() const { return store_internal::KeyName(tensor_id, partition); }

  const int32_t tensor_id;
  const int32_t partition;
  const int64_t offset;
  const int64_t num_elements;

  absl::Mutex mu;
  // SYNC: steps completed; ASYNC/SSP: pushes received (skipped ones too).
  // Written under `mu`; read without it by pulls waiting on the job's
  // condition variable.
  std::atomic<int64_t> version{0};
  // Optimizer updates applied (Adam's t): fewer than the version when steps
  // were skipped.
  int64_t updates ABSL_GUARDED_BY(mu) = 0;
  // Values and optimizer slots; a checkpoint capture borrows them.
  ParameterArrays arrays ABSL_GUARDED_BY(mu);
  // SYNC: the gradients pushed for step == version, summed in rank order
  // whatever order they arrive in, and which ranks have pushed it (skipped
  // or not).
  RankOrderedSum step_sum ABSL_GUARDED_BY(mu);
  // SYNC: the checkpoint step at which this partition is to be captured (0:
  // none pending).
  int64_t capture_at ABSL_GUARDED_BY(mu) = 0;
  // SYNC: the values of the version before this one, kept for a pull of
  // that exact version (PullRequest.exact_version) until a worker pushes
  // the step of this version, which none does before every partition of
  // the job has reached it; previous_version is -1 while they are not kept.
  // The buffer stays (reserved with the partition) for the next step's.
  std::vector<float> previous ABSL_GUARDED_BY(mu);
  int64_t previous_version ABSL_GUARDED_BY(mu) = -1;
  // SYNC jobs whose workers pull INT8 changes (PullRequest.change_dtype):
  // the copy of the values they hold.
  PublishedCopy published ABSL_GUARDED_BY(mu);

  // Lends the arrays as they are now, for a capture (GiveBack ends it).
  PartitionArrays Lend(int64_t* generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ParameterArrays::Loan loan = arrays.Lend();
    *generation = loan.generation;
    PartitionArrays lent;
    lent.tensor_id = tensor_id;
    lent.partition = partition;
    lent.offset = offset;
    lent.version = version.load(std::memory_order_relaxed);
    lent.updates = updates;
    lent.num_elements = num_elements;
    lent.values = loan.values;
    lent.slots = std::move(loan.slots);
    return lent;
  }
};

struct ParameterStore::Job : std::enable_shared_from_this<Job> {
  ~Job() {
    if (budget != nullptr) budget->Release(reserved_bytes);
  }

  // Immutable after AddJob.
  std::string id;
  // The partitions' bytes reserved from `budget` (given back when freed).
  MemoryBudget* budget = nullptr;
  int64_t reserved_bytes = 0;
  // The sparse tables; null for a job without.
  std::unique_ptr<SparseStore> sparse;
  OptimizerSpec optimizer_spec;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  ConsistencySpec::Mode mode = ConsistencySpec::SYNC;
  int num_workers = 1;
  // ASYNC/SSP: the steps each push stands for (ConsistencySpec.push_every).
  int64_t steps_per_push = 1;
  // SYNC: arrivals that complete a step (num_workers - backup_workers).
  int sync_quorum = 1;
  // SYNC pulls as INT8 changes to a published copy
  // (JobSpec.parameter_wire_dtype), whose memory AddJob reserved.
  bool int8_pulls = false;
  std::vector<std::unique_ptr<Partition>> partitions;  // Sorted by key.
  absl::flat_hash_map<store_internal::KeyPair, Partition*> by_key;

  bool sync() const { return mode == ConsistencySpec::SYNC; }
  // The job's progress as of a partition at `version` (see the header).
  int64_t Progress(int64_t version) const {
    return sync() ? version : version * steps_per_push / num_workers;
  }

  absl::Mutex mu;
  // Signalled whenever a version, a worker's step count, an in-flight request
  // or `dropped` changes.
  absl::CondVar changed;
  bool dropped ABSL_GUARDED_BY(mu) = false;
  // Per worker rank: max pushed step + 1.
  std::vector<int64_t> worker_steps ABSL_GUARDED_BY(mu);
  // Per worker rank: whether it counts in SYNC quorums, SSP's bound and the
  // final pull. An absent rank (SetWorkers) counts again from the first
  // fresh push of the worker that took it over (kJoining until then); that
  // worker first pulled every partition at the step it pushes, so the rank
  // counts at every partition's version from then on.
  enum class Presence : uint8_t { kCounts, kAbsent, kJoining };
  std::vector<Presence> presence ABSL_GUARDED_BY(mu);
  // Some rank does not count (kept with `presence`): quorums look.
  std::atomic<bool> any_absent{false};
  // Per worker rank: the node holding it as the coordinator last placed the
  // job (Placement.worker_nodes; "" while the rank is lost). Empty until the
  // shard is told (SetWorkers): then a push of any node is taken.
  std::vector<std::string> rank_nodes ABSL_GUARDED_BY(mu);
  // OK when `sender` may act as worker `rank`: it holds the rank, or the
  // shard has not been told who does. `sender` is a node's id, proven (TLS)
  // and compared exactly, or with `streams` a push's RequestId.worker_id,
  // which may also be "<id>#<stream>" for another stream of the node's
  // requests (worker/sparse_exchange.h). PermissionDenied otherwise, which
  // the worker retries: a worker that took the rank over may be heard
  // before the coordinator's word.
  absl::Status CheckSender(int rank, absl::string_view sender, bool streams) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (rank_nodes.empty()) return absl::OkStatus();
    if (rank >= 0 && rank < static_cast<int>(rank_nodes.size()) && !rank_nodes[rank].empty()) {
      const std::string& node = rank_nodes[rank];
      if (sender == node || (streams && absl::StartsWith(sender, node) &&
                             sender.size() > node.size() && sender[node.size()] == '#')) {
        return absl::OkStatus();
      }
    }
    return absl::PermissionDeniedError(
        absl::StrCat("node ", sender, " is not worker rank ", rank, " of job ", id,
                     " (as this shard last heard from the coordinator)"));
  }
  // SYNC, per worker rank: pushes that arrived after their step completed
  // without them (a straggler the backup workers replaced).
  std::vector<int64_t> late_pushes ABSL_GUARDED_BY(mu);
  // Set once a non-finite gradient reached a partition: every later push and
  // pull of the job fails with `diverged`.
  std::atomic<bool> has_diverged{false};
  std::string diverged ABSL_GUARDED_BY(mu);

  void Diverge(const std::string& why) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (has_diverged.load()) return;
    diverged = why;
    has_diverged.store(true, std::memory_order_release);
    Log(absl::StrCat("job ", id, ": ", why));
    changed.SignalAll();
  }
  // What every push and pull fails with once the job has diverged, marked
  // (common/status.h), so the worker reports a divergence to the
  // coordinator without reading the words.
  absl::Status DivergedError() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return DivergedErrorLocked();
  }
  absl::Status DivergedErrorLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return MarkDiverged(absl::FailedPreconditionError(diverged));
  }

  bool Counts(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return presence[rank] == Presence::kCounts;
  }
  void UpdateAnyAbsent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    any_absent.store(std::any_of(presence.begin(), presence.end(),
                                 [](Presence p) { return p != Presence::kCounts; }),
                     std::memory_order_release);
  }
  // SYNC: whether a step's arrivals (`sum`'s) complete it: the ranks that
  // count have arrived, less the backup workers, at least one. A rank that
  // arrived and then went absent (it finished: its push was the last)
  // brings its gradient but stands in for no rank that counts; with none
  // counting, any arrival completes the step.
  bool StepComplete(const RankOrderedSum& sum) ABSL_LOCKS_EXCLUDED(mu) {
    if (sum.num_arrived() == 0) return false;
    if (!any_absent.load(std::memory_order_acquire)) return sum.num_arrived() >= sync_quorum;
    absl::MutexLock lock(&mu);
    int counting = 0, counted = 0;
    for (int rank = 0; rank < num_workers; ++rank) {
      if (!Counts(rank)) continue;
      ++counting;
      if (sum.arrived(rank)) ++counted;
    }
    return counting == 0 || counted >= std::max(1, counting - (num_workers - sync_quorum));
  }
  // Per worker rank: partitions applied so far of steps pushed in several
  // requests (PushRequest.partitions_in_step), by step.
  std::vector<std::map<int64_t, int64_t>> partial_steps ABSL_GUARDED_BY(mu);
  RequestDedup requests ABSL_GUARDED_BY(mu);

  int shard = 0;        // Immutable after AddJob.
  int64_t attempt = 0;  // Immutable after AddJob.
  // The checkpoint capture in flight (step 0: none), and the last step one
  // was started for. Lock order: a partition's mu, then capture_mu, then mu.
  absl::Mutex capture_mu;
  int64_t capture_step ABSL_GUARDED_BY(capture_mu) = 0;
  int64_t last_capture_step ABSL_GUARDED_BY(capture_mu) = 0;
  size_t capture_expected ABSL_GUARDED_BY(capture_mu) = 0;
  // The partitions' arrays lent to the capture so far, and the generation
  // of each loan.
  std::vector<PartitionArrays> captured ABSL_GUARDED_BY(capture_mu);
  std::vector<std::pair<Partition*, int64_t>> loans ABSL_GUARDED_BY(capture_mu);
  // The sparse tables' part of the capture, once they reached its step
  // (counted in capture_expected as one more part).
  std::shared_ptr<SparseCapture> captured_tables ABSL_GUARDED_BY(capture_mu);
  // Captures complete or failed, for HandOver to pass to the sink; `any_ready`
  // lets pushes skip the locks when there are none.
  std::vector<ShardCapture> ready ABSL_GUARDED_BY(capture_mu);
  std::atomic<bool> any_ready{false};
  // Held while handing captures to the sink (outside every other lock of
  // the job, so a sink may drop a capture at once), keeping their order.
  absl::Mutex handover_mu;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_PARAMETER_STORE_JOB_H_
