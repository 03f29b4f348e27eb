#include "rpc/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/net_address.h"
#include "common/process_metrics.h"
#include "common/status.h"
#include "grpcpp/health_check_service_interface.h"
#include "rpc/keepalive.h"
#include "rpc/server_metrics.h"

namespace downpour {

absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services,
    MetricsRegistry* metrics, int max_message_bytes,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  auto parsed = ParseHostPort(listen);
  if (!parsed.ok()) return parsed.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      listen, credentials != nullptr ? credentials : grpc::InsecureServerCredentials(), &port);
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon share
  // a busy port silently; an address in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  // Large HTTP/2 frames and windows: tensor messages are megabytes.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  // A worker's shard channels ping while calls are open (rpc/keepalive.h).
  AcceptClientKeepalive(&builder);
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeServerMetricsFactory(metrics));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  RunningServer running;
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or not local)"));
  }
  running.address = JoinHostPort(IsWildcardHost(parsed->host) ? "127.0.0.1" : parsed->host, port);
  running.port = port;
  return running;
}

absl::StatusOr<MetricsHttpOptions> MetricsServing(const std::string& listen,
                                                  const SecurityOptions& security) {
  MetricsHttpOptions options;
  options.listen = listen;
  if (!security.metrics_tls) return options;
  if (security.tls.cert.empty() || security.tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_tls serves /metrics with --tls_cert and --tls_key: give them");
  }
  options.tls_cert_file = security.tls.cert;
  options.tls_key_file = security.tls.key;
  return options;
}

namespace {

// This machine's name, or "" when it has none.
std::string MachineName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// The registered metrics address: where it listens, a wildcard host
// replaced by the advertised one's host.
std::string AdvertisedMetrics(const MetricsHttpServer* server, const std::string& advertised) {
  if (server == nullptr) return "";
  auto bound = ParseHostPort(server->address());
  auto host = ParseHostPort(advertised);
  if (!bound.ok() || !host.ok() || !IsWildcardHost(bound->host)) return server->address();
  return JoinHostPort(host->host, bound->port);
}

}  // namespace

void SetDaemonUsage(const char* usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  // Flags defined in Abseil's own files (--flagfile, --fromenv...) are left
  // to --helpfull.
  const auto ours = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  config.contains_helppackage_flags = ours;
  absl::SetFlagsUsageConfig(config);
}

absl::Status WritePortFile(const std::string& path, const std::string& address) {
  if (path.empty()) return absl::OkStatus();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << address << "\n";
    if (!out.good()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot write port file ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write port file ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal == SIGTERM ? "SIGTERM" : "SIGINT";
}

absl::StatusOr<std::unique_ptr<NodeDaemon>> NodeDaemon::Start(
    const Options& options, const std::vector<grpc::Service*>& services, MetricsRegistry* metrics,
    NodeAgent::TasksCallback on_tasks) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator=HOST:PORT is required");
  }
  RETURN_IF_ERROR(CheckListenSecurity(options.listen, options.security));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> server_credentials,
                   MakeServerCredentials(options.security, ClientCertificates::kRequired));
  ClientCredentials coordinator_credentials;
  ASSIGN_OR_RETURN(coordinator_credentials.channel, MakeChannelCredentials(options.security));
  auto daemon = std::unique_ptr<NodeDaemon>(new NodeDaemon());
  ASSIGN_OR_RETURN(const MetricsHttpOptions metrics_serving,
                   MetricsServing(options.metrics_listen, options.security));
  ASSIGN_OR_RETURN(daemon->metrics_server_,
                   MetricsHttpServer::StartIfRequested(metrics_serving, metrics));
  ASSIGN_OR_RETURN(daemon->server_, StartGrpcServer(options.listen, services, metrics, 256 << 20,
                                                    std::move(server_credentials)));
  ASSIGN_OR_RETURN(daemon->coordinator_,
                   RemoteCoordinator::Create(options.coordinator, coordinator_credentials));
  // A heartbeat that takes longer than this counts as missed.
  daemon->coordinator_->set_rpc_timeout(absl::Seconds(5));

  ASSIGN_OR_RETURN(const HostPort listen, ParseHostPort(options.listen));
  ASSIGN_OR_RETURN(
      const std::string address,
      AdvertisedAddress(options.advertise, listen.host, daemon->server_.port, MachineName()));

  NodeAgent::Options agent;
  agent.coordinator_name = options.coordinator;
  agent.startup_timeout = options.coordinator_timeout;
  agent.self.set_id(!options.node_id.empty()
                        ? options.node_id
                        : absl::StrCat(options.role == SHARD ? "ps@" : "worker@", address));
  agent.self.set_role(options.role);
  agent.self.set_address(address);
  agent.self.set_metrics_address(AdvertisedMetrics(daemon->metrics_server_.get(), address));
  for (const std::string& device : options.devices) agent.self.add_devices(device);
  agent.self.set_checkpoints(options.checkpoints);
  agent.self.set_memory_limit_bytes(options.memory_limit_bytes);
  // Unreadable (no procfs): the coordinator knows nothing of the host.
  absl::StatusOr<double> host_memory = ReadMemoryLimit();
  if (host_memory.ok()) agent.self.set_host_memory_bytes(static_cast<int64_t>(*host_memory));
  agent.add_to_heartbeat = options.add_to_heartbeat;
  ASSIGN_OR_RETURN(daemon->agent_,
                   NodeAgent::Start(agent, daemon->coordinator_.get(), std::move(on_tasks)));
  // The node's lines about a job ("job ID: ...") go to the coordinator, for
  // downpourctl logs.
  SetLogObserver([agent = daemon->agent_.get()](absl::Time time, absl::string_view message) {
    if (!absl::ConsumePrefix(&message, "job ")) return;
    const size_t colon = message.find(": ");
    if (colon == absl::string_view::npos || colon == 0) return;
    agent->AddJobLog(std::string(message.substr(0, colon)), time, message.substr(colon + 2));
  });
  RETURN_IF_ERROR(WritePortFile(options.port_file, address));
  return daemon;
}

NodeDaemon::~NodeDaemon() { Shutdown(); }

std::string NodeDaemon::Describe() const {
  return absl::StrCat("serving on ", server_.address, " as ", self().address(),
                      metrics_server_ ? absl::StrCat(", metrics on ", self().metrics_address(),
                                                     metrics_server_->tls() ? " (HTTPS)" : "")
                                      : "");
}

void NodeDaemon::Shutdown() {
  if (agent_ != nullptr) SetLogObserver(nullptr);
  agent_.reset();
  if (server_.server != nullptr) {
    server_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.server.reset();
  }
}

}  // namespace downpour
