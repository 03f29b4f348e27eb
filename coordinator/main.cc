// downpour-coordinator: the control plane. Flags are parsed here once into
// options and passed down; see control/coordinator_state.h for the logic.
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/duration_flag.h"
#include "common/file.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/net_address.h"
#include "common/platform/mutex_tuning.h"
#include "common/process_metrics.h"
#include "common/status.h"
#include "control/coordinator_state.h"
#include "control/job_store.h"
#include "coordinator/coordinator_metrics.h"
#include "rpc/auth.h"
#include "rpc/coordinator_service.h"
#include "rpc/daemon.h"
#include "rpc/security.h"
#include "rpc/security_flags.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC address HOST:PORT (port 0 picks one)");
ABSL_FLAG(std::string, port_file, "", "File to write the bound HOST:PORT to once serving");
ABSL_FLAG(std::string, metrics_listen, "", "HTTP address for /metrics (empty: off)");
ABSL_FLAG(std::string, auth_config, "",
          "Who may call and as what (text-format downpour.AuthConfig, proto/auth.proto); "
          "needs TLS. Empty: every caller may do everything (allowed on loopback, or with "
          "--insecure)");
ABSL_FLAG(std::string, state_dir, "",
          "Directory of the durable job database and of each job's TensorBoard event files, "
          "DIR/tensorboard/JOB_ID/ (required)");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 500, "How often nodes heartbeat");
ABSL_FLAG(int64_t, node_timeout_ms, 5000, "A node silent this long is declared dead");
ABSL_FLAG(int64_t, recovery_grace_s, 600,
          "After a restart, known nodes get this long to heartbeat again before they are judged: "
          "an outage up to this long fails no job");
ABSL_FLAG(int64_t, handover_wait_s, 30,
          "A lost worker rank that no free worker takes over within this long goes to one of the "
          "job's workers, which trains it beside its own (SYNC), or has its data and steps dealt "
          "out to the job's live workers (ASYNC/SSP)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory of checkpoints, ROOT/JOB_ID/step-S/ (in a cluster, a filesystem every shard "
          "shares with the same flag); empty: jobs are not saved");
ABSL_FLAG(int64_t, checkpoint_timeout_s, 600,
          "A checkpoint not complete this long after it was taken is given up");
ABSL_FLAG(int32_t, job_retention_count, 1000,
          "Ended jobs beyond the newest this many leave the store (0: no limit)");
ABSL_FLAG(std::string, job_retention_age, "0",
          "Ended jobs that ended longer ago than this leave the store (e.g. 7d, 36h, 90s; "
          "0: no limit)");
ABSL_FLAG(std::string, dead_node_retention, "24h",
          "Nodes dead for longer than this (and named by no running job) leave the store "
          "(0: kept)");

namespace downpour {
namespace {

// Who may call (--auth_config) and how they connect (--tls_*): a
// coordinator other machines can reach serves TLS and authorizes every call
// unless --insecure; authorization needs TLS, since nodes prove who they are
// with certificates.
absl::StatusOr<std::unique_ptr<Authenticator>> LoadAuth(const std::string& listen,
                                                        const SecurityOptions& security) {
  RETURN_IF_ERROR(CheckListenSecurity(listen, security));
  const std::string path = absl::GetFlag(FLAGS_auth_config);
  if (path.empty()) {
    ASSIGN_OR_RETURN(const HostPort parsed, ParseHostPort(listen));
    if (!IsLoopbackHost(parsed.host) && !security.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to let anyone who reaches ", listen,
          " submit and stop jobs: give --auth_config (who may do what; scripts/make-certs.sh "
          "writes one), or --insecure to do it anyway"));
    }
    return std::make_unique<Authenticator>();
  }
  if (!security.tls.enabled()) {
    return absl::FailedPreconditionError(
        "--auth_config needs --tls_cert, --tls_key and --tls_ca: nodes prove who they are with "
        "client certificates");
  }
  return Authenticator::FromFile(path);
}

