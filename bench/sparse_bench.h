// The sparse-table benchmark (//bench:sparse, issue 13): starts a real
// coordinator and real `downpour-ps` processes on loopback, registers
// in-process worker nodes, submits a job whose model is sparse embedding
// tables (Adam) under a tiny dense head, and has the workers run what the
// trainer runs for those tables each step: SparseExchange (worker/
// sparse_exchange.h), one request per shard carrying the step's row
// gradients and the next batch's row ids, the rows coming back. Batches are
// drawn ahead of time: `batch` examples of `features` ids each, Zipf(skew)
// over each table's vocabulary, planned by SparseBatch::Plan (dedup, rows
// sorted by shard). Workers run their exchanges back to back (no model
// compute between them), so the figures are what the exchange sustains.
//
// The naive baseline, measured in the same run on the same shards: the same
// table as a DENSE parameter (an embedding with sparse: false, its whole
// vocab x dim table pushed and pulled every step through ParameterExchange,
// as a job without sparse tables trains it).
//
// Not thread-safe; one SparseBench drives one configuration at a time.
// Owns every process and thread it starts.
#ifndef DOWNPOUR_BENCH_SPARSE_BENCH_H_
#define DOWNPOUR_BENCH_SPARSE_BENCH_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace downpour {
namespace bench {

// Zipf(s) over ranks 1..n: P(k) proportional to k^-s, drawn by Hörmann and
// Derflinger's rejection-inversion (O(1) a draw, no table, so n may be
// 10^9). Thread-compatible; const after construction.
class ZipfSampler {
 public:
  // REQUIRES: n >= 1, s > 0.
  ZipfSampler(int64_t n, double s);
  int64_t operator()(std::mt19937_64& rng) const;

 private:
  double H(double x) const;
  double HInverse(double x) const;
  double h(double x) const;

