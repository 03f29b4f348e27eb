// SparseStore: the sparse embedding tables of one job on one parameter
// shard (issue 13): this shard's rows of every table of the job's model
// (spec/model_shape.h SparseTableInfo; EmbeddingLayer with sparse: true),
// each a SparseTable (ps/sparse_table.h) reserving from the shard's
// MemoryBudget. ParameterStore (ps/parameter_store.h) owns one per job with
// tables and hands it the `sparse` part of the job's pushes and pulls
// (proto/parameter_server.proto SparseRows), after its own exactly-once
// check: the store's Reserve/Settle cover the dense partitions and the rows
// of a request together, so this class sees each fresh request once.
//
// Tables: a table's optimizer is its own OptimizerSpec when it has one,
// else the job's, with ps/lr_schedule.h's defaults for fields left at zero;
// max_rows is divided over the job's shards (rounded up). A row belongs to
// shard SparseShardOf(row, num_shards) (spec/sparse_ids.h); a request naming
// a row of another shard, or outside the table's vocabulary, is refused.
//
// Consistency, as the dense partitions behave (ps/parameter_store.h):
// - ASYNC/SSP: a push's rows are applied at once, with the learning rate the
//   table's schedule gives at the job's progress: the sparse pushes received
//   (skipped ones too) times push_every over num_workers. version() counts
//   those pushes.
// - SYNC: a push's rows are held until every rank that counts (less the
//   backup workers; SetAbsentWorkers) has pushed the step, then each table
//   applies the mean over the ranks that brought gradients (a skipped push
//   is no contributor) of their summed gradients: per row, the ranks'
//   gradients added in increasing rank order whatever order they arrived in
//   (a row one rank did not touch gets nothing from it), times
//   1 / contributors, as the dense step's RankOrderedSum does, so the result
//   does not depend on arrival order. version() is then the step + 1. A push
//   of a step already completed (a straggler) is late and ignored; one ahead
//   of version() is refused (CheckStep).
// A non-finite gradient (ASYNC) or mean (SYNC) is not applied; the job's
// `diverged` callback is told. A row the budget refuses to create (a table
// without max_rows when the shard's --memory_limit is reached; see
// SparseTable::Lookup) fails the pull with ResourceExhausted carrying the
// table's message; in a push it also fails every later push and pull of the
// job (failure()), since a table may hold part of the update.
//
// Checkpoints: CaptureAt takes the tables' part of the shard's checkpoint
// (a SparseCapture: every row that exists, with its optimizer slots and
// counts, and version()) at the checkpoint's step, and Restore puts it back.
// A SYNC step's gradients held for ranks that have pushed it are not in a
// checkpoint: the workers push that step again after a restore, as they do
// the dense partitions'.
//
// Thread-safety: thread-safe. Tables lock per stripe; a SYNC step's held
// gradients, the ranks' presence and the pending capture are under one
// mutex, held while a completed step is applied (the next step cannot begin
// before it: its pushes come after their pulls of this step's version).
// Ownership: owns its tables and the gradients held for a SYNC step; the
// budget is borrowed and must outlive the store; a SparseCapture points to
// its store, which must outlive it.
#ifndef DOWNPOUR_PS_SPARSE_STORE_H_
#define DOWNPOUR_PS_SPARSE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/payload.h"
#include "common/wire_dtype.h"
#include "common/work_pool.h"
#include "proto/job.pb.h"
#include "proto/parameter_server.pb.h"
#include "ps/memory_budget.h"
#include "ps/sparse_table.h"
#include "spec/checkpoint_files.h"
#include "spec/model_shape.h"

namespace downpour {

class SparseStore;

// The sparse tables' part of one checkpoint of a shard (ShardSnapshot's
// sparse fields): the rows as they were at the capture's version, copied
// from the tables by the first of Take's callers and the store (which copies
// them before it applies anything past that version). Thread-compatible;
// Take may run beside the store's pushes and pulls.
class SparseCapture {
 public:
  SparseCapture(const SparseCapture&) = delete;
  SparseCapture& operator=(const SparseCapture&) = delete;

