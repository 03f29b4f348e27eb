// InputStage: the model input of a job whose model has named inputs
// (ModelSpec.inputs): each batch's dense inputs packed into their slots and,
// for sparse embeddings, the rows the batch reads pulled from the shards and
// pooled into theirs (worker/sparse_batch.h, worker/sparse_exchange.h).
//
// A training step: Features(step, batch) gives the step's input — its rows
// came back with the last step's exchange (Exchange(..., next = this batch)),
// or are pulled now (the first step); after the step's backward,
// Exchange(step, model, next) sends the rows' gradients and asks for the
// next batch's rows in one request per shard, in the background, while the
// trainer exchanges the dense partitions. PlanAhead(next), called while
// the step computes, works out which rows `next` reads (SparseBatch::Plan)
// on a thread of the stage's, so Exchange finds the plan made. Evaluation
// reads rows without creating them (EvalFeatures). Planning, pooling the
// rows and their gradients run table by table on the stage's threads
// (`table_threads`).
//
// Tables with embedding_staleness k > 0 keep their rows (worker/row_cache.h)
// and are read otherwise: PlanAhead also pulls the rows `next` lacks (none
// kept recent enough) on a lane of their own, once the tables have had
// next's step - k steps, while the step computes; the push of a step then
// asks for no rows of those tables, and the next step's input waits only
// for that pull (when every table is kept, PlanAhead's task also takes the
// rows while the step computes, and pools next's input too unless the
// device pools it: then the task lays out the reads of the device's block
// and the step copies them there). Where the device pools a step's rows, kept tables' rows stay on
// it between steps, by their place in the cache: a block carries each
// row's place and the rows the cache took since the block before, not
// every row the batch reads. The push lane's answer still comes once the shards have applied
// the step (its pull asks for no rows at the step's version), and the next
// push waits for it, so no push reaches a shard a step early.
//
// Thread-compatible: one trainer drives it.
#ifndef DOWNPOUR_WORKER_INPUT_STAGE_H_
#define DOWNPOUR_WORKER_INPUT_STAGE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "data/dataset.h"
#include "model/model.h"
#include "ps/parameter_shard.h"
#include "spec/model_shape.h"
#include "worker/param_exchange.h"
#include "worker/row_cache.h"
#include "worker/sparse_batch.h"
#include "worker/sparse_exchange.h"

namespace downpour {

class InputStage {
 public:
  // `shape` must outlive the stage; `options` as the dense exchange's.
  // `sync`: the job is SYNC (a kept row's stamp is the tables' version, not
  // the step it was pulled for).
  InputStage(const ModelShape& shape, ExchangeOptions options, std::vector<ParameterShard*> shards,
             std::function<bool()> cancelled, int table_threads = 0, bool sync = true);

  // The model input of `batch`, step `step`'s (batch.size * input_size
  // floats, slot-major), valid until the next call. Pulls its rows once the
  // tables have had min_version steps and every worker min_worker_steps,
  // unless the last Exchange (and PlanAhead) brought them (then waits for
  // those pulls). `exact_version` (SYNC; a step whose rows no Exchange
  // brought): the rows as they were at min_version exactly
  // (SparseExchange::Begin), FailedPrecondition when a shard no longer
  // keeps them. With `staging` (room for the batch's input; the model's,
  // ModelRunner::FeatureStaging) the input is packed there, not into the
  // stage's own buffer, unless it was packed ahead (then it is returned
  // from there). With `pool_on_device` too (a GPU model's PooledStaging),
  // only the dense slots are packed there: the rows go into the block it
  // gives and the step pools them (pooled_on_device() is then true until
  // the step's Exchange; the step trains with TrainStepOptions::pooled_rows).
  // A block the device has no room for (ResourceExhausted): pooled here.
  // Kept tables' rows stay on the device between steps where it pools
  // them (`stored`: per table the cache's places and the rows written since
  // the last block; the block then carries each row's place and those
  // rows, not every row).
  using PoolOnDevice = std::function<absl::StatusOr<std::vector<PooledRows>*>(
      int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
      const std::vector<StoredRows>& stored)>;
  absl::StatusOr<const float*> Features(int64_t step, const data::Batch& batch, int64_t min_version,
                                        int64_t min_worker_steps, bool exact_version = false,
                                        float* staging = nullptr,
                                        const PoolOnDevice& pool_on_device = nullptr);
  // The last Features' rows go to the device to be pooled there.
  bool pooled_on_device() const { return pooled_ != nullptr; }
  // After the step's backward on `model` (its input gradient, or the rows'
  // gradients it computed when pooled_on_device()): pushes the
  // rows' gradients as step `step`'s and, with `next`, pulls next's rows
  // (the next Features call must be for `next`). Returns at once.
  // `checkpoint_step` > 0: the push asks the shards for a checkpoint at
  // that step (rank 0; SparseExchange::Begin).
  absl::Status Exchange(int64_t step, const Model& model, const data::Batch* next,
                        int64_t min_version, int64_t min_worker_steps, int64_t checkpoint_step = 0);
  ~InputStage();
  InputStage(const InputStage&) = delete;
  InputStage& operator=(const InputStage&) = delete;

