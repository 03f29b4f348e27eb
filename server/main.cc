// downpour-ps: one parameter shard. Registers with the coordinator, hosts the
// partitions the coordinator places on it for every running job, and serves
// pushes and pulls. Flags are parsed here once into options.
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/platform/malloc_tuning.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "core/model_shape.h"
#include "core/parameter_store.h"
#include "core/shard_map.h"
#include "rpc/node_agent.h"
#include "rpc/ps_service.h"
#include "rpc/server_util.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address HOST:PORT (port 0 picks one)");
ABSL_FLAG(std::string, port_file, "", "File to write the bound HOST:PORT to once serving");
ABSL_FLAG(std::string, metrics_listen, "", "HTTP address for /metrics (empty: off)");
ABSL_FLAG(std::string, coordinator, "", "Coordinator HOST:PORT (required)");
ABSL_FLAG(int64_t, coordinator_timeout_ms, 30000,
          "Start-up fails unless the coordinator accepts the registration within this");
ABSL_FLAG(std::string, node_id, "", "Stable node name (default: ps@<listen address>)");

namespace downpour {
namespace {

// Keeps the store's jobs equal to the coordinator's task list.
class ShardRuntime {
 public:
  ShardRuntime(ParameterStore* store, MetricsRegistry* metrics)
      : store_(store),
        jobs_gauge_(metrics->GetGauge("downpour_ps_jobs", "Jobs hosted on this shard.")),
        bytes_gauge_(metrics->GetGauge("downpour_ps_parameter_bytes",
                                       "Parameter bytes hosted on this shard.")) {}

  void OnTasks(const std::vector<Task>& tasks) {
    absl::MutexLock lock(&mu_);
    std::set<std::string> current;
    for (const Task& task : tasks) {
      current.insert(task.job_id());
      if (hosted_.count(task.job_id()) || failed_.count(task.job_id())) continue;
      absl::Status added = Host(task);
      if (!added.ok()) {
        // The coordinator validated the spec, so this is a version mismatch
        // or a resource problem; workers get the reason with their next
        // request and fail the job with it.
        Log(absl::StrCat("job ", task.job_id(), ": cannot host: ", added.message()));
        store_->RefuseJob(task.job_id(), added);
        failed_.insert(task.job_id());
      }
    }
    // A job that could not be hosted is forgotten once it ends.
    for (auto it = failed_.begin(); it != failed_.end();) {
      if (current.count(*it)) {
        ++it;
        continue;
      }
      store_->DropJob(*it);
      it = failed_.erase(it);
    }
    for (auto it = hosted_.begin(); it != hosted_.end();) {
      if (current.count(it->first)) {
        ++it;
        continue;
      }
      store_->DropJob(it->first);
      Log(absl::StrCat("job ", it->first, ": ended, partitions dropped"));
      bytes_ -= it->second;
      it = hosted_.erase(it);
    }
    jobs_gauge_->Set(hosted_.size());
    bytes_gauge_->Set(bytes_);
  }

 private:
  absl::Status Host(const Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto shape = InferModel(task.spec().model());
    if (!shape.ok()) return shape.status();
    std::vector<PartitionPlacement> partitions(task.placement().partitions().begin(),
                                               task.placement().partitions().end());
    absl::Status added =
        store_->AddJob(task.job_id(), task.spec(), task.rank(), shape->params, partitions);
    if (!added.ok()) return added;
    const int64_t bytes =
        BytesPerShard(partitions, task.placement().shard_nodes_size())[task.rank()];
    hosted_[task.job_id()] = bytes;
    bytes_ += bytes;
    Log(absl::StrCat("job ", task.job_id(), ": hosting shard ", task.rank(), " (", bytes,
                     " parameter bytes)"));
    return absl::OkStatus();
  }

  ParameterStore* const store_;
  Gauge* const jobs_gauge_;
  Gauge* const bytes_gauge_;
  absl::Mutex mu_;
  std::map<std::string, int64_t> hosted_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> failed_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

int Main() {
  BlockTerminationSignals();
  SetLogPrefix("downpour-ps");
  if (absl::GetFlag(FLAGS_coordinator).empty()) {
    return ExitWithError(absl::InvalidArgumentError("--coordinator=HOST:PORT is required"));
  }
  MetricsRegistry metrics;
  auto metrics_server =
      MetricsHttpServer::StartIfRequested(absl::GetFlag(FLAGS_metrics_listen), &metrics);
  if (!metrics_server.ok()) return ExitWithError(metrics_server.status());
  ParameterStore store;
  ParameterServerService service(&store);
  auto server = StartGrpcServer(absl::GetFlag(FLAGS_listen), {&service});
  if (!server.ok()) return ExitWithError(server.status());

  ShardRuntime runtime(&store, &metrics);
  NodeAgent::Options agent_options = NodeAgent::Options::For(
      SHARD, absl::GetFlag(FLAGS_coordinator),
      absl::Milliseconds(absl::GetFlag(FLAGS_coordinator_timeout_ms)), absl::GetFlag(FLAGS_node_id),
      server->address, *metrics_server ? (*metrics_server)->address() : "");
  NodeInfo& self = agent_options.self;
  auto agent = NodeAgent::Start(
      agent_options, [&runtime](const std::vector<Task>& tasks) { runtime.OnTasks(tasks); });
  if (!agent.ok()) return ExitWithError(agent.status());

  absl::Status written = WritePortFile(absl::GetFlag(FLAGS_port_file), server->address);
  if (!written.ok()) return ExitWithError(written);
  Log(absl::StrCat(
      "shard ", self.id(), " serving on ", server->address,
      *metrics_server ? absl::StrCat(", metrics on ", (*metrics_server)->address()) : ""));

  const std::string signal = WaitForTerminationSignal();
  Log(absl::StrCat(signal, " received, shutting down"));
  agent->reset();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("downpour-ps --coordinator=HOST:PORT [--listen=HOST:PORT]");
  absl::ParseCommandLine(argc, argv);
  downpour::KeepTensorBuffersMapped();
  return downpour::Main();
}
