#include "rpc/node_agent.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "rpc/grpc_status.h"

namespace downpour {

NodeAgent::Options NodeAgent::Options::For(NodeRole role, const std::string& coordinator,
                                           absl::Duration startup_timeout,
                                           const std::string& node_id, const std::string& address,
                                           const std::string& metrics_address) {
  Options options;
  options.coordinator = coordinator;
  options.startup_timeout = startup_timeout;
  options.self.set_id(!node_id.empty() ? node_id
                                       : absl::StrCat(role == SHARD ? "ps@" : "worker@", address));
  options.self.set_role(role);
  options.self.set_address(address);
  options.self.set_metrics_address(metrics_address);
  return options;
}

NodeAgent::NodeAgent(Options options, TasksCallback on_tasks)
    : options_(std::move(options)), on_tasks_(std::move(on_tasks)) {
  stub_ = Coordinator::NewStub(
      grpc::CreateChannel(options_.coordinator, grpc::InsecureChannelCredentials()));
}

absl::StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Start(Options options,
                                                            TasksCallback on_tasks) {
  options.self.set_incarnation(absl::ToUnixNanos(absl::Now()));
  if (options.self.hostname().empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.self.set_hostname(host);
  }
  auto agent = std::unique_ptr<NodeAgent>(new NodeAgent(std::move(options), std::move(on_tasks)));
  const absl::Time give_up = absl::Now() + agent->options_.startup_timeout;
  absl::Status status;
  absl::Duration backoff = absl::Milliseconds(100);
  while (!(status = agent->Register()).ok()) {
    if (absl::Now() + backoff > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "cannot register with coordinator at ", agent->options_.coordinator, " within ",
          absl::FormatDuration(agent->options_.startup_timeout), ": ", status.message()));
    }
    absl::SleepFor(backoff);  // Start-up only; nothing else is running yet.
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  agent->thread_ = std::thread([a = agent.get()] { a->HeartbeatLoop(); });
  return agent;
}

NodeAgent::~NodeAgent() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status NodeAgent::Register() {
  RegisterNodeRequest request;
  *request.mutable_node() = options_.self;
  RegisterNodeResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, absl::ToChronoMilliseconds(options_.rpc_timeout));
  absl::Status status = FromGrpcStatus(stub_->RegisterNode(&context, request, &response));
  if (status.ok() && response.heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  return status;
}

void NodeAgent::HeartbeatLoop() {
  bool reachable = true;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) return;
    }
    HeartbeatRequest request;
    request.set_node_id(options_.self.id());
    request.set_incarnation(options_.self.incarnation());
    HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, absl::ToChronoMilliseconds(options_.rpc_timeout));
    absl::Status status = FromGrpcStatus(stub_->Heartbeat(&context, request, &response));
    if (status.ok() && response.reregister()) status = Register();
    if (!status.ok()) {
      if (reachable) {
        Log(absl::StrCat("coordinator ", options_.coordinator,
                         " unreachable, keeping current tasks: ", status.message()));
      }
      reachable = false;
      continue;
    }
    if (!reachable) Log(absl::StrCat("coordinator ", options_.coordinator, " reachable again"));
    reachable = true;
    if (!response.reregister()) {
      on_tasks_(std::vector<Task>(response.tasks().begin(), response.tasks().end()));
    }
  }
}

absl::StatusOr<ReportProgressResponse> NodeAgent::ReportProgress(
    const ReportProgressRequest& request) {
  ReportProgressResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, absl::ToChronoMilliseconds(options_.rpc_timeout));
  absl::Status status = FromGrpcStatus(stub_->ReportProgress(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

}  // namespace downpour