  int64_t version() const { return version_; }
  // Sets `info`'s has_sparse, sparse_version and sparse_tables, copying the
  // rows from the tables first if nobody has. `keep`: copies them into
  // `info`, so a later Take gets them too; else moves them there.
  void Take(ShardSnapshot* info, bool keep);

 private:
  friend class SparseStore;
  SparseCapture(SparseStore* store, int64_t version) : store_(store), version_(version) {}

  SparseStore* const store_;
  const int64_t version_;
  bool copied_ = false;  // Under store_->mu_; tables_ is immutable once set.
  std::vector<SparseTableSnapshot> tables_;
};

// One table's numbers, for metrics.
struct SparseTableStats {
  std::string name;  // "<layer>/table".
  int64_t rows = 0;
  int64_t evictions = 0;
  int64_t bytes = 0;
};

class SparseStore {
 public:
  // Called (outside every lock of the store) with one sentence when a
  // gradient is not finite: the job has diverged.
  using DivergedFn = std::function<void(const std::string& why)>;

  // The tables of `spec` (defaults applied and validated: ValidateJobSpec)
  // on shard `shard_index`, or null (OK) when the model has none.
  // InvalidArgument for a table's optimizer that ValidateSparseTableOptimizer
  // (spec/job_validation.h) refuses, as ValidateJobSpec did; ResourceExhausted
  // when the budget cannot hold a table's fixed part. `budget` may be null (no
  // limit). With `pool` (may be null; not owned, outlives the store), a SYNC
  // step's tables are summed and applied, an ASYNC/SSP push's tables
  // applied, and a pull's rows looked up, table by table on its threads.
  static absl::StatusOr<std::unique_ptr<SparseStore>> Create(const std::string& job_id,
                                                             const JobSpec& spec, int shard_index,
                                                             MemoryBudget* budget,
                                                             DivergedFn diverged,
                                                             WorkPool* pool = nullptr);
  ~SparseStore();
  SparseStore(const SparseStore&) = delete;
  SparseStore& operator=(const SparseStore&) = delete;

  int num_tables() const { return static_cast<int>(tables_.size()); }

  // One entry of a push's `sparse`: its table and where its rows' bytes
  // start in the payload (none for a skipped push).
  struct PushPiece {
    int table = 0;
    const SparseRows* rows = nullptr;  // Points into the request.
    size_t offset = 0;
    WireDtype dtype = WireDtype::kFloat32;
  };
  // Checks `request.sparse()`, whose bytes start at `offset` of `payload`,
  // and sets `*end` past them. InvalidArgument naming the table (and id):
  // an unknown or repeated table, a repeated id, an id outside the table or
  // of another shard, an unknown dtype, bytes missing. Reads no state.
  absl::StatusOr<std::vector<PushPiece>> ParsePush(const PushRequest& request,
                                                   const Payload& payload, size_t offset,
                                                   size_t* end) const;

  // SYNC: FailedPrecondition when `step` is ahead of version() (the worker
  // must pull it first). OK in ASYNC/SSP.
  absl::Status CheckStep(int64_t step) const;

  // Takes the rows of a fresh request with a non-empty `sparse` (`pieces`
  // from ParsePush): ASYNC/SSP applies them; SYNC holds them for the step
  // and applies the step once complete. Returns whether the push was late
  // (SYNC: its step had completed without it). ResourceExhausted as above,
  // or failure().
  // REQUIRES: the caller has made sure the request is applied once.
  absl::StatusOr<bool> Push(const PushRequest& request, const Payload& payload,
                            const std::vector<PushPiece>& pieces);

  // The worker ranks that push no more (ParameterStore::SetWorkers):
  // a SYNC step completes without them, at once when the others have
  // arrived. A rank no longer listed counts again from its next push.
  void SetAbsentWorkers(const std::vector<int>& ranks);

