// The transport benchmark (//bench:transport): starts a real coordinator and
// real `downpour-ps` processes on loopback, registers in-process worker nodes
// with the coordinator, submits a job whose model is one dense layer of the
// wanted size, and has the workers push gradients and pull parameters
// through ParameterExchange (the code JobTrainer uses). In the same run it
// measures the ceiling (the same bytes through plain TCP sockets, same number
// of connections) and a naive gRPC baseline (`repeated float` in unary RPCs).
//
// Not thread-safe; one TransportBench drives one configuration at a time.
// Owns every process and thread it starts.
#ifndef DOWNPOUR_BENCH_TRANSPORT_BENCH_H_
#define DOWNPOUR_BENCH_TRANSPORT_BENCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace downpour {
namespace bench {

struct BenchConfig {
  int64_t size_bytes = 1 << 20;
  int workers = 1;
  int shards = 1;
  // Timed push+pull steps per worker (after one untimed warm-up step).
  int steps = 10;
};

// Bandwidths in GB/s (1e9 bytes per second); latencies in microseconds.
struct BenchResult {
  BenchConfig config;
  double raw_tcp_gbps = 0;
  double raw_rtt_p50_us = 0;
  double raw_rtt_p99_us = 0;
  double naive_grpc_gbps = 0;
  double naive_rtt_p50_us = 0;
  double downpour_gbps = 0;
  double rtt_p50_us = 0;
  double rtt_p99_us = 0;
  // How Downpour's tensor bytes went: "shared_memory" (segments shared with
  // the shards, rpc/shared_segment.h) or "wire" (gRPC over loopback TCP).
  std::string transport;
  // Of the timed exchanges through shared memory, those signalled through
  // their segments' doorbells (rpc/segment_doorbell.h) rather than sent
  // over the stream.
  int64_t signalled = 0;
  // With shared memory on, the same steps measured over the wire in the same
  // run (the figures above are then the shared memory's); 0 otherwise.
  double wire_gbps = 0;
  double wire_rtt_p50_us = 0;
  // Filled in by the caller from MeasureApply (the same for every line).
  double apply_gbps = 0;
  double memcpy_gbps = 0;
  double apply_1t_gbps = 0;
  double memcpy_1t_gbps = 0;
  // workers == 1 only: largest |difference| between the parameters pulled
  // from the real shards and a replay of the same pushes on in-process
  // shards (0 when the transport is exact); -1 when not checked.
  double max_abs_diff_vs_local = -1;
};

std::string ToJson(const BenchResult& result);

// Timed steps for a configuration when --steps is not given: enough bytes to
// be steady, little enough for the whole sweep to take a few minutes.
int DefaultSteps(int64_t size_bytes, int workers);

struct ApplyBandwidth {
  // Gradient bytes an in-process shard applies per second (Adam, ASYNC, one
  // push of the whole model, partitions applied as the shard's server does).
  double apply_gbps = 0;
  // memcpy of the same bytes, same number of threads.
  double memcpy_gbps = 0;
  // Threads of the two above: min(2, cores), as the shard applies a
  // pipelined push's partitions on concurrent server threads.
  int threads = 1;
  // The same on one thread.
  double apply_1t_gbps = 0;
  double memcpy_1t_gbps = 0;
};
absl::StatusOr<ApplyBandwidth> MeasureApply(int64_t size_bytes);

// The job the benchmark submits: one dense layer of about `size_bytes`
// float32 parameters (weight 1023 x U plus bias U), ASYNC, Adam.
JobSpec BenchJobSpec(int64_t size_bytes, int workers, int shards);

class TransportBench {
 public:
  struct Options {
    int max_workers = 4;
    int max_shards = 4;
    // Run the naive gRPC baseline (slow at large sizes).
    bool naive = true;
    // A step is one ParameterExchange::PushPull (what JobTrainer does
    // between steps); false: a Push, then a Pull.
    bool push_pull = true;
    // PushPull exchanges travel on long-lived streams
    // (RemoteParameterShard::Options::use_streams); false: a unary call each.
    bool streams = true;
    // Shards map their workers' shared memory segments (downpour-ps
    // --shared_memory) and each configuration is measured over the wire and
    // then through shared memory; false: over the wire alone, shards started
    // with --shared_memory=false.
    bool shared_memory = true;
    // ExchangeOptions::message_bytes; 0: its default.
    int64_t message_bytes = 0;
  };

  // Starts the coordinator, `max_shards` downpour-ps processes and
  // `max_workers` in-process worker nodes. The daemons are found through
  // tests/local_cluster's Runfile().
  static absl::StatusOr<std::unique_ptr<TransportBench>> Start(const Options& options);
  ~TransportBench();

  absl::StatusOr<BenchResult> Run(const BenchConfig& config);

  // Daemon logs, for failure messages.
  std::string Logs() const;

  struct State;

 private:
  explicit TransportBench(const Options& options);
  const Options options_;
  std::unique_ptr<State> state_;
};

}  // namespace bench
}  // namespace downpour

#endif  // DOWNPOUR_BENCH_TRANSPORT_BENCH_H_