int Main() {
  BlockTerminationSignals();
  SetLogPrefix("downpour-coordinator");
  if (absl::GetFlag(FLAGS_state_dir).empty()) {
    return ExitWithError(absl::InvalidArgumentError("--state_dir is required"));
  }
  const SecurityOptions security = SecurityOptionsFromFlags();
  auto auth = LoadAuth(absl::GetFlag(FLAGS_listen), security);
  if (!auth.ok()) return ExitWithError(auth.status());
  auto credentials = MakeServerCredentials(security, ClientCertificates::kOptional);
  if (!credentials.ok()) return ExitWithError(credentials.status());
  if (absl::GetFlag(FLAGS_heartbeat_interval_ms) < 10 ||
      absl::GetFlag(FLAGS_node_timeout_ms) < absl::GetFlag(FLAGS_heartbeat_interval_ms)) {
    return ExitWithError(absl::InvalidArgumentError(
        "--heartbeat_interval_ms must be >= 10 and --node_timeout_ms >= the interval"));
  }
  const std::string checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  if (!checkpoint_root.empty()) {
    absl::Status made = MakeDirs(checkpoint_root);
    if (!made.ok()) return ExitWithError(Annotate(made, "--checkpoint_root"));
  }
  if (absl::GetFlag(FLAGS_recovery_grace_s) < 0) {
    return ExitWithError(absl::InvalidArgumentError("--recovery_grace_s must not be negative"));
  }
  if (absl::GetFlag(FLAGS_handover_wait_s) < 0) {
    return ExitWithError(absl::InvalidArgumentError("--handover_wait_s must not be negative"));
  }
  if (absl::GetFlag(FLAGS_checkpoint_timeout_s) < 1) {
    return ExitWithError(absl::InvalidArgumentError("--checkpoint_timeout_s must be >= 1"));
  }
  if (absl::GetFlag(FLAGS_job_retention_count) < 0) {
    return ExitWithError(
        absl::InvalidArgumentError("--job_retention_count must not be negative (0: no limit)"));
  }
  absl::StatusOr<absl::Duration> job_retention_age =
      ParseDurationFlag("job_retention_age", absl::GetFlag(FLAGS_job_retention_age));
  if (!job_retention_age.ok()) return ExitWithError(job_retention_age.status());
  absl::StatusOr<absl::Duration> dead_node_retention =
      ParseDurationFlag("dead_node_retention", absl::GetFlag(FLAGS_dead_node_retention));
  if (!dead_node_retention.ok()) return ExitWithError(dead_node_retention.status());
  auto store = control::OpenSqliteJobStore(absl::GetFlag(FLAGS_state_dir));
  if (!store.ok()) return ExitWithError(store.status());
  control::CoordinatorState::Options options;
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  options.node_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_node_timeout_ms));
  options.checkpoint_root = checkpoint_root;
  options.recovery_grace = absl::Seconds(absl::GetFlag(FLAGS_recovery_grace_s));
  options.checkpoint_timeout = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_timeout_s));
  options.handover_wait = absl::Seconds(absl::GetFlag(FLAGS_handover_wait_s));
  options.job_retention_count = absl::GetFlag(FLAGS_job_retention_count);
  options.job_retention_age = *job_retention_age;
  options.dead_node_retention = *dead_node_retention;
  options.tensorboard_dir = absl::StrCat(absl::GetFlag(FLAGS_state_dir), "/tensorboard");
  auto state = control::CoordinatorState::Create(options, std::move(store).value());
  if (!state.ok()) return ExitWithError(state.status());

  MetricsRegistry metrics;
  AddBuildInfo(&metrics, "downpour-coordinator");
  AddProcessMetrics(&metrics);
  CoordinatorMetrics coordinator_metrics(&metrics);
  auto metrics_serving = MetricsServing(absl::GetFlag(FLAGS_metrics_listen), security);
  if (!metrics_serving.ok()) return ExitWithError(metrics_serving.status());
  auto metrics_server = MetricsHttpServer::StartIfRequested(*metrics_serving, &metrics);
  if (!metrics_server.ok()) return ExitWithError(metrics_server.status());
  CoordinatorService service(state->get(), &metrics, auth->get());
  auto server = StartGrpcServer(absl::GetFlag(FLAGS_listen), {&service}, &metrics, 256 << 20,
                                *std::move(credentials));
  if (!server.ok()) return ExitWithError(server.status());
  absl::Status written = WritePortFile(absl::GetFlag(FLAGS_port_file), server->address);
  if (!written.ok()) return ExitWithError(written);
  Log(absl::StrCat(
      "serving on ", server->address,
      *metrics_server ? absl::StrCat(", metrics on ", (*metrics_server)->address(),
                                     (*metrics_server)->tls() ? " (HTTPS)" : "")
                      : "",
      security.tls.enabled() ? ", TLS" : ", plaintext",
      (*auth)->open() ? ", open to every caller" : ", callers authorized by --auth_config",
      ", state in ", absl::GetFlag(FLAGS_state_dir),
      checkpoint_root.empty() ? "" : absl::StrCat(", checkpoints in ", checkpoint_root)));

  absl::Notification stop;
  std::thread ticker([&] {
    while (!stop.WaitForNotificationWithTimeout(options.heartbeat_interval / 2)) {
      (*state)->Tick();
      // Local calls: they never fail.
      coordinator_metrics.Update((*state)->ListNodes().value(), (*state)->ListJobs().value(),
                                 absl::Now());
    }
  });
  const std::string signal = WaitForTerminationSignal();
  Log(absl::StrCat(signal, " received, shutting down"));
  stop.Notify();
  ticker.join();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetDaemonUsage("downpour-coordinator --state_dir=DIR [--listen=HOST:PORT] [flags]");
  absl::ParseCommandLine(argc, argv);
  downpour::SkipMutexDeadlockDetection();
  return downpour::Main();
}
