// //bench:sparse — sparse embedding tables through real downpour-ps
// processes (SparseExchange, as the trainer runs it) at several Zipf skews,
// beside the naive baseline of the same table as a dense parameter pushed
// and pulled whole. Prints one JSON line per configuration, then a table.
// --draws_only counts distinct rows of the Zipf draws alone (no cluster),
// for vocabularies too large to run here. See BENCHMARKS.md.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/sparse_bench.h"
#include "common/platform/malloc_tuning.h"
#include "common/platform/mutex_tuning.h"

ABSL_FLAG(int32_t, workers, 2, "In-process workers (threads)");
ABSL_FLAG(int32_t, shards, 2, "downpour-ps processes");
ABSL_FLAG(int32_t, batch, 512, "Examples per worker step");
ABSL_FLAG(int32_t, features, 26, "Ids per example, split evenly over the tables");
ABSL_FLAG(int32_t, tables, 1, "Sparse embedding tables");
ABSL_FLAG(int32_t, dim, 16, "Embedding dimension");
ABSL_FLAG(int64_t, vocab, 1'000'000, "Rows per table (ids are Zipf ranks 0..vocab-1)");
ABSL_FLAG(std::string, skews, "0.8,1.0,1.2", "Zipf exponents, one ASYNC line each");
ABSL_FLAG(double, sync_skew, 1.0, "Skew of the one SYNC line (0: no SYNC line)");
ABSL_FLAG(int32_t, steps, 300, "Timed steps per worker per line");
ABSL_FLAG(int64_t, memory_limit, 0,
          "Every shard's --memory_limit in bytes (0: none); the lines then report each shard's "
          "memory, evictions and refusals");
ABSL_FLAG(int32_t, warmup, 3, "Untimed steps per worker before them");
ABSL_FLAG(int64_t, dense_vocab, 0,
          "Rows of the dense baseline's table (0: vocab, at most 4,000,000; -1: no baseline)");
ABSL_FLAG(int32_t, dense_steps, 8, "Timed steps per worker of the dense baseline");
ABSL_FLAG(bool, draws_only, false,
          "Only count distinct rows per batch of the Zipf draws (no cluster): for large --vocab");
ABSL_FLAG(bool, shared_memory, true,
          "Workers exchange through shared memory with the shards (false: over gRPC)");
ABSL_FLAG(int32_t, draw_batches, 20, "Batches drawn per skew with --draws_only");

namespace downpour {
namespace bench {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "sparse: %s\n", message.c_str());
  return 1;
}

// tests/local_cluster finds the daemons under $TEST_SRCDIR; under `bazel run`
// (or run directly) they are in this binary's runfiles tree.
void FindRunfiles() {
  if (std::getenv("TEST_SRCDIR") != nullptr) return;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) + ".runfiles" : "";
  if (dir.empty() || access(dir.c_str(), R_OK) != 0) {
    const char* env = std::getenv("RUNFILES_DIR");
    dir = env ? env : "..";
  }
  setenv("TEST_SRCDIR", dir.c_str(), 1);
}

double Mib(double bytes) { return bytes / (1 << 20); }

void PrintTable(const std::vector<SparseResult>& results) {
  std::printf(
      "\n| mode | skew | ids/step | rows/step | rows/ids | step p50 ms | p99 ms | "
      "pulled rows/s/worker | pushed rows/s/worker | pulled rows/s/shard | "
      "pushed rows/s/shard | shard CPU us/row | KiB/step sparse | MiB/step dense | "
      "dense/sparse bytes | dense step ms (measured table) | sparse/dense time | "
      "rows held | B/row held |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SparseResult& r : results) {
    std::printf(
        "| %s | %.1f | %.0f | %.0f | %.3f | %.2f | %.2f | %.0f | %.0f | %.0f | %.0f | %.2f | %.0f "
        "| %.1f | %.0f | %.1f (%lld rows) | %.4f | %lld | %.0f |\n",
        r.config.sync ? "SYNC" : "ASYNC", r.config.skew, r.ids_per_step, r.rows_per_step,
        r.rows_per_step / r.ids_per_step, r.step_p50_ms, r.step_p99_ms, r.pulled_rows_per_s_worker,
        r.pushed_rows_per_s_worker, r.pulled_rows_per_s_shard, r.pushed_rows_per_s_shard,
        r.shard_cpu_us_per_row, r.sparse_bytes_per_step / 1024, Mib(r.dense_bytes_per_step),
        r.dense_bytes_per_step / r.sparse_bytes_per_step, r.dense_step_p50_ms,
        static_cast<long long>(r.dense_vocab),
        r.dense_step_ms_scaled > 0 ? r.step_p50_ms / r.dense_step_ms_scaled : 0.0,
        static_cast<long long>(r.rows_held), r.bytes_per_row);
  }
}

