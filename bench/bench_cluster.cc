#include "bench/bench_cluster.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace downpour {
namespace bench {

absl::StatusOr<std::unique_ptr<BenchCluster>> BenchCluster::Start(const Options& options) {
  std::unique_ptr<BenchCluster> cluster(new BenchCluster());
  testing::LocalCluster::Options daemons;
  daemons.shards = options.shards;
  daemons.workers = 0;
  daemons.shard_flags = options.shard_flags;
  daemons.heartbeat_interval_ms = 100;
  daemons.node_timeout_ms = 20000;
  cluster->processes_ = std::make_unique<testing::LocalCluster>(daemons);
  RETURN_IF_ERROR(cluster->processes_->Start());
  const std::string address = cluster->processes_->coordinator_address();
  ASSIGN_OR_RETURN(cluster->coordinator_, RemoteCoordinator::Connect(address));
  {
    absl::MutexLock lock(&cluster->mu_);
    cluster->tasks_.resize(options.workers);
  }
  for (int w = 0; w < options.workers; ++w) {
    NodeAgent::Options agent;
    agent.coordinator_name = address;
    agent.self.set_id(absl::StrCat(options.worker_id_prefix, w));
    agent.self.set_role(WORKER);
    agent.self.set_address("127.0.0.1:1");  // Serves nothing; the field is required.
    agent.self.set_hostname("localhost");
    BenchCluster* self = cluster.get();
    ASSIGN_OR_RETURN(auto started, NodeAgent::Start(agent, cluster->coordinator_.get(),
                                                    [self, w](const std::vector<Task>& tasks) {
                                                      absl::MutexLock lock(&self->mu_);
                                                      self->tasks_[w] = tasks;
                                                    }));
    cluster->agents_.push_back(std::move(started));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, cluster->coordinator_->ListNodes());
    int alive = 0;
    for (const NodeInfo& n : nodes) alive += n.alive() ? 1 : 0;
    if (alive >= options.shards + options.workers) break;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("nodes did not register");
    absl::SleepFor(absl::Milliseconds(50));
  }
  return cluster;
}

BenchCluster::~BenchCluster() {
  agents_.clear();
  if (processes_) processes_->StopAll();
}

absl::StatusOr<std::vector<Task>> BenchCluster::AwaitTasks(const std::string& job_id, int workers) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    std::vector<Task> tasks;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& node_tasks : tasks_) {
        for (const Task& t : node_tasks) {
          if (t.job_id() == job_id) tasks.push_back(t);
        }
      }
    }
    if (static_cast<int>(tasks.size()) == workers) {
      std::sort(tasks.begin(), tasks.end(),
                [](const Task& a, const Task& b) { return a.rank() < b.rank(); });
      return tasks;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " was not scheduled"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::string BenchCluster::Logs() const { return processes_ ? processes_->Logs() : ""; }

}  // namespace bench
}  // namespace downpour
