// downpour-ps: one parameter shard. Registers with the coordinator, hosts the
// partitions the coordinator places on it for every running job
// (server/shard_runtime.h), and serves pushes and pulls. Flags are parsed
// here once into options.
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/platform/malloc_tuning.h"
#include "ps/parameter_store.h"
#include "rpc/daemon.h"
#include "rpc/node_flags.h"
#include "rpc/ps_service.h"
#include "server/shard_runtime.h"

namespace downpour {
namespace {

int Main() {
  BlockTerminationSignals();
  SetLogPrefix("downpour-ps");
  const NodeDaemon::Options options = NodeDaemonOptionsFromFlags(SHARD);
  MetricsRegistry metrics;
  ParameterStore store;
  ParameterServerService service(&store);
  ShardRuntime runtime(&store, &metrics);
  auto daemon =
      NodeDaemon::Start(options, {&service}, &metrics,
                        [&runtime](const std::vector<Task>& tasks) { runtime.OnTasks(tasks); });
  if (!daemon.ok()) return ExitWithError(daemon.status());
  Log(absl::StrCat("shard ", (*daemon)->self().id(), " ", (*daemon)->Describe()));

  const std::string signal = WaitForTerminationSignal();
  Log(absl::StrCat(signal, " received, shutting down"));
  (*daemon)->Shutdown();
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
