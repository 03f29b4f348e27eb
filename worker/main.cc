// downpour-worker: one per host. Registers with the coordinator, and for every
// job it is given runs a JobTrainer (model replicas on its devices) against
// the job's parameter shards (worker/worker_runtime.h). Flags are parsed here
// once into options.
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/platform/malloc_tuning.h"
#include "common/platform/mutex_tuning.h"
#include "common/process_metrics.h"
#include "data/data_roots.h"
#include "model/devices.h"
#include "rpc/daemon.h"
#include "rpc/node_flags.h"
#include "rpc/remote_parameter_shard.h"
#include "rpc/security.h"
#include "worker/worker_metrics.h"
#include "worker/worker_runtime.h"

ABSL_FLAG(std::string, data_dir, ".",
          "The directory jobs' record files are read from: a job names them relative to it "
          "(an absolute name or '..' is refused at submit), and a file whose real path, "
          "symlinks followed, is outside it and --data_roots fails the job");
ABSL_FLAG(std::string, data_roots, "",
          "Comma-separated absolute directories that symlinks under --data_dir may lead into "
          "(e.g. a dataset on another volume); empty: --data_dir only");
ABSL_FLAG(int32_t, compute_threads, 1, "CPU threads for the math of each replica");
ABSL_FLAG(std::string, devices, "auto",
          "Compute devices: 'auto' (every visible GPU, else the CPU), 'cpu', or CUDA device "
          "numbers as this process sees them after CUDA_VISIBLE_DEVICES, e.g. '0,1'; with no "
          "GPU present the worker falls back to the CPU and says so in its log (a worker built "
          "without CUDA refuses device numbers). A model replica runs on each device, or, for a "
          "job split into pipeline stages (model.pipeline), stage i on the i-th device (one per "
          "stage; 'cpu': every stage on the CPU)");
ABSL_FLAG(std::string, device_memory_limit, "auto",
          "The most compute memory, in bytes, that the worker's model replicas and pipeline "
          "stages may hold on each device, together (parameters, gradients, activations, "
          "workspace, reduced weight copies; two ranks trained on one worker share it); a job "
          "that needs more fails naming the device. auto: on the CPU 80% of what the "
          "process may use (its cgroup's limit, else the machine's memory), on GPUs the device's "
          "own; 0: no limit. The coordinator places jobs only where they fit it. Tries on a large "
          "GPU whether a model fits a smaller one, whole or in pipeline stages");
ABSL_FLAG(bool, conv_graph, true,
          "GPU convolutions may run through cuDNN's graph API where one of its engines times "
          "faster than the legacy algorithms for a shape (timed once per shape on the first "
          "step); false: the legacy algorithms only");
ABSL_FLAG(int64_t, pull_timeout_ms, 120000,
          "How long a pull may wait for other workers or a shard before the job fails");
ABSL_FLAG(int64_t, push_timeout_ms, 30000,
          "How long a push may take, retries against a dead or frozen shard included, before "
          "the job fails");
ABSL_FLAG(int32_t, channels_per_shard, 4, "gRPC connections to each parameter shard");
ABSL_FLAG(bool, shared_memory, true,
          "Exchange tensor bytes with parameter shards on this host through shared memory "
          "(only the headers go over gRPC); the log says per shard whether it is used");
ABSL_FLAG(int32_t, max_inflight, 0,
          "Push/pull messages in flight at once per job; 0: chosen per job from its measured "
          "step times among 2, 4, ..., 64 (deeper where round trips are long and the link fast, "
          "shallower where the link is the bound), and measured again every 2000 steps");
ABSL_FLAG(bool, overlap, true,
          "Push each step's gradients (and pull the parameters back) message by message while "
          "backward still runs; false: after it (the serial path, for comparison)");
ABSL_FLAG(bool, pull_reduced_weights, true,
          "A bf16/fp16 job on GPUs pulls the dense and convolution weights (which its GPUs read "
          "only in that type) as bf16/fp16: half their bytes, the same steps; false: every "
          "parameter as float32");
ABSL_FLAG(int64_t, job_metrics_grace_s, 600,
          "How long an ended job's metric series (its steps, losses, step times, traffic per "
          "shard) stay on /metrics with their last values before they are dropped");
ABSL_FLAG(std::string, testing_stall_mid_push, "",
          "Testing only: JOB:RANK:STEP stalls that rank's push of that step after shard 0, "
          "for a test to kill the worker between its pushes to two shards; JOB:RANK:STEP:stale "
          "pushes the rest once the rank went elsewhere");
ABSL_FLAG(int64_t, message_kb, 0,
          "Largest push/pull message in KiB (partitions are never split); 0: the model's size / "
          "32, within 256 KiB..4 MiB. Smaller messages spread a step's exchange over more "
          "threads and connections");

