// The cluster of the benchmarks that run the worker side themselves
// (//bench:transport, //bench:sparse): a real coordinator and real
// `downpour-ps` processes on loopback (tests/local_cluster, which finds the
// daemons under $TEST_SRCDIR), and in-process worker nodes registered with
// the coordinator that serve nothing and only keep the tasks it gives them.
// A benchmark submits a job, takes the tasks from AwaitTasks and drives
// ParameterExchange or SparseExchange with them, as downpour-worker would.
//
// Thread-safe: tasks arrive on the node agents' threads and AwaitTasks may
// run on any. Owns the daemon processes and the node agents; the destructor
// stops them.
#ifndef DOWNPOUR_BENCH_BENCH_CLUSTER_H_
#define DOWNPOUR_BENCH_BENCH_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/coordinator.pb.h"
#include "rpc/node_agent.h"
#include "rpc/remote_coordinator.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace bench {

class BenchCluster {
 public:
  struct Options {
    int shards = 1;
    // In-process worker nodes.
    int workers = 1;
    // More flags for every shard (e.g. --memory_limit=N).
    std::vector<std::string> shard_flags;
    // Worker node w is registered as `<worker_id_prefix><w>`.
    std::string worker_id_prefix = "bench-worker-";
  };

  // Starts the coordinator and the shards, registers the worker nodes and
  // waits (30 s at most) until every node is alive. The heartbeats are
  // frequent and the node timeout long: a loaded loopback on two cores must
  // not look like a dead node.
  static absl::StatusOr<std::unique_ptr<BenchCluster>> Start(const Options& options);
  ~BenchCluster();

  RemoteCoordinator& coordinator() { return *coordinator_; }
  // The daemon processes (shard pids, metrics addresses).
  testing::LocalCluster& processes() { return *processes_; }

  // Waits (30 s at most) until `workers` of the worker nodes hold a task of
  // `job_id`; returns those tasks by rank. DeadlineExceeded naming the job
  // when the coordinator has not scheduled it by then.
  absl::StatusOr<std::vector<Task>> AwaitTasks(const std::string& job_id, int workers);

  // The daemons' logs, for failure messages.
  std::string Logs() const;

 private:
  BenchCluster() = default;

  std::unique_ptr<testing::LocalCluster> processes_;
  std::unique_ptr<RemoteCoordinator> coordinator_;
  // Destroyed before coordinator_, which they hold a pointer to.
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  absl::Mutex mu_;
  // The tasks each worker node was given last.
  std::vector<std::vector<Task>> tasks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bench
}  // namespace downpour

#endif  // DOWNPOUR_BENCH_BENCH_CLUSTER_H_