  const int64_t n_;
  const double s_;
  double h_integral_x1_ = 0;
  double h_integral_n_ = 0;
  double squeeze_ = 0;
};

struct SparseConfig {
  int workers = 2;
  int shards = 2;
  int batch = 512;    // Examples per worker step.
  int features = 26;  // Ids per example, split evenly over the tables.
  int tables = 1;     // Sparse embedding tables, each of vocab x dim.
  int dim = 16;
  int64_t vocab = 1'000'000;  // Rows per table; ids are ranks 0..vocab-1.
  double skew = 1.0;
  bool sync = false;  // SYNC; else ASYNC.
  int steps = 300;    // Timed steps per worker (after warm-up steps).
  int warmup = 3;
  uint64_t seed = 1;
  // The workers' shard clients exchange through shared memory segments
  // where the shards take them (same host); false: every byte over gRPC.
  bool shared_memory = true;
};

// Ids and rows of a workload's batches, from the Zipf draws alone.
struct DrawStats {
  double ids_per_step = 0;   // Per worker: batch x features.
  double rows_per_step = 0;  // Distinct rows, mean over the batches drawn.
  double plan_us = 0;        // SparseBatch::Plan per batch (0 when not planned).
};
// Draws `batches` batches of `config` (one worker's) and counts their
// distinct rows, without a cluster: for vocabularies too large to run.
DrawStats CountDistinctRows(const SparseConfig& config, int batches);

struct SparseResult {
  SparseConfig config;
  // Per worker step, mean over workers and timed steps.
  double ids_per_step = 0;
  double rows_per_step = 0;  // Distinct rows pulled (= pushed) per step.
  double plan_us = 0;        // SparseBatch::Plan per batch (worker CPU, untimed).
  // Batches drawn per worker: warmup + steps + 1, fewer (then cycled) where
  // they would not fit in 1 GiB.
  int batches_drawn = 0;
  double step_p50_ms = 0;  // One SparseExchange Begin..Finish.
  double step_p99_ms = 0;
  double wall_s = 0;  // Timed steps, first start to last finish.
  // Worker side: rows one worker pushed / pulled per second.
  double pulled_rows_per_s_worker = 0;
  double pushed_rows_per_s_worker = 0;
  // Shard side, from each shard's downpour_shard_sparse_rows_*_total over
  // the timed steps: the mean over shards, and the busiest shard.
  double pulled_rows_per_s_shard = 0;
  double pushed_rows_per_s_shard = 0;
  double max_rows_per_s_shard = 0;  // Pulled + pushed, the busiest shard.
  // CPU seconds the shard processes spent per row handled (pushed or
  // pulled), over the timed steps: what per-shard rates scale with.
  double shard_cpu_us_per_row = 0;
  double worker_cpu_us_per_row = 0;  // This process (every worker thread).
  // Bytes per step per worker: the protobuf messages of the exchange (ids
  // out, ids back, headers) plus the rows' bytes both ways; gRPC, HTTP/2
  // and TCP framing not counted.
  double sparse_bytes_per_step = 0;
  double id_bytes_per_step = 0;  // The part that is row ids (8 bytes each, three times).
  // The dense path's bytes per step per worker for the same tables: every
  // table pushed and pulled whole, tables x vocab x dim x 4 x 2.
  double dense_bytes_per_step = 0;
  // Shard memory after the run: rows held and bytes per row (the growth of
  // downpour_shard_memory_used_bytes over the job, rows' reserved slack
  // included).
  int64_t rows_held = 0;
  double bytes_per_row = 0;
  // Over the shards after the run: the most any one held, all of it, and
  // the rows evicted and the budget refusals (0 unless a shard ran out).
  double max_shard_bytes = 0;
  double total_shard_bytes = 0;
  double evictions = 0;
  double refusals = 0;
  // The naive baseline (filled in by the caller from RunDense): one table as
  // a dense parameter of dense_vocab x dim, pushed and pulled whole.
  int64_t dense_vocab = 0;
  double dense_step_p50_ms = 0;
  // Its bytes per step (measured table, both ways) and step time scaled
  // linearly to dense_bytes_per_step (derived, not measured, where the
  // measured table is smaller than the configuration's tables).
  double dense_measured_bytes_per_step = 0;
  double dense_step_ms_scaled = 0;
};

std::string ToJson(const SparseResult& result);

// The job the benchmark submits: `tables` sparse embeddings (Adam, LRU, no
// max_rows) pooled with SUM, concatenated when several, then a small MLP
// head (a hidden layer, relu, 2 units) and the loss.
JobSpec SparseJobSpec(const SparseConfig& config);
// The baseline's job: ids as floats into a dense embedding of vocab x dim,
// flattened, the same head.
JobSpec DenseJobSpec(const SparseConfig& config, int64_t vocab);

struct DenseResult {
  int64_t vocab = 0;
  int64_t bytes_per_step = 0;  // Whole model, pushed and pulled.
  double step_p50_ms = 0;
  double step_p99_ms = 0;
};

class SparseBench {
 public:
  struct Options {
    int max_workers = 2;
    int max_shards = 2;
    // Every shard's --memory_limit in bytes (0: none).
    int64_t shard_memory_limit = 0;
  };

  // Starts the coordinator, `max_shards` downpour-ps processes and
  // `max_workers` in-process worker nodes (daemons found through
  // tests/local_cluster's Runfile()).
  static absl::StatusOr<std::unique_ptr<SparseBench>> Start(const Options& options);
  ~SparseBench();

  // One line: a fresh job, the config's tables, its exchanges timed.
  absl::StatusOr<SparseResult> Run(const SparseConfig& config);
  // The baseline: a fresh job with one dense table of vocab x config.dim,
  // `steps` timed PushPull steps per worker (after one warm-up), ASYNC.
  absl::StatusOr<DenseResult> RunDense(const SparseConfig& config, int64_t vocab, int steps);

  // Daemon logs, for failure messages.
  std::string Logs() const;

  struct State;

 private:
  explicit SparseBench(const Options& options);
  const Options options_;
  std::unique_ptr<State> state_;
};

}  // namespace bench
}  // namespace downpour

#endif  // DOWNPOUR_BENCH_SPARSE_BENCH_H_