  // Checks `request.sparse()` (known tables, ids of this shard; ids may
  // repeat) and returns the bytes its rows take as FLOAT32. InvalidArgument
  // naming the table and id. Reads no state.
  absl::StatusOr<int64_t> PullBytes(const PullRequest& request) const;
  // Writes the rows of `request.sparse()` (checked by PullBytes) at `out`,
  // row-major, table after table in the order asked, and lists them in
  // `response->sparse` (FLOAT32). With exact_version (SYNC), the rows as
  // they were at version min_version exactly: at it, or one step past it
  // with the rows that step changed read from the values kept from before
  // it; FailedPrecondition when the tables are further on (or a restore
  // dropped what was kept). Missing rows are created;
  // ResourceExhausted (the table's message) when one cannot be. A read-only
  // pull (sparse_read_only: an evaluation's) changes nothing
  // (SparseTable::Peek): a missing row is answered with the values it would
  // be created with and is not created, no row is touched or evicted, and
  // no memory is reserved.
  absl::Status Pull(const PullRequest& request, char* out, PullResponse* response);

  // SYNC: steps completed; ASYNC/SSP: pushes with rows received.
  int64_t version() const { return version_.load(std::memory_order_acquire); }
  // What waiting for version `min_version` still waits for ("" when
  // nothing): the version, and in SYNC the ranks missing from the step.
  std::string Unmet(int64_t min_version) const;
  // OK, or the push failure that made the tables unusable.
  absl::Status failure() const;

  std::vector<SparseTableStats> Stats() const;
  // The tables' bytes and the gradients held for the SYNC step.
  int64_t MemoryBytes() const;
  // Every table's rows, in table order.
  std::vector<SparseTable::Snapshot> Snapshot() const;

  // Checkpoints. `captured` gets the tables' capture at version `step` once
  // the tables are at it: at once when they are (and in ASYNC/SSP, at
  // whatever version they are: their pushes apply without the store's lock,
  // so the rows are copied now, on the caller's thread), else (SYNC, below
  // it) from the push or SetAbsentWorkers that completes step - 1, after the
  // store's locks are let go. In SYNC the rows are copied off the push path
  // when they can be: by SparseCapture::Take (the checkpoint writer), unless
  // the push that applies step `step` comes first, which copies them before
  // it changes a row. Meanwhile step `step`'s pulls may create rows (at
  // their initial values, as good as absent) and, in a table at its
  // max_rows or the memory limit, evict some: the capture then lacks rows
  // those pulls evicted, as the run does. A SYNC capture asked for when the tables are past
  // `step` gets FailedPrecondition saying so. A later CaptureAt replaces a
  // pending one. `captured` must not call into this store.
  using CapturedFn = std::function<void(absl::StatusOr<std::shared_ptr<SparseCapture>>)>;
  void CaptureAt(int64_t step, CapturedFn captured);

  // Replaces every table's rows and version() with `snapshot`'s (this
  // shard's part of a checkpoint; its dense part is the caller's). A
  // snapshot without tables (written before checkpoints held them) leaves
  // the rows to start afresh, at the checkpoint's version: its step in SYNC,
  // its partitions' highest version in ASYNC/SSP. A table saved without
  // optimizer slots (a new job's initial weights) starts its rows' optimizer
  // state afresh. InvalidArgument naming the
  // table for a table missing, unknown or of another shape, or a row outside
  // the table's vocabulary or of another shard; ResourceExhausted naming the
  // table (SparseTable::Restore) when its rows do not fit the shard's memory
  // limit. REQUIRES: no push or pull of the job runs (it was just added).
  absl::Status Restore(const ShardSnapshot& snapshot);

 private:
  friend class SparseCapture;

  struct Table {
    SparseTableInfo info;
    OptimizerSpec optimizer;  // The table's own, or the job's.
    std::unique_ptr<SparseTable> rows;
  };
  // A rank's gradients held for the SYNC step: per table, ids and rows.
  struct Held {
    std::vector<std::vector<int64_t>> ids;
    std::vector<std::vector<float>> grads;
  };
  enum class Presence : uint8_t { kCounts, kAbsent, kJoining };

