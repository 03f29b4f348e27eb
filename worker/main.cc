// downpour-worker: one per host. Registers with the coordinator, and for every
// job it is given runs a JobTrainer (a model replica) against the job's
// parameter shards. Flags are parsed here once into options.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/platform/malloc_tuning.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "core/model.h"
#include "kernels/cpu.h"
#include "kernels/cuda.h"
#include "rpc/node_agent.h"
#include "rpc/ps_client.h"
#include "rpc/server_util.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address HOST:PORT (port 0 picks one)");
ABSL_FLAG(std::string, port_file, "", "File to write the bound HOST:PORT to once serving");
ABSL_FLAG(std::string, metrics_listen, "", "HTTP address for /metrics (empty: off)");
ABSL_FLAG(std::string, coordinator, "", "Coordinator HOST:PORT (required)");
ABSL_FLAG(int64_t, coordinator_timeout_ms, 30000,
          "Start-up fails unless the coordinator accepts the registration within this");
ABSL_FLAG(std::string, node_id, "", "Stable node name (default: worker@<listen address>)");
ABSL_FLAG(std::string, data_dir, ".", "Relative record-file globs of jobs resolve against this");
ABSL_FLAG(int32_t, compute_threads, 1, "CPU threads for the math of each replica");
ABSL_FLAG(std::string, devices, "auto",
          "Compute devices: 'auto' (every visible GPU, else the CPU), 'cpu', or CUDA device "
          "numbers as this process sees them after CUDA_VISIBLE_DEVICES, e.g. '0,1'; with no "
          "GPU present the worker falls back to the CPU and says so in its log");
ABSL_FLAG(int64_t, pull_timeout_ms, 120000,
          "How long a pull may wait for other workers or a shard before the job fails");
ABSL_FLAG(int64_t, push_timeout_ms, 30000,
          "How long a push may be retried against a dead or frozen shard before the job fails");
ABSL_FLAG(int32_t, channels_per_shard, 2, "gRPC connections to each parameter shard");
ABSL_FLAG(int32_t, max_inflight, 4, "Push/pull messages in flight at once per job");

namespace downpour {
namespace {

// The --devices flag resolved: CUDA device numbers, empty for the CPU.
absl::StatusOr<std::vector<int>> ResolveDevices(const std::string& flag) {
  if (flag == "cpu") return std::vector<int>();
  const int count = kernels::cuda::CudaDeviceCount();
  std::vector<int> devices;
  if (flag == "auto" || flag.empty()) {
    for (int d = 0; d < count; ++d) devices.push_back(d);
  } else {
    for (absl::string_view part : absl::StrSplit(flag, ',')) {
      int d = -1;
      if (!absl::SimpleAtoi(part, &d) || d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--devices must be 'auto', 'cpu' or CUDA device numbers like 0,1; got '", flag, "'"));
      }
      if (count > 0 && d >= count) {
        const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
        return absl::InvalidArgumentError(absl::StrCat(
            "--devices: CUDA device ", d, " does not exist; this process sees ", count,
            visible ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : std::string()));
      }
      devices.push_back(d);
    }
  }
  if (count == 0) {
    Log(absl::StrCat("--devices=", flag, ": ", kernels::cuda::CudaUnavailableReason(),
                     "; computing on the CPU"));
    return std::vector<int>();
  }
  return devices;
}

// The jobs this worker runs, reconciled with the coordinator's task list.
class WorkerRuntime {
 public:
  WorkerRuntime(TrainerOptions options) : options_(std::move(options)) {}
  ~WorkerRuntime() { StopAll(); }

  void set_agent(NodeAgent* agent) { agent_.store(agent); }

  void OnTasks(const std::vector<Task>& tasks) {
    // Tasks arriving before the agent is published come again next heartbeat.
    if (agent_.load() == nullptr) return;
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    std::set<std::string> current;
    for (const Task& task : tasks) {
      current.insert(task.job_id());
      if (running_.count(task.job_id())) continue;
      Start(task);
    }
    for (auto& [id, job] : running_) {
      if (!current.count(id)) job->trainer->Cancel();
    }
    // Forget ended jobs whose thread has returned.
    for (auto it = running_.begin(); it != running_.end();) {
      if (!current.count(it->first) && it->second->done.load()) {
        it->second->thread.join();
        Forget(it->first);
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Cancels and joins every trainer; no job starts afterwards. Call before
  // the agent goes away: trainers report through it.
  void StopAll() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, job] : running_) job->trainer->Shutdown();
    for (auto& [id, job] : running_) {
      job->thread.join();
      Forget(id);
    }
    running_.clear();
  }

 private:
  // Drops the per-job metric series of an ended job, so a long-lived worker
  // does not accumulate them.
  void Forget(const std::string& job_id) {
    if (options_.metrics == nullptr) return;
    for (const char* name : {"downpour_worker_steps_total", "downpour_worker_loss",
                             "downpour_worker_examples_per_second"}) {
      options_.metrics->RemoveSeries(name, {{"job", job_id}});
    }
  }

