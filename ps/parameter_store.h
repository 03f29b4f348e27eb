// ParameterStore: the network-free heart of `downpour-ps`, one shard of the
// parameters of any number of jobs, implementing ParameterShard in memory.
//
// Each job's partitions hold their values, optimizer slots and version (the
// number of steps, SYNC, or pushes, ASYNC/SSP, applied to it). A job's
// progress, which drives its learning-rate schedule, is the version in SYNC
// and the pushes received from all workers, times the steps each stands
// for (push_every), divided by num_workers in ASYNC/SSP (see OptimizerSpec
// in proto/job.proto), so a schedule ends with
// the job whatever the mode; Adam's bias correction counts the updates
// actually applied to the partition. Retried pushes are applied once
// (ps/request_dedup.h). A SYNC step sums the workers' gradients in rank
// order whatever order they arrive in (ps/rank_ordered_sum.h: up to
// num_workers - 1 gradients held aside per partition, buffers kept across
// steps), so a SYNC step's result depends on which gradients count, never
// on the order they arrive in.
//
// Sparse embedding tables (issue 13): a job whose model has them gets a
// SparseStore (ps/sparse_store.h) beside its partitions, which takes the
// `sparse` part of its pushes (after the dense partitions' bytes, through
// the same exactly-once check, applied before the partitions so that a
// refused row leaves the partitions untouched) and of its pulls (rows after
// the partitions' bytes; with `sparse` set and `keys` empty, no partition).
// A pull waits for the tables' version as for the partitions'. A request may
// list no partition at all (a shard holding none of the job's partitions
// still gets each worker's rows of every step).
//
// Memory: with a MemoryBudget (the shard's --memory_limit), a job's
// partitions reserve their values, optimizer slots, spare arrays (with a
// checkpoint sink), SYNC sums and SYNC previous values from it when added,
// and give them back when the job is freed; the tables' rows reserve as they
// grow.
//
// SYNC exact versions: a worker killed between its pushes of a step to two
// partitions leaves one a step ahead of the other, and the worker that
// takes its rank over computes that step again from the parameters of the
// step, not from a mix. So a SYNC partition keeps the values it had before
// its last step (a copy made as the step completes, into a buffer kept with
// the partition) until a worker pushes its next step there, which none does
// before every partition of the job has reached its version; a pull with
// PullRequest.exact_version gets them.
//
// Thread-safety: thread-safe. The store locks per job and per partition, so
// pushes to different partitions apply in parallel; no store-wide lock is
// held while an optimizer runs. Ownership: the store owns every partition,
// its optimizer slots and the per-job bookkeeping; a dropped job's memory is
// freed once the last request or checkpoint capture using it is done.
#ifndef DOWNPOUR_PS_PARAMETER_STORE_H_
#define DOWNPOUR_PS_PARAMETER_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/work_pool.h"
#include "proto/job.pb.h"
#include "ps/checkpoint.h"
#include "ps/memory_budget.h"
#include "ps/parameter_shard.h"
#include "ps/shard_capture.h"
#include "ps/sparse_store.h"

namespace downpour {

class ParameterStore : public ParameterShard {
 public:
  // `budget` (not owned; may be null: no limit) must outlive the store; so
  // must `pool` (not owned; may be null), whose threads then apply a push's
  // dense partitions, complete a SYNC step's sparse tables, and look up a
  // pull's rows, table by table.
  explicit ParameterStore(MemoryBudget* budget = nullptr, WorkPool* pool = nullptr);
  ~ParameterStore() override;
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Hosts the partitions of `job_id` whose `shard == shard_index`,
  // initialised with InitParamRange(param, spec.seed(), ...) and zeroed
  // optimizer slots. Does nothing (OK) if the job is already hosted.
  // InvalidArgument, naming the field, for a spec that fails validation
  // (spec/job_validation.h; defaults are applied first) or a placement the
  // store cannot serve (a range outside its tensor, a partition placed twice).
  // `attempt` is the job's start hosted (Task.attempt): pushes of another
  // start (a cancelled run's, still in flight) are refused, and checkpoint
  // snapshots are stamped with it; 0 takes any. The model's sparse tables
  // are made here (ps/sparse_store.h: InvalidArgument naming a table whose
  // optimizer the shard cannot run). ResourceExhausted, in one sentence,
  // when the memory budget cannot hold the partitions. With `restore` (not
  // read when the job is already hosted), the
  // job is restored from it (as Restore does) before any push or pull can
  // find it: nothing is served from the fresh values meanwhile, and a
  // restore that fails leaves the job unhosted.
  absl::Status AddJob(const std::string& job_id, const JobSpec& spec, int shard_index,
                      const std::vector<PartitionPlacement>& partitions, int64_t attempt = 0,
                      const ShardSnapshot* restore = nullptr);