  // Starts working out which rows `next` (step `step`'s batch) reads, and
  // pulling those of kept tables it lacks (min_version and min_worker_steps
  // as Exchange's for `next`); Exchange(..., next) for the same batch takes
  // the plan. Returns at once. `next` must stay as it is until its step's
  // Features (or AwaitPlan).
  void PlanAhead(int64_t step, const data::Batch* next, int64_t min_version,
                 int64_t min_worker_steps);
  // How many batches ahead of the step PlanAhead may be given (each once
  // the step before it has had its Features): 2 where every table keeps
  // its rows (while step s computes, batch s + 1's rows are taken into the
  // cache, and its input pooled unless the device pools it, and s + 2 is
  // planned and its missing rows pulled), else 1.
  int plan_depth() const { return depth_; }
  // Waits until no task reads the batches PlanAhead was given (two ahead, a
  // task pooling the batch before its own on the host): before the caller
  // moves the next one out.
  void AwaitBatch();
  // Waits for every plan PlanAhead started (before their batches go).
  void AwaitPlan();
  // Waits for the exchange in flight, if any.
  absl::Status Finish();
  // The version the sparse tables are at, the least over the shards (a pull
  // of no rows; a sparse() stage only).
  absl::StatusOr<int64_t> TablesVersion();
  // The input of a test batch, its rows read without creating any (once the
  // tables have had min_version steps and every worker min_worker_steps):
  // BeginEvalFeatures plans the batch and starts pulling its rows, returning
  // at once; AwaitEvalRows waits for them; EvalFeatures (which waits for
  // them too, where AwaitEvalRows was not called) lays the input out into
  // `staging` where not null, else into `storage` (resized). With
  // pool_on_device and `on_device`, the rows go into the device's block
  // (as a training step's; *on_device says they did: not where the device
  // has no room for it) and only the dense inputs into `staging`. `batch`
  // must stay as it is until its EvalFeatures; pooling on the device needs
  // `staging`. BeginEvalFeatures and AwaitEvalRows touch nothing a training
  // step uses, nor the input an EvalFeatures returned: once a batch's
  // EvalFeatures has returned, the next batch may be begun and awaited on
  // another thread while the model evaluates this one (not while it trains;
  // nor beside NewEvaluation, EndEvaluation or the eval_rows counts).
  // NewEvaluation starts an evaluation: rows read for its batches serve the
  // batches after them (up to about 256 MiB of them; pulled again after
  // that), not the next evaluation's; EndEvaluation lets them go.
  void NewEvaluation();
  void EndEvaluation();
  // Tests: the evaluation's rows kept up to `bytes` (kEvalCacheBytes, the
  // default).
  static constexpr int64_t kEvalCacheBytes = int64_t{256} << 20;
  void SetEvalCacheBytesForTesting(int64_t bytes) { eval_cache_bytes_ = bytes; }
  absl::Status BeginEvalFeatures(const data::Batch& batch, int64_t min_version,
                                 int64_t min_worker_steps);
  absl::Status AwaitEvalRows();
  absl::StatusOr<const float*> EvalFeatures(const data::Batch& batch, float* staging,
                                            std::vector<float>* storage,
                                            const PoolOnDevice& pool_on_device = nullptr,
                                            bool* on_device = nullptr);

  bool sparse() const { return exchange_ != nullptr; }
  // Since NewEvaluation: rows the test batches read (per batch, each once)
  // and rows pulled for them.
  int64_t eval_rows_read() const { return eval_rows_read_; }
  int64_t eval_rows_pulled() const { return eval_rows_pulled_; }
  int64_t rows_pushed() const { return exchange_ ? exchange_->rows_pushed() : 0; }
  int64_t rows_pulled() const {
    return (exchange_ ? exchange_->rows_pulled() : 0) + (prefetch_ ? prefetch_->rows_pulled() : 0);
  }
  // Rows of kept tables read from the cache instead of pulled.
  int64_t rows_kept() const { return rows_kept_; }
  // Rows of kept tables sent to the device's store (the others it read
  // there as earlier steps left them).
  int64_t rows_to_device() const { return rows_to_device_; }