  struct RunningJob {
    std::vector<std::unique_ptr<RemoteParameterShard>> shards;
    std::unique_ptr<JobTrainer> trainer;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void Start(const Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto job = std::make_unique<RunningJob>();
    std::vector<ParameterShard*> shards;
    for (const std::string& address : task.shard_addresses()) {
      RemoteParameterShard::Options shard_options;
      // One attempt; the trainer retries within the same total budget.
      shard_options.push_timeout = options_.push_timeout;
      shard_options.num_channels = options_.channels_per_shard;
      job->shards.push_back(RemoteParameterShard::Create(address, shard_options));
      shards.push_back(job->shards.back().get());
    }
    TrainerOptions options = options_;
    options.incarnation = agent_.load()->self().incarnation();
    job->trainer = std::make_unique<JobTrainer>(
        task, options, shards,
        [this](const ReportProgressRequest& request) -> absl::StatusOr<bool> {
          auto response = agent_.load()->ReportProgress(request);
          if (!response.ok()) return response.status();
          return response->job_ended();
        });
    Log(absl::StrCat("job ", task.job_id(), ": starting as worker rank ", task.rank(), " of ",
                     task.spec().num_workers(), ", ", task.shard_addresses_size(), " shards"));
    RunningJob* raw = job.get();
    const std::string id = task.job_id();
    job->thread = std::thread([raw, id] {
      absl::Status status = raw->trainer->Run();
      Log(absl::StrCat("job ", id, ": ", status.ok() ? "finished" : status.ToString()));
      raw->done.store(true);
    });
    running_[id] = std::move(job);
  }

  const TrainerOptions options_;
  std::atomic<NodeAgent*> agent_{nullptr};
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<RunningJob>> running_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

int Main() {
  BlockTerminationSignals();
  SetLogPrefix("downpour-worker");
  if (absl::GetFlag(FLAGS_coordinator).empty()) {
    return ExitWithError(absl::InvalidArgumentError("--coordinator=HOST:PORT is required"));
  }
  if (absl::GetFlag(FLAGS_compute_threads) < 1) {
    return ExitWithError(absl::InvalidArgumentError("--compute_threads must be at least 1"));
  }
  if (access(absl::GetFlag(FLAGS_data_dir).c_str(), R_OK | X_OK) != 0) {
    return ExitWithError(absl::NotFoundError(absl::StrCat(
        "--data_dir ", absl::GetFlag(FLAGS_data_dir), " is not a readable directory")));
  }
  kernels::cpu::SetCpuThreads(absl::GetFlag(FLAGS_compute_threads));
  auto devices = ResolveDevices(absl::GetFlag(FLAGS_devices));
  if (!devices.ok()) return ExitWithError(devices.status());
  std::vector<std::string> device_names;
  for (int d : *devices) {
    auto name = DescribeDevice(d);
    if (!name.ok()) return ExitWithError(name.status());
    device_names.push_back(*name);
  }
  if (device_names.empty()) device_names.push_back("cpu");

  MetricsRegistry metrics;
  auto metrics_server =
      MetricsHttpServer::StartIfRequested(absl::GetFlag(FLAGS_metrics_listen), &metrics);
  if (!metrics_server.ok()) return ExitWithError(metrics_server.status());
  auto server = StartGrpcServer(absl::GetFlag(FLAGS_listen), {});
  if (!server.ok()) return ExitWithError(server.status());

  NodeAgent::Options agent_options = NodeAgent::Options::For(
      WORKER, absl::GetFlag(FLAGS_coordinator),
      absl::Milliseconds(absl::GetFlag(FLAGS_coordinator_timeout_ms)), absl::GetFlag(FLAGS_node_id),
      server->address, *metrics_server ? (*metrics_server)->address() : "");
  NodeInfo& self = agent_options.self;
  for (const std::string& name : device_names) self.add_devices(name);
  for (const std::string& name : device_names) {
    metrics.GetGauge("downpour_worker_devices", "Compute devices in use.", {{"device", name}})
        ->Set(1);
  }

  TrainerOptions trainer_options;
  trainer_options.node_id = self.id();
  // One model replica per listed GPU (or one on the CPU).
  trainer_options.devices = *devices;
  trainer_options.data_dir = absl::GetFlag(FLAGS_data_dir);
  trainer_options.pull_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_pull_timeout_ms));
  trainer_options.push_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_push_timeout_ms));
  trainer_options.channels_per_shard = absl::GetFlag(FLAGS_channels_per_shard);
  trainer_options.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  trainer_options.metrics = &metrics;
  auto runtime = std::make_unique<WorkerRuntime>(trainer_options);
  auto agent = NodeAgent::Start(
      agent_options, [&runtime](const std::vector<Task>& tasks) { runtime->OnTasks(tasks); });
  if (!agent.ok()) return ExitWithError(agent.status());
  runtime->set_agent(agent->get());

  absl::Status written = WritePortFile(absl::GetFlag(FLAGS_port_file), server->address);
  if (!written.ok()) return ExitWithError(written);
  Log(absl::StrCat(
      "worker ", self.id(), " serving on ", server->address, ", device ",
      absl::StrJoin(device_names, ", "),
      *metrics_server ? absl::StrCat(", metrics on ", (*metrics_server)->address()) : ""));

  const std::string signal = WaitForTerminationSignal();
  Log(absl::StrCat(signal, " received, shutting down"));
  runtime->StopAll();
  agent->reset();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "downpour-worker --coordinator=HOST:PORT [--listen=HOST:PORT] [--data_dir=DIR]");
  absl::ParseCommandLine(argc, argv);
  downpour::KeepTensorBuffersMapped();
  return downpour::Main();
}