  SparseStore(std::string job_id, const JobSpec& spec, int shard_index, DivergedFn diverged,
              WorkPool* pool);
  // The SYNC step's mean gradient of table t over the ranks that arrived,
  // applied at `version`, the rows' values before it kept in previous_[t]
  // (each table's thread writes only its own); `*diverged` as ApplyRows's.
  absl::Status CompleteTable(int t, int64_t version, std::string* diverged)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Applies the SYNC step's `n` rows (mean gradients `grads`) to table t at
  // `version`, keeping their values from before in previous_[t]; `*diverged`
  // as ApplyRows's (nothing kept then: nothing changed).
  absl::Status ApplyStep(int t, const int64_t* ids, int64_t n, const float* grads, int64_t version,
                         std::string* diverged) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Drops every kept previous value (at each completed step, before the
  // step keeps its own, and at a restore).
  void DropPrevious() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool sync() const { return mode_ == ConsistencySpec::SYNC; }
  // Checks one row id of `table` against its vocabulary and this shard.
  // `where` starts the message ("push to job J").
  absl::Status CheckRow(const Table& table, int64_t id, const std::string& where) const;
  // Decodes piece `piece`'s gradients (ids_size() * dim floats) into `out`.
  void Decode(const Payload& payload, const PushPiece& piece, std::vector<float>* out) const;
  // Applies `n` rows to table `t` at the learning rate of `progress`; rows
  // that are not all finite are not applied, and `*diverged` says why
  // (`step` and `rank`, -1 for a SYNC step's mean, name them). `before` as
  // SparseTable::Apply's.
  absl::Status ApplyRows(int t, const int64_t* ids, int64_t n, const float* grads, int64_t progress,
                         int64_t step, int rank, std::string* diverged, float* before = nullptr);
  // ASYNC/SSP: decodes and applies the push's tables (each on the pool's
  // threads or the caller's), then counts the push in version(). A table
  // that fails (memory) or is not finite does not stop the others: the job
  // fails on it either way.
  absl::Status ApplyNow(const PushRequest& request, const Payload& payload,
                        const std::vector<PushPiece>& pieces);
  // SYNC: applies the step if its quorum has arrived, and starts the next.
  void MaybeCompleteStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the ranks that count have arrived (less the backup workers).
  bool StepComplete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `status` the store's failure (the first one stays).
  void Fail(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells `diverged_` the reasons found under mu_, and hands the captures
  // made ready under it to their CapturedFn.
  void ReportDiverged();
  // SYNC: a capture of the tables as they are now, at `version`, whose rows
  // are copied before the step `version` is applied.
  std::shared_ptr<SparseCapture> Freeze(int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies every table's rows into `capture`.
  void CopyRows(SparseCapture* capture) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_id_;
  const int shard_;
  const int num_shards_;
  const int num_workers_;
  const ConsistencySpec::Mode mode_;
  const int64_t steps_per_push_;
  const int backup_workers_;
  const DivergedFn diverged_;
  WorkPool* const pool_;       // May be null.
  std::vector<Table> tables_;  // Immutable after Create (the rows are not).

  std::atomic<int64_t> version_{0};
  std::atomic<bool> failed_{false};
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> divergences_ ABSL_GUARDED_BY(mu_);  // Not yet reported.
  std::vector<Presence> presence_ ABSL_GUARDED_BY(mu_);
  // SYNC: the step version_ in progress: which ranks have arrived, which
  // brought gradients, and their gradients.
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  int num_arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int num_contributors_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // SYNC: the values, before the last completed step (version
  // previous_version_ + 1), of the rows that step changed, per table, so an
  // exact pull of version previous_version_ reads every row as that step
  // read it. Replaced at each completed step; -1 when none is kept. Kept
  // as the step applies each row (no second lookup); indexed only when an
  // exact pull (a taker's, rare) first reads them.
  struct Previous {
    std::vector<int64_t> ids;
    std::vector<float> values;                    // [ids.size() * dim], in the order of ids.
    absl::flat_hash_map<int64_t, int64_t> index;  // Row id: its place in ids; empty until read.
  };
  std::vector<Previous> previous_ ABSL_GUARDED_BY(mu_);
  int64_t previous_version_ ABSL_GUARDED_BY(mu_) = -1;
  // SYNC checkpoints: the step a capture waits for (0: none) and who gets
  // it; the capture whose rows the tables still hold (copied before its
  // version's step is applied, unless nobody holds it any more); captures
  // to hand over once mu_ is let go.
  int64_t capture_at_ ABSL_GUARDED_BY(mu_) = 0;
  CapturedFn capture_fn_ ABSL_GUARDED_BY(mu_);
  std::weak_ptr<SparseCapture> frozen_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<CapturedFn, std::shared_ptr<SparseCapture>>> handoffs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_SPARSE_STORE_H_