namespace downpour {
namespace {

// The --devices flag resolved: CUDA device numbers, empty for the CPU.
absl::StatusOr<std::vector<int>> ResolveDevices(const std::string& flag) {
  if (flag == "cpu") return std::vector<int>();
  const int count = GpuCount();
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
  // A GPU named outright from a worker built without CUDA is refused rather
  // than quietly run on the CPU: no host could give it that GPU.
  if (!devices.empty() && !BuiltWithCuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--devices=", flag, ": ", DescribeDevice(devices[0]).status().message(),
                     "; --devices=cpu or auto computes on the CPU"));
  }
  if (count == 0) {
    Log(absl::StrCat("--devices=", flag, ": ", GpuUnavailableReason(), "; computing on the CPU"));
    return std::vector<int>();
  }
  return devices;
}

int Main() {
  BlockTerminationSignals();
  SetLogPrefix("downpour-worker");
  NodeDaemon::Options daemon_options = NodeDaemonOptionsFromFlags(WORKER);
  if (absl::GetFlag(FLAGS_compute_threads) < 1) {
    return ExitWithError(absl::InvalidArgumentError("--compute_threads must be at least 1"));
  }
  if (absl::GetFlag(FLAGS_max_inflight) < 0 || absl::GetFlag(FLAGS_max_inflight) > 1024) {
    return ExitWithError(absl::InvalidArgumentError(
        "--max_inflight must be between 0 (chosen from step times) and 1024"));
  }
  if (absl::GetFlag(FLAGS_message_kb) < 0 || absl::GetFlag(FLAGS_message_kb) > (1 << 20)) {
    return ExitWithError(absl::InvalidArgumentError(
        "--message_kb must be between 0 (automatic) and 1048576 (1 GiB)"));
  }
  if (access(absl::GetFlag(FLAGS_data_dir).c_str(), R_OK | X_OK) != 0) {
    return ExitWithError(absl::NotFoundError(absl::StrCat(
        "--data_dir ", absl::GetFlag(FLAGS_data_dir), " is not a readable directory")));
  }
  std::vector<std::string> data_roots;
  for (absl::string_view root :
       absl::StrSplit(absl::GetFlag(FLAGS_data_roots), ',', absl::SkipEmpty())) {
    data_roots.emplace_back(root);
  }
  // Checked once here, so a bad entry stops the worker at start.
  absl::StatusOr<data::DataRoots> roots =
      data::DataRoots::Create(absl::GetFlag(FLAGS_data_dir), data_roots);
  if (!roots.ok()) return ExitWithError(roots.status());
  // Checked before the devices are looked at (they may say something).
  const std::string memory_flag = absl::GetFlag(FLAGS_device_memory_limit);
  if (absl::Status valid = ParseMemoryLimitFlag("device_memory_limit", memory_flag, 0).status();
      !valid.ok()) {
    return ExitWithError(valid);
  }
  if (absl::GetFlag(FLAGS_job_metrics_grace_s) < 0) {
    return ExitWithError(absl::InvalidArgumentError("--job_metrics_grace_s must not be negative"));
  }
  SetCpuThreads(absl::GetFlag(FLAGS_compute_threads));
  auto devices = ResolveDevices(absl::GetFlag(FLAGS_devices));
  if (!devices.ok()) return ExitWithError(devices.status());
  for (int d : *devices) {
    auto name = DescribeDevice(d);
    if (!name.ok()) return ExitWithError(name.status());
    daemon_options.devices.push_back(*name);
  }
  if (daemon_options.devices.empty()) daemon_options.devices.push_back("cpu");
  // On the CPU the model shares the host's memory with everything else:
  // "auto" budgets it; on a GPU the device's own size is the limit.
  absl::StatusOr<int64_t> memory_limit = ParseMemoryLimitFlag(
      "device_memory_limit", memory_flag, devices->empty() ? kAutoMemoryShare : 0.0);
  if (!memory_limit.ok()) return ExitWithError(memory_limit.status());
  daemon_options.memory_limit_bytes = *memory_limit;
  if (memory_flag == "auto" && !devices->empty()) {
    // The smallest device's memory, as the coordinator's budget.
    for (int d : *devices) {
      absl::StatusOr<std::pair<int64_t, int64_t>> used_total = GpuMemoryUsedAndTotal(d);
      if (!used_total.ok()) continue;
      if (daemon_options.memory_limit_bytes == 0 ||
          used_total->second < daemon_options.memory_limit_bytes) {
        daemon_options.memory_limit_bytes = used_total->second;
      }
    }
  }

  MetricsRegistry metrics;
  AddBuildInfo(&metrics, "downpour-worker");
  AddProcessMetrics(&metrics);
  for (const std::string& name : daemon_options.devices) {
    metrics.GetGauge("downpour_worker_devices", "Compute devices in use.", {{"device", name}})
        ->Set(1);
  }
  // Named as above ("cpu" alone when there is no GPU: no series).
  AddGpuMemoryMetrics(&metrics, *devices,
                      devices->empty() ? std::vector<std::string>() : daemon_options.devices,
                      GpuMemoryUsedAndTotal);
  TrainerOptions trainer_options;
  // One model replica per listed GPU (or one on the CPU), or a pipeline
  // stage per listed GPU for a job whose model is split into stages.
  trainer_options.devices = *devices;
  // On GPUs "auto" caps nothing: the device's own size is the limit.
  trainer_options.device_memory = std::make_shared<kernels::MemoryCaps>(*memory_limit);
  trainer_options.conv_graph = absl::GetFlag(FLAGS_conv_graph);
  trainer_options.data_dir = absl::GetFlag(FLAGS_data_dir);
  trainer_options.data_roots = data_roots;
  trainer_options.exchange.pull_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_pull_timeout_ms));
  trainer_options.exchange.push_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_push_timeout_ms));
  // Tuned: up to 64 messages in flight, the window's deepest.
  const int inflight = absl::GetFlag(FLAGS_max_inflight);
  trainer_options.exchange.max_inflight = inflight > 0 ? inflight : 64;
  trainer_options.tune_window = inflight == 0;
  trainer_options.exchange.message_bytes = absl::GetFlag(FLAGS_message_kb) << 10;
  trainer_options.overlap = absl::GetFlag(FLAGS_overlap);
  trainer_options.pull_reduced_weights = absl::GetFlag(FLAGS_pull_reduced_weights);
  trainer_options.testing_stall_mid_push = absl::GetFlag(FLAGS_testing_stall_mid_push);
  trainer_options.metrics = &metrics;
  RemoteParameterShard::Options shard_options;
  // One attempt may take the whole budget (a frozen shard fails the push at
  // its end); the exchange retries attempts that fail sooner (a lost
  // connection) within it.
  shard_options.push_attempt_timeout = trainer_options.exchange.push_timeout;
  shard_options.num_channels = absl::GetFlag(FLAGS_channels_per_shard);
  shard_options.use_shared_memory = absl::GetFlag(FLAGS_shared_memory);
  shard_options.log = [](const std::string& line) { Log(line); };
  auto shard_credentials = MakeChannelCredentials(daemon_options.security);
  if (!shard_credentials.ok()) return ExitWithError(shard_credentials.status());
  shard_options.credentials = *std::move(shard_credentials);
  WorkerRuntime runtime(
      trainer_options,
      [shard_options](const std::string& address) {
        return std::unique_ptr<ParameterShard>(
            RemoteParameterShard::Create(address, shard_options));
      },
      /*failed_run_grace=*/absl::Seconds(10),
      /*metrics_grace=*/absl::Seconds(absl::GetFlag(FLAGS_job_metrics_grace_s)),
      /*release_memory=*/ReleaseMemoryFreedBy);
  auto daemon =
      NodeDaemon::Start(daemon_options, {}, &metrics,
                        [&runtime](const std::vector<Task>& tasks) { runtime.OnTasks(tasks); });
  if (!daemon.ok()) return ExitWithError(daemon.status());
  runtime.set_agent(&(*daemon)->agent());
  Log(absl::StrCat("worker ", (*daemon)->self().id(), " ", (*daemon)->Describe(), ", device ",
                   absl::StrJoin(daemon_options.devices, ", ")));

  const std::string signal = WaitForTerminationSignal();
  Log(absl::StrCat(signal, " received, shutting down"));
  // Trainers report through the agent: they stop first, each after its
  // current step, and hand their ranks back (drained).
  (*daemon)->agent().Drain();
  const bool joined = runtime.StopAll(absl::Seconds(2));
  (*daemon)->Shutdown();
  if (!joined) {
    // A cancelled run has not returned yet; its job has moved on, and the
    // exit need not wait for it.
    Log("exiting with a cancelled run that has not returned yet");
    std::_Exit(0);
  }
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetDaemonUsage(
      "downpour-worker --coordinator=HOST:PORT [--listen=HOST:PORT] [--data_dir=DIR] [flags]");
  absl::ParseCommandLine(argc, argv);
  downpour::KeepTensorBuffersMapped();
  downpour::LimitMallocArenas();
  downpour::SkipMutexDeadlockDetection();
  return downpour::Main();
}