  // Where PlanAhead's tasks spent their time, in all, beside the steps:
  // planning their batches, looking rows up in and taking them into the
  // cache, waiting for the missing rows' pull, pooling the input (or, where
  // the device pools it, laying out its block's reads). Read once no task
  // runs (after Finish or AwaitPlan).
  struct AheadSeconds {
    int64_t batches = 0;  // Planned.
    int64_t taken = 0;    // Whose rows a task took into the cache,
    int64_t pooled = 0;   // and whose input it pooled.
    double plan = 0, cache = 0, pull = 0, pool = 0;
  };
  const AheadSeconds& ahead_seconds() const { return ahead_; }
  // Of the steps' Features, the time spent laying their input out (the
  // dense inputs packed and the rows pooled, or laid into the device's
  // block); the rest waited for rows and plans.
  double lay_seconds() const { return lay_seconds_; }
  // Of lay_seconds, asking the device for its block (Model::PooledStaging).
  double block_seconds() const { return block_seconds_; }
  // The push lane's exchanges (each step's row gradients, with the next
  // batch's rows where they are not kept): their round trips with their
  // slowest shards and those shards' part of them
  // (SparseExchange::round_trip_seconds).
  double round_trip_seconds() const {
    return exchange_ != nullptr ? exchange_->round_trip_seconds() : 0;
  }
  double shard_seconds() const { return exchange_ != nullptr ? exchange_->shard_seconds() : 0; }

 private:
  using Rows = std::vector<std::vector<const float*>>;  // [table][shard]
  // The rows `plan`'s step pools: the others' from the push lane's last
  // pull and, with `gather`, kept tables' gathered from the cache into
  // kept_values_ (else none: the push lane's pull may be in flight).
  // `plan` was the last one taken.
  Rows TrainingRows(const SparseBatch& plan, bool gather);
  // Kept table t's part of a block the device keeps its rows for: each
  // row's place in the cache and the places written since the last block.
  absl::Status WriteStored(int t, PooledRows* block);
  // Packs `batch` into `features` (batch.size * input_size floats): its
  // dense inputs and, with `plan`, its sparse slots pooled from `rows`.
  void PackInto(const data::Batch& batch, const SparseBatch* plan, const Rows& rows,
                float* features);
  // Where `batch`'s input goes: `staging`, or else `features` resized.
  float* Destination(const data::Batch& batch, float* staging, std::vector<float>* features);
  struct Planned;
  // PackInto `staging` or features_ with the plan's TrainingRows; with
  // pool_on_device, only the dense slots, the rows into its block (kept
  // tables' by place: WriteStored). `ahead`: the batch as planned ahead;
  // its block's reads, if laid out there (LayReads), are copied into the
  // block rather than laid out here.
  absl::StatusOr<const float*> Pack(const data::Batch& batch, const SparseBatch* plan,
                                    float* staging, const PoolOnDevice& pool_on_device = nullptr,
                                    const Planned* ahead = nullptr);
  // Pack, timed into lay_seconds_ (a training step's).
  absl::StatusOr<const float*> TimedPack(const data::Batch& batch, const SparseBatch* plan,
                                         float* staging, const PoolOnDevice& pool_on_device,
                                         const Planned* ahead = nullptr);
  // Lays out the reads of p's plan for the device's block (what
  // SparseBatch::WritePooled writes but the rows), beside the step before.
  void LayReads(Planned* p);
  // The stamp a row read at `step` must have at least in kept table t.
  int64_t MinStamp(int t, int64_t step) const { return step - shape_.sparse_tables[t].staleness; }
  // Kept tables: starts pulling the rows `plan` (step `step`'s) lacks.
  void Prefetch(const SparseBatch& plan, int64_t step, int64_t min_version,
                int64_t min_worker_steps);
  // Kept tables: takes the prefetched rows of `plan` (step `step`'s) into
  // the cache, first forgetting the rows no step from `step` on reads, and
  // finds where its rows are there (kept_places_).
  absl::Status TakePrefetched(const SparseBatch& plan, int64_t step);
  // The rows the push lane pulls for `plan`: all of them, or with kept
  // tables only the others' (push_pull_ids_).
  const RowIds* PushLaneRows(const SparseBatch* plan);