  // Stops hosting `job_id`: pending and later requests for it fail; waiting
  // pulls return Aborted ("job X was dropped"). No-op for an unknown job.
  void DropJob(const std::string& job_id);

  // Records that this shard cannot host `job_id` (AddJob failed): pushes and
  // pulls for it fail with FailedPrecondition carrying `why`, so workers fail
  // the job at once with the shard's reason instead of waiting for it.
  // DropJob forgets it.
  void RefuseJob(const std::string& job_id, const absl::Status& why);

  // The workers of `job_id` as the caller was last told (the coordinator's
  // Task; server/shard_runtime.cc passes no absent ranks in the task that
  // hosts a job, and says why), set under the job's lock, so that no push
  // is checked against one without the other (the sparse tables hear of
  // absent ranks just before):
  // - `absent_ranks`: the ranks that push no more, lost or finished
  //   (Task.absent_ranks). An absent rank stops counting: a SYNC step
  //   completes with the ranks present (at once, if they have all arrived),
  //   and SSP's bound and the final pull ignore it. A rank no longer listed
  //   counts again from its first push (the worker that took it over joins
  //   there).
  // - `rank_nodes`: the node holding each rank (Placement.worker_nodes, ""
  //   while lost), the only one whose pushes of the rank are taken
  //   (RequestId.worker_id); others get PermissionDenied. So a worker whose
  //   rank was handed on while it was cut off or stopped cannot push over
  //   the taker when it is back. Empty: pushes of any node are taken.
  // No-op for an unknown job.
  void SetWorkers(const std::string& job_id, const std::vector<int>& absent_ranks,
                  const std::vector<std::string>& rank_nodes);

  // OK when node `node` (exactly) holds worker rank `rank` of `job_id` as
  // SetWorkers last said, or the shard has not been told (or does not host
  // the job, which its requests then learn); PermissionDenied otherwise.
  // For callers that know a request's node for certain (its TLS
  // certificate).
  absl::Status CheckWorkerNode(const std::string& job_id, int rank, const std::string& node) const;

  // SYNC, by worker rank: pushes of `job_id` that came after their step had
  // completed without them (stragglers). Empty for an unknown job.
  std::vector<int64_t> LatePushes(const std::string& job_id) const;

  // By worker rank: the steps of `job_id` each rank has pushed here (its
  // highest step whose every partition on this shard arrived, + 1; a
  // checkpoint's on a restore), and in SYNC at least the steps every
  // partition here completed (a rank the backup workers left behind skips
  // the steps it missed). Empty for an unknown job.
  std::vector<int64_t> WorkerSteps(const std::string& job_id) const;

  // Request ids remembered for exactly-once delivery, over all workers of
  // `job_id` (bounded by RequestDedup::kWindow per worker plus those in
  // flight).
  int64_t RememberedRequests(const std::string& job_id) const;

  // Bytes the partitions of `job_id` hold: values, optimizer slots, spare
  // and lent copies (checkpoints), SYNC sums and previous values; and its
  // sparse tables' bytes.
  // 0 for an unknown job.
  int64_t MemoryBytes(const std::string& job_id) const;

  // The sparse tables of `job_id` (rows, evictions, bytes), in table order;
  // empty for an unknown job or one without tables.
  std::vector<SparseTableStats> SparseTables(const std::string& job_id) const;

