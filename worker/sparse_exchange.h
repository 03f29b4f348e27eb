// SparseExchange: the worker side of a job's sparse tables (spec/model_shape.h
// SparseTableInfo) — per step, the gradients of the rows the step read go
// to the shards holding them and the rows the next step reads come back, one
// request per shard (ParameterShard::PushPull; a pull alone before the first
// step), all shards at once on threads of the exchange's own, so the rows
// travel while the dense partitions are exchanged (worker/param_exchange.h).
//
// Every push carries one SparseRows per table (empty `ids` where the step
// read none of the shard's rows), so a SYNC step of the tables completes on
// each shard once every worker has pushed it. Requests have an exactly-once
// identity of their own ("<worker_id>#sparse"), so a retried push is
// applied once and the dense exchange's window is untouched. Timeouts and
// lost connections are retried with the same request until the push or
// pull timeout, as the dense exchange's (worker/shard_retry.h); a shard
// that refuses (its memory limit, a bad id) fails the step with its reason.
//
// Thread-compatible: one trainer drives it; Begin and Finish alternate. The
// shards are not owned and must outlive the exchange.
#ifndef DOWNPOUR_WORKER_SPARSE_EXCHANGE_H_
#define DOWNPOUR_WORKER_SPARSE_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/work_pool.h"
#include "ps/parameter_shard.h"
#include "spec/model_shape.h"
#include "worker/param_exchange.h"
#include "worker/sparse_batch.h"

namespace downpour {

class SparseExchange {
 public:
  // `options` as the dense exchange's (job, rank, identity, attempt,
  // timeouts, gradient dtype); `shards[i]` serves shard index i.
  SparseExchange(const ModelShape& shape, ExchangeOptions options,
                 std::vector<ParameterShard*> shards);
  ~SparseExchange();
  SparseExchange(const SparseExchange&) = delete;
  SparseExchange& operator=(const SparseExchange&) = delete;

  // Starts step `step`'s exchange: with `pushed`, the rows' gradients of
  // `grads` ([table][shard], SparseBatch::RowGradients) as step `step`'s
  // push; with `next`, a pull of those rows once the tables have had
  // `min_version` steps and every worker `min_worker_steps` (`read_only`: an
  // evaluation's, creating no row). A push with `checkpoint_step` > 0 asks
  // every shard to capture the job at that step (PushRequest.checkpoint_step;
  // a shard holding only rows of the job hears it from no other push).
  // `exact_version` (SYNC, a pull alone): the rows as they were at
  // min_version exactly (PullRequest.exact_version; FailedPrecondition from
  // Finish when a shard no longer keeps them or answers another version).
  // Returns at once.
  // `pushed`, `grads`, `next` and `cancelled` must outlive Finish.
  void Begin(int64_t step, const SparseBatch* pushed,
             const std::vector<std::vector<std::vector<float>>>* grads, const RowIds* next,
             int64_t min_version, int64_t min_worker_steps, std::function<bool()> cancelled,
             bool read_only = false, int64_t checkpoint_step = 0, bool exact_version = false);
  // Waits for the exchange Begin started and returns its first error (a
  // no-op OK without one). After a pull, rows() holds next's rows and
  // pulled_version() their age.
  absl::Status Finish();
  bool in_flight() const { return in_flight_; }

  // The rows pulled last: [table][shard], rows(table, shard).size() * dim
  // floats each, as SparseBatch::Pool takes them.
  const std::vector<std::vector<const float*>>& rows() const { return row_pointers_; }
  // The version of the tables the last pull read (the least over the
  // shards): the rows have every update up to it.
  int64_t pulled_version() const { return pulled_version_; }

  // Rows pushed and pulled so far (for metrics).
  int64_t rows_pushed() const { return rows_pushed_; }
  int64_t rows_pulled() const { return rows_pulled_; }
  // Over the push-and-pull exchanges finished so far whose shards say how
  // long they held them (PushPullResponse.handled_us; not an in-process
  // shard's): each one's round trip with its slowest shard (its last
  // attempt, from the request's sending to its answer) and the part of it
  // that shard's service held it.
  double round_trip_seconds() const { return round_trip_seconds_; }
  double shard_seconds() const { return shard_seconds_; }

 private:
  // Shard s's part of the exchange Begin started.
  absl::Status ExchangeWithShard(int s, int64_t sequence);

  const ModelShape& shape_;
  const ExchangeOptions options_;
  const std::vector<ParameterShard*> shards_;
  int64_t sequence_;
  // The exchange in flight.
  int64_t step_ = 0;
  const SparseBatch* pushed_ = nullptr;
  const std::vector<std::vector<std::vector<float>>>* grads_ = nullptr;
  const RowIds* next_ = nullptr;
  int64_t min_version_ = 0, min_worker_steps_ = 0;
  bool read_only_ = false;
  bool exact_version_ = false;
  int64_t checkpoint_step_ = 0;
  std::function<bool()> cancelled_;
  bool in_flight_ = false;  // Begun and not yet finished.
  std::vector<absl::Status> results_;
  WorkPool pool_;                           // One thread per shard.
  std::shared_ptr<WorkPool::Batch> batch_;  // The exchange in flight.
  // Pulled rows, [table][shard], and pointers to them.
  std::vector<std::vector<std::vector<float>>> pulled_;
  std::vector<std::vector<const float*>> row_pointers_;
  std::vector<int64_t> versions_;  // Per shard: the version its rows were read at.
  int64_t pulled_version_ = 0;
  std::vector<std::vector<char>> encoded_;  // Per shard: 16-bit gradients.
  int64_t rows_pushed_ = 0, rows_pulled_ = 0;
  // The exchange in flight, per shard: its last push-and-pull sent and
  // answered then (0: none), and the shard's own seconds of it.
  std::vector<double> asked_, answered_, handled_;
  double round_trip_seconds_ = 0, shard_seconds_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_SPARSE_EXCHANGE_H_
