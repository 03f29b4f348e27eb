// downpour-ps: one parameter shard. Registers with the coordinator, hosts the
// partitions the coordinator places on it for every running job
// (server/shard_runtime.h), and serves pushes and pulls. On SIGTERM it drains:
// it keeps serving while the coordinator checkpoints its jobs and moves them
// to other shards, then exits. Flags are parsed here once into options.
#include <algorithm>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/platform/malloc_tuning.h"
#include "common/platform/mutex_tuning.h"
#include "common/process_metrics.h"
#include "common/status.h"
#include "common/work_pool.h"
#include "ps/checkpoint.h"
#include "ps/memory_budget.h"
#include "ps/parameter_store.h"
#include "rpc/daemon.h"
#include "rpc/node_flags.h"
#include "rpc/shard_service.h"
#include "server/shard_metrics.h"
#include "server/shard_runtime.h"

ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory checkpoints are written to and read from, ROOT/JOB_ID/step-S/ (in a cluster, "
          "a filesystem the coordinator and every shard share); empty: this shard writes none");
ABSL_FLAG(std::string, memory_limit, "auto",
          "Bytes the shard may hold for its jobs: auto (80% of what the process may use: its "
          "cgroup's limit, else the machine's memory), 0 (no limit) or a number: each job's "
          "partitions are reserved when it is hosted (a job that does not fit is refused), and "
          "sparse table rows as they are created (past it a table with max_rows evicts its rows; "
          "one without fails the job with ResourceExhausted). The coordinator places jobs only "
          "where they fit it");
ABSL_FLAG(int32_t, drain_timeout_s, 120,
          "On SIGTERM, how long the shard keeps serving while the coordinator checkpoints its "
          "jobs and moves them to other shards; it exits once they are moved or this passes");
ABSL_FLAG(int32_t, sparse_threads, -1,
          "Threads that apply a push's dense partitions, apply a push's sparse tables (an "
          "ASYNC/SSP push, or the push that completes a SYNC step), and look up a pull's rows, "
          "table by table (with the thread of the request); -1: a quarter of the cores this "
          "process may use (its CPU affinity and cgroup quota), 1 to 16; 0: the request's "
          "thread alone");
ABSL_FLAG(bool, shared_memory, true,
          "Workers on this host may exchange their tensor bytes through shared memory segments "
          "this shard maps; false: everything over gRPC");
ABSL_FLAG(bool, doorbell, true,
          "With --shared_memory: a worker's exchanges are signalled through its segment's "
          "doorbell and answered on a thread of the stream's; false: their headers go over gRPC");

namespace downpour {
namespace {

int Main() {
  BlockTerminationSignals();
  SetLogPrefix("downpour-ps");
  NodeDaemon::Options options = NodeDaemonOptionsFromFlags(SHARD);
  if (absl::GetFlag(FLAGS_drain_timeout_s) < 0) {
    return ExitWithError(absl::InvalidArgumentError("--drain_timeout_s must not be negative"));
  }
  int sparse_threads = absl::GetFlag(FLAGS_sparse_threads);
  if (sparse_threads < -1 || sparse_threads > 256) {
    return ExitWithError(absl::InvalidArgumentError(
        absl::StrCat("--sparse_threads must be -1 (a quarter of the cores), 0 or up to 256, got ",
                     sparse_threads)));
  }
  if (sparse_threads < 0) {
    sparse_threads = std::clamp(UsableCores() / 4, 1, 16);
  }
  absl::StatusOr<int64_t> memory_limit =
      ParseMemoryLimitFlag("memory_limit", absl::GetFlag(FLAGS_memory_limit), kAutoMemoryShare);
  if (!memory_limit.ok()) return ExitWithError(memory_limit.status());
  options.memory_limit_bytes = *memory_limit;
  const std::string checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  std::unique_ptr<CheckpointWriter> writer;
  if (!checkpoint_root.empty()) {
    absl::Status made = MakeDirs(checkpoint_root);
    if (!made.ok()) return ExitWithError(Annotate(made, "--checkpoint_root"));
    writer = std::make_unique<CheckpointWriter>(checkpoint_root);
  }
  MetricsRegistry metrics;
  AddBuildInfo(&metrics, "downpour-ps");
  AddProcessMetrics(&metrics);
  AddMemoryLimit(&metrics, "downpour_ps_memory_limit_bytes",
                 "Memory the shard may use: its cgroup's limit, else the machine's.");
  MemoryBudget budget(*memory_limit);
  AddMemoryBudgetMetrics(&budget, &metrics);
  WorkPool sparse_pool(sparse_threads, "shard-sparse");
  ParameterStore store(&budget, &sparse_pool);
  if (writer != nullptr) {
    store.SetCheckpointSink([w = writer.get()](ShardCapture c) { w->Write(std::move(c)); });
  }
  ShardRuntime runtime(&store, writer.get(), &metrics, ReleaseMemoryFreedBy);
  ParameterServerService::Options service_options;
  service_options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  service_options.doorbell = absl::GetFlag(FLAGS_doorbell);
  service_options.signalled_seconds = metrics.GetHistogram(
      "downpour_rpc_server_signalled_handling_seconds",
      "Time the shard took to answer an exchange a worker on this host signalled through its "
      "shared memory segment's doorbell, from the shard's thread taking the signal to the answer "
      "(these pass through no gRPC handler: downpour_rpc_server_handling_seconds does not see "
      "them).");
  if (options.security.tls.enabled()) {
    service_options.authorize = [&runtime](const std::string& peer, const std::string& job_id,
                                           int rank) {
      return runtime.AuthorizeWorker(peer, job_id, rank);
    };
  }
  ParameterServerService service(runtime.serving(), service_options);
  options.checkpoints = writer != nullptr;
  options.add_to_heartbeat = [&runtime](HeartbeatRequest* r) { runtime.AddToHeartbeat(r); };
  auto daemon =
      NodeDaemon::Start(options, {&service}, &metrics,
                        [&runtime](const std::vector<Task>& tasks) { runtime.OnTasks(tasks); });
  if (!daemon.ok()) return ExitWithError(daemon.status());
  Log(absl::StrCat(
      "shard ", (*daemon)->self().id(), " ", (*daemon)->Describe(),
      writer ? absl::StrCat(", checkpoints in ", checkpoint_root) : "",
      budget.limit() > 0 ? absl::StrCat(", memory limit ", budget.limit(), " bytes") : ""));

  const std::string signal = WaitForTerminationSignal();
  if (!runtime.HostedJobs().empty()) {
    const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
    Log(absl::StrCat(signal, " received, draining: the jobs here move to other shards (at most ",
                     absl::FormatDuration(timeout), ")"));
    (*daemon)->agent().Drain();
    if ((*daemon)->agent().WaitReleased(timeout)) {
      Log("drained: no job needs this shard any more");
    } else {
      Log(absl::StrCat("drain not finished after ", absl::FormatDuration(timeout),
                       "; jobs still here recover from their checkpoints"));
    }
  }
  Log(absl::StrCat(signal, " received, shutting down"));
  (*daemon)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetDaemonUsage("downpour-ps --coordinator=HOST:PORT [--listen=HOST:PORT] [flags]");
  absl::ParseCommandLine(argc, argv);
  downpour::KeepTensorBuffersMapped();
  downpour::LimitMallocArenas();
  downpour::SkipMutexDeadlockDetection();
  return downpour::Main();
}
