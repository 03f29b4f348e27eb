// //bench:transport — Downpour's push/pull goodput against the loopback TCP
// ceiling and a naive gRPC baseline, on real downpour-ps processes. No flags:
// the whole sweep (1, 25, 100 MiB x 1, 2, 4 workers x 1, 2, 4 shards). Prints
// one JSON line per configuration, then a table. See BENCHMARKS.md.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "bench/transport_bench.h"
#include "common/platform/malloc_tuning.h"
#include "common/platform/mutex_tuning.h"

ABSL_FLAG(double, size_mb, 0, "Model size in MiB (0: sweep 1, 25, 100)");
ABSL_FLAG(int32_t, workers, 0, "Workers (0: sweep 1, 2, 4)");
ABSL_FLAG(int32_t, shards, 0, "Shards (0: sweep 1, 2, 4)");
ABSL_FLAG(int32_t, steps, 0, "Timed steps per worker (0: chosen by size)");
ABSL_FLAG(bool, naive, true, "Also run the naive gRPC baseline");
ABSL_FLAG(bool, push_pull, true,
          "A step is one combined push+pull call per message (false: a push, then a pull)");
ABSL_FLAG(int64_t, message_kb, 0, "Largest message of a worker's exchange, KiB (0: the default)");
ABSL_FLAG(bool, streams, true,
          "Combined push+pull exchanges go over long-lived streams (false: a unary call each)");
ABSL_FLAG(bool, shared_memory, true,
          "Also measure Downpour with its tensor bytes through shared memory (the shards map "
          "segments of the benchmark's workers); each JSON line then says \"transport\": "
          "\"shared_memory\" with the wire's figures beside (wire_gbps, wire_rtt_p50_us). "
          "false: over the wire alone, shards started with --shared_memory=false");

namespace downpour {
namespace bench {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "transport: %s\n", std::string(status.message()).c_str());
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

int Main() {
  FindRunfiles();
  std::vector<double> sizes = {1, 25, 100};
  std::vector<int> workers = {1, 2, 4}, shards = {1, 2, 4};
  if (absl::GetFlag(FLAGS_size_mb) > 0) sizes = {absl::GetFlag(FLAGS_size_mb)};
  if (absl::GetFlag(FLAGS_workers) > 0) workers = {absl::GetFlag(FLAGS_workers)};
  if (absl::GetFlag(FLAGS_shards) > 0) shards = {absl::GetFlag(FLAGS_shards)};

  auto apply = MeasureApply(100 << 20);
  if (!apply.ok()) return Fail(apply.status());
  std::printf(
      "# Adam apply over 100 MiB: %.2f GB/s, memcpy %.2f GB/s (%d threads); "
      "1 thread: %.2f, %.2f GB/s\n",
      apply->apply_gbps, apply->memcpy_gbps, apply->threads, apply->apply_1t_gbps,
      apply->memcpy_1t_gbps);

  TransportBench::Options options;
  options.max_workers = *std::max_element(workers.begin(), workers.end());
  options.max_shards = *std::max_element(shards.begin(), shards.end());
  options.naive = absl::GetFlag(FLAGS_naive);
  options.push_pull = absl::GetFlag(FLAGS_push_pull);
  options.streams = absl::GetFlag(FLAGS_streams);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.message_bytes = absl::GetFlag(FLAGS_message_kb) << 10;
  auto bench = TransportBench::Start(options);
  if (!bench.ok()) return Fail(bench.status());

  std::vector<BenchResult> results;
  for (double size : sizes) {
    for (int w : workers) {
      for (int s : shards) {
        BenchConfig config;
        config.size_bytes = static_cast<int64_t>(size * (1 << 20));
        config.workers = w;
        config.shards = s;
        config.steps = absl::GetFlag(FLAGS_steps) > 0 ? absl::GetFlag(FLAGS_steps)
                                                      : DefaultSteps(config.size_bytes, w);
        auto result = (*bench)->Run(config);
        if (!result.ok()) {
          std::fprintf(stderr, "%s\n", (*bench)->Logs().c_str());
          return Fail(result.status());
        }
        result->apply_gbps = apply->apply_gbps;
        result->memcpy_gbps = apply->memcpy_gbps;
        result->apply_1t_gbps = apply->apply_1t_gbps;
        result->memcpy_1t_gbps = apply->memcpy_1t_gbps;
        std::printf("%s\n", ToJson(*result).c_str());
        std::fflush(stdout);
        results.push_back(*result);
      }
    }
  }
  std::printf(
      "\n| MiB | workers | shards | raw TCP GB/s | naive gRPC GB/s | Downpour GB/s | "
      "Downpour/raw | Downpour/naive | RTT p50 us | RTT p99 us | raw RTT p50 us | transport | "
      "wire RTT p50 us |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BenchResult& r : results) {
    std::printf(
        "| %.0f | %d | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %.0f | %.0f | %.0f | %s | %.0f |\n",
        r.config.size_bytes / double(1 << 20), r.config.workers, r.config.shards, r.raw_tcp_gbps,
        r.naive_grpc_gbps, r.downpour_gbps, r.downpour_gbps / r.raw_tcp_gbps,
        r.naive_grpc_gbps > 0 ? r.downpour_gbps / r.naive_grpc_gbps : 0, r.rtt_p50_us, r.rtt_p99_us,
        r.raw_rtt_p50_us, r.transport.c_str(), r.wire_rtt_p50_us);
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace downpour

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "transport [--size_mb=N --workers=N --shards=N --steps=N] (no flags: the whole sweep)");
  absl::ParseCommandLine(argc, argv);
  downpour::KeepTensorBuffersMapped();
  downpour::SkipMutexDeadlockDetection();
  return downpour::bench::Main();
}