  const ModelShape& shape_;
  const int num_shards_;
  std::function<bool()> cancelled_;
  std::unique_ptr<SparseExchange> exchange_;  // Null without sparse tables.
  std::unique_ptr<SparseExchange> eval_;      // EvalFeatures' pulls.
  std::unique_ptr<SparseBatch> eval_plan_;    // Of the test batch eval_ pulls for.
  // An evaluation's rows, kept from batch to batch (each as of its first
  // read) up to kEvalCacheBytes; what eval_ pulls, the rows of
  // eval_plan_ the cache lacks; and, once AwaitEvalRows has them, the
  // batch's rows per table and shard in the plan's order.
  static constexpr int64_t kEvalRowBytes = 64;  // The cache's own, a row.
  int64_t eval_cache_bytes_ = kEvalCacheBytes;
  std::unique_ptr<RowCache> eval_cache_;
  RowIds eval_missing_;
  bool eval_awaited_ = false;
  std::vector<std::vector<std::vector<float>>> eval_values_;
  Rows eval_rows_;
  int64_t eval_rows_read_ = 0, eval_rows_pulled_ = 0;
  // The plan of the batch being trained (current_) and of the one whose rows
  // are coming (next_); swapped as steps go.
  std::unique_ptr<SparseBatch> current_, next_;
  bool next_pulled_ = false;
  WorkPool tables_;   // Plans, pools and row gradients, table by table.
  WorkPool planner_;  // One thread: PlanAhead's tasks, in turn.
  std::vector<std::vector<std::vector<float>>> grads_;
  std::vector<float> features_;
  // The block the current step's rows were pooled from on the device, or
  // null (pooled here).
  std::vector<PooledRows>* pooled_ = nullptr;

  // Kept tables (staleness > 0): whether there are any, the least
  // staleness among them, their rows, the prefetch lane and what it pulls
  // (for step prefetch_step_), the current plan's rows gathered [table]
  // [shard] when they are pooled here, the push lane's rows when kept
  // tables are left out.
  const bool sync_;
  bool keeps_rows_ = false;
  bool all_kept_ = false;  // Every table kept.
  // How far its batch was taken ahead of its step: planned (and its
  // missing rows' pull begun); its rows taken from the prefetch lane into
  // the cache (with every table kept: by its own task one batch ahead, by
  // the next batch's two ahead); and its input pooled into next_features_
  // too, unless the device pools it (then its block's reads laid out).
  enum class Ahead { kPlanned, kTaken, kPooled };
  std::vector<float> next_features_;
  // A batch PlanAhead was given, and what the tasks made of it (written by
  // them; read once they are done).
  struct Planned {
    int64_t step = 0;
    const data::Batch* batch = nullptr;
    // Set as its task's last act. (Waited on, not the task's WorkPool
    // batch: a Wait on that runs the call itself if the planner has not
    // started it, beside the task before it; nor is the batch kept here,
    // which holds the task, which holds this.)
    absl::Notification done;
    absl::Status status;                // Of its plan.
    std::unique_ptr<SparseBatch> plan;  // Until Exchange takes it (into next_).
    SparseBatch* planned = nullptr;     // The plan, for the next batch's task.
    absl::Status taken;                 // Of taking its rows ahead.
    Ahead ahead = Ahead::kPlanned;
    // Taken and to be pooled on the device: its block's reads, per table
    // (LayReads; offsets, index, row_reads, readers as PooledRows's).
    struct Reads {
      std::vector<int32_t> offsets, index, row_reads, readers;
    };
    std::vector<Reads> reads;
  };
  int depth_ = 1;  // plan_depth().
  // Planned batches not yet taken by Exchange, oldest first (the last one's
  // task is the last to end), and the one whose plan is in next_ (null:
  // planned by Exchange itself).
  std::deque<std::shared_ptr<Planned>> planned_;
  std::shared_ptr<Planned> next_planned_;
  bool last_pool_here_ = false;  // The last task pools on the host.
  int min_staleness_ = 0;
  std::unique_ptr<RowCache> cache_;
  std::unique_ptr<SparseExchange> prefetch_;
  RowIds prefetched_;
  int64_t prefetch_step_ = -1;
  std::vector<std::vector<std::vector<float>>> kept_values_;
  // Per kept table: the places of the taken plan's rows in the cache,
  // shard after shard (TakePrefetched's, until the next take), and
  // WriteStored's room for the places written since the last block.
  std::vector<std::vector<int32_t>> kept_places_;
  std::vector<std::vector<int32_t>> written_;
  RowIds push_pull_ids_;
  int64_t rows_kept_ = 0;
  int64_t rows_to_device_ = 0;
  AheadSeconds ahead_;  // Written by PlanAhead's tasks.
  double lay_seconds_ = 0, block_seconds_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_INPUT_STAGE_H_
