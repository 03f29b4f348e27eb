// What the Downpour daemons do around their services: bind --listen (port 0
// picks a free port), serve grpc.health.v1, write --port_file once serving,
// serve /metrics, and wait for SIGTERM/SIGINT; and, for a shard and a worker,
// the start-up they share (NodeDaemon): the gRPC server, the metrics
// endpoint and the registration with the coordinator (rpc/node_agent.h),
// each failing with one sentence that names what failed.
#ifndef DOWNPOUR_RPC_DAEMON_H_
#define DOWNPOUR_RPC_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.pb.h"
#include "rpc/node_agent.h"
#include "rpc/remote_coordinator.h"
#include "rpc/security.h"

namespace downpour {

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  // HOST:PORT actually bound (a wildcard host as 127.0.0.1, for this
  // machine's own clients), and the port alone.
  std::string address;
  int port = 0;
};

// Builds and starts a server on `listen` with `services` (not owned) and the
// standard health service. With `metrics` (not owned; it must outlive the
// server), every call is measured (rpc/server_metrics.h). Messages up to
// `max_message_bytes` are accepted. Plaintext without `credentials`
// (rpc/security.h makes them).
absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services,
    MetricsRegistry* metrics = nullptr, int max_message_bytes = 256 << 20,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

// How /metrics is served on `listen` (empty: not at all): over HTTPS with
// the TLS certificate and key when security.metrics_tls, which needs them.
absl::StatusOr<MetricsHttpOptions> MetricsServing(const std::string& listen,
                                                  const SecurityOptions& security);

// Sets the program's usage line and makes --help and --helpshort list the
// flags of Downpour's own files (the daemon's and rpc/'s shared ones), not
// only those of a file named after the program; --helpfull adds absl's.
// Call in main before absl::ParseCommandLine.
void SetDaemonUsage(const char* usage);

// Writes `address` to `path` atomically (temp file + rename). No-op when
// `path` is empty.
absl::Status WritePortFile(const std::string& path, const std::string& address);

// Blocks SIGTERM and SIGINT in the calling thread; call first thing in main,
// before any thread starts, so every thread inherits the mask.
void BlockTerminationSignals();

// Waits for SIGTERM or SIGINT (blocked by BlockTerminationSignals) and
// returns its name.
std::string WaitForTerminationSignal();

// A shard's or a worker's daemon around its runtime. Not thread-safe (main
// starts and shuts it down); the agent it owns is.
class NodeDaemon {
 public:
  struct Options {
    NodeRole role = SHARD;
    std::string listen = "127.0.0.1:0";
    // Where other machines reach it, registered with the coordinator:
    // HOST:PORT, or HOST for the bound port; empty: the listen address, a
    // wildcard host replaced by the machine's name (net_address.h).
    std::string advertise;
    std::string port_file;
    std::string metrics_listen;  // Empty: no /metrics.
    std::string coordinator;     // HOST:PORT; required.
    // Start-up fails unless the coordinator accepts the registration within
    // this.
    absl::Duration coordinator_timeout = absl::Seconds(30);
    // Stable node name; empty: "ps@<advertised address>" or "worker@...".
    std::string node_id;
    std::vector<std::string> devices;  // A worker's compute devices, advertised.
    // A shard that writes checkpoints (it has a --checkpoint_root).
    bool checkpoints = false;
    // What the node may hold for its jobs (NodeInfo.memory_limit_bytes; 0:
    // no limit). What its process may use of the host's memory is read at
    // start (common/process_metrics.h) and registered beside it.
    int64_t memory_limit_bytes = 0;
    // See NodeAgent::Options.
    std::function<void(HeartbeatRequest*)> add_to_heartbeat;
    // TLS for the server (client certificates required: only nodes call a
    // node) and for the calls to the coordinator; plaintext only on loopback
    // unless insecure.
    SecurityOptions security;
  };

  // Serves /metrics (when asked) from `metrics` (not owned), then `services`
  // (not owned) and gRPC health on options.listen, measured into `metrics`, then registers with the
  // coordinator (its tasks go to `on_tasks`, on the agent's thread), then
  // writes the port file.
  static absl::StatusOr<std::unique_ptr<NodeDaemon>> Start(
      const Options& options, const std::vector<grpc::Service*>& services, MetricsRegistry* metrics,
      NodeAgent::TasksCallback on_tasks);
  ~NodeDaemon();

  NodeAgent& agent() { return *agent_; }
  const NodeInfo& self() const { return agent_->self(); }
  // "serving on HOST:PORT as ADVERTISED[, metrics on ADVERTISED METRICS]".
  std::string Describe() const;

  // Stops the agent (no more tasks or heartbeats), then the server (calls in
  // flight get 2 s). Call after the runtime stopped using the agent.
  void Shutdown();

 private:
  NodeDaemon() = default;

  std::unique_ptr<MetricsHttpServer> metrics_server_;
  RunningServer server_;
  std::unique_ptr<RemoteCoordinator> coordinator_;
  std::unique_ptr<NodeAgent> agent_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_DAEMON_H_
