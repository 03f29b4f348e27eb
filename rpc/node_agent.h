// NodeAgent: a shard's or worker's link to the coordinator. It registers the
// node, heartbeats every interval, hands the node its tasks (the running jobs
// it takes part in) and carries workers' progress reports.
//
// It talks to a control::Coordinator — in a daemon a RemoteCoordinator, in a
// test an in-process one — so it is tested without sockets.
//
// Thread-safe. The agent owns one background thread; the tasks callback runs
// on it. The coordinator is not owned and must outlive the agent. A
// coordinator outage after start-up is survived: the node keeps its tasks and
// re-registers when the coordinator answers again.
#ifndef DOWNPOUR_RPC_NODE_AGENT_H_
#define DOWNPOUR_RPC_NODE_AGENT_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/coordinator.h"
#include "proto/coordinator.pb.h"

namespace downpour {

class NodeAgent {
 public:
  struct Options {
    // How the coordinator is named in errors and logs (its address).
    std::string coordinator_name;
    // id, role, address, devices...; Start sets the incarnation and, when
    // empty, the hostname.
    NodeInfo self;
    // The first registration must succeed within this, or Start fails.
    absl::Duration startup_timeout = absl::Seconds(30);
    // Adds what the node reports with every heartbeat (a shard's checkpoint
    // files); called on the agent's thread.
    std::function<void(HeartbeatRequest*)> add_to_heartbeat;
  };
  using TasksCallback = std::function<void(const std::vector<Task>&)>;

  // Registers (retrying until startup_timeout), then heartbeats on a thread
  // of its own. Unavailable, naming the coordinator, when the registration
  // does not succeed in time.
  static absl::StatusOr<std::unique_ptr<NodeAgent>> Start(Options options,
                                                          control::Coordinator* coordinator,
                                                          TasksCallback on_tasks);
  ~NodeAgent();

  absl::StatusOr<ReportProgressResponse> ReportProgress(const ReportProgressRequest& request);

  const NodeInfo& self() const { return options_.self; }

  // A line the node logged about job `job_id`: sent with the next heartbeat
  // (the newest kMaxPendingLogs are kept while the coordinator is away).
  void AddJobLog(const std::string& job_id, absl::Time time, absl::string_view text);
  static constexpr int kMaxPendingLogs = 2000;

  // The node is leaving (SIGTERM): heartbeats say so from now on, and the
  // coordinator gives it no new work and moves what it holds elsewhere.
  void Drain();
  // After Drain: waits until the coordinator says the node holds nothing a
  // job needs (HeartbeatResponse.released); false after `timeout`.
  bool WaitReleased(absl::Duration timeout);

 private:
  NodeAgent(Options options, control::Coordinator* coordinator, TasksCallback on_tasks);
  absl::Status Register();
  void HeartbeatLoop();

  Options options_;
  control::Coordinator* const coordinator_;
  const TasksCallback on_tasks_;
  absl::Duration interval_ = absl::Seconds(1);

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  // Its own lock: AddJobLog runs inside Log, which mu_'s holders may call.
  absl::Mutex logs_mu_;
  std::deque<JobLogLine> pending_logs_ ABSL_GUARDED_BY(logs_mu_);
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_NODE_AGENT_H_