  // Checkpoints. A push carrying checkpoint_step S starts a capture of the
  // job's partitions on this shard: in SYNC each partition is captured when
  // its version reaches S (which it has not passed: rank 0 marks the push of
  // step S - 1), in ASYNC/SSP each at once, at its version. Once all are
  // captured, `sink` gets the capture (with the workers' pushed steps and
  // the exactly-once windows), on the thread of the push that completed it,
  // holding no lock of the store; a partition found past S makes the capture
  // an error. One capture per job is in flight at a time. Without a sink,
  // checkpoint steps are ignored.
  //
  // A capture copies nothing on the push path: it borrows each partition's
  // arrays as they were at its version (ps/shard_capture.h). The writer
  // copies those no push has reached yet as soon as it takes the capture
  // (ShardCapture::Detach, while the workers compute); an update that comes
  // first reads the borrowed arrays and writes other ones
  // (ps/parameter_arrays.h). Both use spare arrays made when the job is added
  // with a sink set, so a shard that checkpoints keeps a second set of values
  // and optimizer slots (what a copy at each checkpoint needed too).
  //
  // The sparse tables are one more part of the capture (SparseStore::
  // CaptureAt): in SYNC taken when the tables' version reaches S (they
  // complete a step as a whole), before step S's rows are applied; in
  // ASYNC/SSP at once, their rows copied on the push's thread. In SYNC the
  // rows are copied by Detach on the writer's thread, unless the push that
  // applies step S comes first and copies them (under the tables' lock)
  // before it changes a row; tables past S make the capture an error.
  using CheckpointSink = std::function<void(ShardCapture)>;
  // REQUIRES: no job hosted yet.
  void SetCheckpointSink(CheckpointSink sink);

  // Puts `snapshot`, this shard's part of a checkpoint of `job_id`, into the
  // hosted job: partitions' values, slots, versions and updates, the
  // workers' pushed steps, the exactly-once windows, and the sparse tables'
  // rows and version (SparseStore::Restore: a checkpoint written before
  // checkpoints held them restarts the rows afresh). InvalidArgument, naming
  // the partition or table, when it does not match the job's here;
  // ResourceExhausted naming the table whose rows do not fit the shard's
  // memory limit. The checkpoint must be of the job's number of shards (a
  // job's spec, so its num_shards, is the same at every start).
  absl::Status Restore(const std::string& job_id, const ShardSnapshot& snapshot);

  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override;
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override;

 private:
  struct Job;
  struct Partition;
  struct Piece;
  class CaptureLease;

  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job_id) const;
  // Restore's work on `job` (hosted or not yet).
  absl::Status RestoreJob(Job* job, const ShardSnapshot& snapshot);
  // The partitions of `request` and where their bytes start in `payload`;
  // InvalidArgument / NotFound naming what is wrong.
  // The sparse rows (`*sparse`, empty for a request without) follow the
  // partitions' bytes.
  absl::StatusOr<std::vector<Piece>> ParsePush(const Job& job, const PushRequest& request,
                                               const Payload& payload,
                                               std::vector<SparseStore::PushPiece>* sparse) const;
  // Exactly once: true when `request` is fresh (reserved for this caller),
  // false when it was applied before; waits while another caller applies it.
  absl::StatusOr<bool> Reserve(Job& job, const PushRequest& request) const;
  // Ends the reservation; an applied push counts towards its worker's steps
  // (a push of rows alone only where the shard holds no partition of the
  // job: elsewhere the partitions' pushes count the step).
  void Settle(Job& job, const PushRequest& request, bool applied) const;
  // ASYNC/SSP: applies one partition's gradient (nothing for a skipped push).
  void ApplyNow(Job& job, const PushRequest& request, const Payload& payload, const Piece& piece,
                std::vector<float>* scratch) const;
  // SYNC: adds one partition's gradient to its step's sum (in rank order,
  // ps/rank_ordered_sum.h), and applies the mean once the step's quorum has
  // arrived. Returns whether the push came after its step had completed
  // (late).
  bool Accumulate(Job& job, const PushRequest& request, const Payload& payload, const Piece& piece,
                  std::vector<float>* scratch) const;
  // SYNC: applies partition `p`'s step if its quorum has arrived.
  // REQUIRES: p.mu is held.
  void MaybeCompleteStep(Job& job, Partition& p) const;
  // Checkpoint capture (see SetCheckpointSink).
  void BeginCapture(Job& job, int64_t step) const;
  // Lends partition `p`'s arrays (none: nullptr) to the job's capture of
  // `step`, or gives it the sparse tables' part (`tables`), or fails it with
  // `error`; a capture whole or failed is made ready for HandOver.
  // REQUIRES: p->mu is held.
  void Deliver(Job& job, int64_t step, Partition* p, const std::string& error,
               std::shared_ptr<SparseCapture> tables = nullptr) const;
  // Passes the job's ready captures to the sink.
  // REQUIRES: no lock of the job or its partitions is held.
  void HandOver(Job& job) const;

  MemoryBudget* const budget_;  // May be null.
  WorkPool* const pool_;        // May be null.
  CheckpointSink sink_;         // Set before jobs are hosted.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Status> refused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_PARAMETER_STORE_H_