int Main() {
  SparseConfig base;
  base.workers = absl::GetFlag(FLAGS_workers);
  base.shards = absl::GetFlag(FLAGS_shards);
  base.batch = absl::GetFlag(FLAGS_batch);
  base.features = absl::GetFlag(FLAGS_features);
  base.tables = absl::GetFlag(FLAGS_tables);
  base.dim = absl::GetFlag(FLAGS_dim);
  base.vocab = absl::GetFlag(FLAGS_vocab);
  base.steps = absl::GetFlag(FLAGS_steps);
  base.warmup = absl::GetFlag(FLAGS_warmup);
  base.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  if (base.workers < 1 || base.shards < 1 || base.batch < 1 || base.tables < 1 ||
      base.features < base.tables || base.dim < 1 || base.vocab < 1 || base.steps < 1 ||
      base.warmup < 0) {
    return Fail(
        "--workers, --shards, --batch, --tables, --dim, --vocab and --steps must be at least 1, "
        "--features at least --tables, --warmup not negative");
  }
  std::vector<double> skews;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_skews), ',')) {
    double skew = 0;
    if (!absl::SimpleAtod(part, &skew) || skew <= 0) {
      return Fail(absl::StrCat("--skews: \"", part, "\" is not a positive number"));
    }
    skews.push_back(skew);
  }

  if (absl::GetFlag(FLAGS_draws_only)) {
    const int batches = std::max(1, absl::GetFlag(FLAGS_draw_batches));
    for (double skew : skews) {
      SparseConfig config = base;
      config.skew = skew;
      const DrawStats stats = CountDistinctRows(config, batches);
      std::printf(
          "{\"draws_only\": true, \"skew\": %.2f, \"batch\": %d, \"features\": %d, "
          "\"tables\": %d, \"vocab\": %lld, \"batches\": %d, \"ids_per_step\": %.0f, "
          "\"rows_per_step\": %.1f, \"rows_over_ids\": %.4f}\n",
          skew, config.batch, config.features, config.tables, static_cast<long long>(config.vocab),
          batches, stats.ids_per_step, stats.rows_per_step,
          stats.rows_per_step / stats.ids_per_step);
    }
    return 0;
  }

  FindRunfiles();
  SparseBench::Options options;
  options.max_workers = base.workers;
  options.max_shards = base.shards;
  options.shard_memory_limit = absl::GetFlag(FLAGS_memory_limit);
  auto bench = SparseBench::Start(options);
  if (!bench.ok()) return Fail(std::string(bench.status().message()));

  // The naive baseline first: the same table as a dense parameter.
  int64_t dense_vocab = absl::GetFlag(FLAGS_dense_vocab);
  if (dense_vocab == 0) dense_vocab = std::min<int64_t>(base.vocab, 4'000'000);
  DenseResult dense;
  if (dense_vocab > 0) {
    auto measured =
        (*bench)->RunDense(base, dense_vocab, std::max(1, absl::GetFlag(FLAGS_dense_steps)));
    if (!measured.ok()) {
      std::fprintf(stderr, "%s\n", (*bench)->Logs().c_str());
      return Fail(std::string(measured.status().message()));
    }
    dense = *measured;
    std::printf(
        "{\"dense_baseline\": true, \"workers\": %d, \"shards\": %d, \"vocab\": %lld, "
        "\"dim\": %d, \"bytes_per_step\": %lld, \"step_p50_ms\": %.3f, \"step_p99_ms\": %.3f}\n",
        base.workers, base.shards, static_cast<long long>(dense.vocab), base.dim,
        static_cast<long long>(dense.bytes_per_step), dense.step_p50_ms, dense.step_p99_ms);
    std::fflush(stdout);
  }

  std::vector<SparseConfig> configs;
  for (double skew : skews) {
    SparseConfig config = base;
    config.skew = skew;
    configs.push_back(config);
  }
  if (absl::GetFlag(FLAGS_sync_skew) > 0) {
    SparseConfig config = base;
    config.skew = absl::GetFlag(FLAGS_sync_skew);
    config.sync = true;
    configs.push_back(config);
  }
  std::vector<SparseResult> results;
  for (const SparseConfig& config : configs) {
    auto result = (*bench)->Run(config);
    if (!result.ok()) {
      std::fprintf(stderr, "%s\n", (*bench)->Logs().c_str());
      return Fail(std::string(result.status().message()));
    }
    if (dense_vocab > 0) {
      result->dense_vocab = dense.vocab;
      result->dense_step_p50_ms = dense.step_p50_ms;
      result->dense_measured_bytes_per_step = static_cast<double>(dense.bytes_per_step);
      // Linear in bytes where the measured table is smaller than the
      // configuration's tables (derived).
      result->dense_step_ms_scaled =
          dense.step_p50_ms * result->dense_bytes_per_step / dense.bytes_per_step;
    }
    std::printf("%s\n", ToJson(*result).c_str());
    std::fflush(stdout);
    results.push_back(*result);
  }
  PrintTable(results);
  if (absl::GetFlag(FLAGS_memory_limit) > 0) {
    for (const SparseResult& r : results) {
      std::printf(
          "%s skew %.1f: %lld rows held, %.1f MiB over %d shards (the most on one: %.1f MiB of a "
          "%.1f MiB limit), %.0f evictions, %.0f refusals\n",
          r.config.sync ? "SYNC" : "ASYNC", r.config.skew, static_cast<long long>(r.rows_held),
          Mib(r.total_shard_bytes), r.config.shards, Mib(r.max_shard_bytes),
          Mib(static_cast<double>(absl::GetFlag(FLAGS_memory_limit))), r.evictions, r.refusals);
    }
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace downpour

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sparse [--workers=2 --shards=2 --batch=512 --features=26 --tables=1 --dim=16 "
      "--vocab=1000000 --skews=0.8,1.0,1.2 --sync_skew=1.0 --steps=300] | --draws_only ...");
  absl::ParseCommandLine(argc, argv);
  downpour::KeepTensorBuffersMapped();
  downpour::SkipMutexDeadlockDetection();
  return downpour::bench::Main();
}
