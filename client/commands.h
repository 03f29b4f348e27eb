// downpourctl's commands. main (client/downpourctl.cc) parses the flags once
// into CtlOptions and calls one Run* function, whose return value is the
// exit status:
//   0 ok; 1 a command failed (the job failed or was stopped, the coordinator
//   answered with an error or could not be reached); 2 a usage error or
//   input rejected (bad flag, bad job spec, duplicate job id); 3 `wait` ran
//   out of --timeout.
// Every failure ends in one sentence on stderr.
#ifndef DOWNPOUR_CLIENT_COMMANDS_H_
#define DOWNPOUR_CLIENT_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/output.h"
#include "proto/job.pb.h"
#include "rpc/remote_coordinator.h"

namespace downpour {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimedOut = 3;

// Every flag's value, parsed.
struct CtlOptions {
  std::string coordinator;
  // TLS and the bearer token (--tls_ca, --tls_cert, --tls_key, --token_file,
  // DOWNPOUR_TOKEN, or the context's).
  ClientCredentials credentials;
  OutputFormat output = OutputFormat::kTable;
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration wait_timeout = absl::ZeroDuration();  // Zero: no limit.
  absl::Duration reconnect_timeout = absl::Seconds(30);
  // submit, resume, checkpoint.
  std::string job_id;
  bool wait = false;
  std::string init_from;
  std::string model;  // submit --model=MODEL.onnx.
  // export.
  std::string out;
  int64_t checkpoint = 0;
  std::string layout = "pytorch";
  std::string export_format = "safetensors";  // --format: safetensors or onnx.
  // delete.
  bool with_checkpoints = false;
  // logs.
  bool follow = false;
  int64_t tail = 0;
  // dataset import.
  std::string format = "idx";
  std::string images;
  std::string labels;
  std::string out_dir;
  std::string name;
  std::string fashion_mnist;
  int32_t shards = 1;
  int64_t limit = 0;
  // dataset generate (also out_dir, name, shards); the generator's own
  // checks (data/ctr_generator.h) judge the values.
  std::string kind;
  int64_t examples = 1000000;
  int64_t test_examples = 100000;
  uint64_t seed = 1;
  double zipf = 1.05;
  std::string vocabulary = "1000:10000000";
  int32_t sparse_features = 26;
  int32_t dense_features = 13;
  int32_t max_ids = 3;
  double click_rate = 0.1;
};

// Prints one sentence to stderr and returns `code`.
int Fail(int code, absl::string_view message);
// A coordinator's error: 2 when it rejected the input (InvalidArgument,
// AlreadyExists), else 1.
int FailStatus(const absl::Status& status);
int UsageError(absl::string_view message);

int64_t NowMs();

absl::StatusOr<std::unique_ptr<RemoteCoordinator>> ConnectTo(const CtlOptions& options);

// "3/300", "-" for a pending job's loss, "-" for an accuracy not measured.
std::string StepsText(const JobStatus& job);
std::string LossText(const JobStatus& job);
std::string TestAccuracyText(const JobStatus& job);
// The final evaluation's AUC (JobSpec.metrics), as TestAccuracyText; "-"
// where the job has none.
std::string TestAucText(const JobStatus& job);
// The human-readable view of `job` (get, describe).
void PrintJobSummary(const JobStatus& job);

// Jobs (client/job_commands.cc).
int RunSubmit(const CtlOptions& options, const std::vector<std::string>& args);
int RunList(const CtlOptions& options, const std::vector<std::string>& args);
int RunGet(const CtlOptions& options, const std::vector<std::string>& args);
int RunWait(const CtlOptions& options, const std::vector<std::string>& args);
int RunStop(const CtlOptions& options, const std::vector<std::string>& args);
// Follows the job until it ends; the final line on stdout.
int WaitForJob(RemoteCoordinator& client, const std::string& job_id, const CtlOptions& options);

// describe, delete, logs (client/operator_commands.cc).
int RunDescribe(const CtlOptions& options, const std::vector<std::string>& args);
int RunDelete(const CtlOptions& options, const std::vector<std::string>& args);
int RunLogs(const CtlOptions& options, const std::vector<std::string>& args);

// Nodes: list, drain, uncordon (client/node_commands.cc).
int RunNodes(const CtlOptions& options, const std::vector<std::string>& args);

// checkpoint, resume, export (client/checkpoint_commands.cc).
int RunCheckpoint(const CtlOptions& options, const std::vector<std::string>& args);
int RunResume(const CtlOptions& options, const std::vector<std::string>& args);
int RunExport(const CtlOptions& options, const std::vector<std::string>& args);

// dataset import and dataset generate (client/dataset_command.cc).
int RunDataset(const CtlOptions& options, const std::vector<std::string>& args);
// model import MODEL.onnx [--out=SPEC.pbtxt].
int RunModel(const CtlOptions& options, const std::vector<std::string>& args);
// An ONNX file's bytes (submit --model, model import); NotFound or
// InvalidArgument naming it.
absl::StatusOr<std::string> ReadModelFile(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_COMMANDS_H_
