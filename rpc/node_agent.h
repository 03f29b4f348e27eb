// NodeAgent: a shard's or worker's link to the coordinator. It registers the
// node, heartbeats every interval, hands the node its tasks (the running jobs
// it takes part in) and carries workers' progress reports.
//
// Thread-safe. The agent owns one background thread; the tasks callback runs
// on it. A coordinator outage after start-up is survived: the node keeps its
// tasks and re-registers when the coordinator answers again.
#ifndef DOWNPOUR_RPC_NODE_AGENT_H_
#define DOWNPOUR_RPC_NODE_AGENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

namespace downpour {

class NodeAgent {
 public:
  struct Options {
    std::string coordinator;  // HOST:PORT
    // id, role, address, devices...; Start sets the incarnation and, when
    // empty, the hostname.
    NodeInfo self;
    absl::Duration rpc_timeout = absl::Seconds(5);
    // The first registration must succeed within this, or Start fails.
    absl::Duration startup_timeout = absl::Seconds(30);

    // Options for a node of `role` serving gRPC at `address`: its id is
    // `node_id`, or "ps@<address>" / "worker@<address>" when that is empty.
    static Options For(NodeRole role, const std::string& coordinator,
                       absl::Duration startup_timeout, const std::string& node_id,
                       const std::string& address, const std::string& metrics_address);
  };
  using TasksCallback = std::function<void(const std::vector<Task>&)>;

  static absl::StatusOr<std::unique_ptr<NodeAgent>> Start(Options options, TasksCallback on_tasks);
  ~NodeAgent();

  absl::StatusOr<ReportProgressResponse> ReportProgress(const ReportProgressRequest& request);

  const NodeInfo& self() const { return options_.self; }

 private:
  NodeAgent(Options options, TasksCallback on_tasks);
  absl::Status Register();
  void HeartbeatLoop();

  Options options_;
  const TasksCallback on_tasks_;
  std::unique_ptr<Coordinator::Stub> stub_;
  absl::Duration interval_ = absl::Seconds(1);

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_NODE_AGENT_H_
