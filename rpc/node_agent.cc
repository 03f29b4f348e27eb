#include "rpc/node_agent.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace downpour {

NodeAgent::NodeAgent(Options options, control::Coordinator* coordinator, TasksCallback on_tasks)
    : options_(std::move(options)), coordinator_(coordinator), on_tasks_(std::move(on_tasks)) {}

absl::StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Start(Options options,
                                                            control::Coordinator* coordinator,
                                                            TasksCallback on_tasks) {
  options.self.set_incarnation(absl::ToUnixNanos(absl::Now()));
  if (options.self.hostname().empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.self.set_hostname(host);
  }
  auto agent = std::unique_ptr<NodeAgent>(
      new NodeAgent(std::move(options), coordinator, std::move(on_tasks)));
  const absl::Time give_up = absl::Now() + agent->options_.startup_timeout;
  absl::Status status;
  absl::Duration backoff = absl::Milliseconds(100);
  while (!(status = agent->Register()).ok()) {
    if (absl::Now() + backoff > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "cannot register with coordinator at ", agent->options_.coordinator_name, " within ",
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
  absl::StatusOr<RegisterNodeResponse> response = coordinator_->RegisterNode(options_.self);
  if (!response.ok()) return response.status();
  if (response->heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(response->heartbeat_interval_ms());
  }
  return absl::OkStatus();
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
    {
      absl::MutexLock lock(&mu_);
      request.set_draining(draining_);
    }
    if (options_.add_to_heartbeat) options_.add_to_heartbeat(&request);
    {
      absl::MutexLock lock(&logs_mu_);
      for (JobLogLine& line : pending_logs_) *request.add_logs() = std::move(line);
      pending_logs_.clear();
    }
    absl::StatusOr<HeartbeatResponse> response = coordinator_->Heartbeat(request);
    absl::Status status = response.status();
    if (!status.ok() || response->reregister()) {
      // Not taken: sent again with the next heartbeat, before newer lines.
      absl::MutexLock lock(&logs_mu_);
      for (int i = request.logs_size() - 1; i >= 0; --i) {
        pending_logs_.push_front(std::move(*request.mutable_logs(i)));
      }
      while (pending_logs_.size() > static_cast<size_t>(kMaxPendingLogs)) pending_logs_.pop_front();
    }
    if (status.ok() && response->reregister()) status = Register();
    if (!status.ok()) {
      if (reachable) {
        Log(absl::StrCat("coordinator ", options_.coordinator_name,
                         " unreachable, keeping current tasks: ", status.message()));
      }
      reachable = false;
      continue;
    }
    if (!reachable) {
      Log(absl::StrCat("coordinator ", options_.coordinator_name, " reachable again"));
    }
    reachable = true;
    if (!response->reregister()) {
      on_tasks_(std::vector<Task>(response->tasks().begin(), response->tasks().end()));
      absl::MutexLock lock(&mu_);
      released_ = draining_ && response->released();
    }
  }
}

void NodeAgent::AddJobLog(const std::string& job_id, absl::Time time, absl::string_view text) {
  JobLogLine line;
  line.set_job_id(job_id);
  line.set_source(options_.self.id());
  line.set_time_ms(absl::ToUnixMillis(time));
  line.set_text(std::string(text));
  absl::MutexLock lock(&logs_mu_);
  pending_logs_.push_back(std::move(line));
  while (pending_logs_.size() > static_cast<size_t>(kMaxPendingLogs)) pending_logs_.pop_front();
}

void NodeAgent::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool NodeAgent::WaitReleased(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&released_), timeout);
}

absl::StatusOr<ReportProgressResponse> NodeAgent::ReportProgress(
    const ReportProgressRequest& request) {
  return coordinator_->ReportProgress(request);
}

}  // namespace downpour
