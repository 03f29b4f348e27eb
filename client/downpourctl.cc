// downpourctl: the operator's command line over the Coordinator service, and
// the offline dataset importer. See kUsage for the commands.
//
// Exit status: 0 ok; 1 a command failed (the job failed or was stopped, the
// coordinator answered with an error or could not be reached); 2 a usage error
// or input rejected (bad flag, bad job spec); 3 `wait` ran out of --timeout.
// Every failure ends in one sentence on stderr.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_spec_file.h"
#include "common/file.h"
#include "common/net_address.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "control/coordinator.h"
#include "data/idx.h"
#include "google/protobuf/util/json_util.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"
#include "rpc/remote_coordinator.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "HOST:PORT of the coordinator");
ABSL_FLAG(std::string, output, "table", "output format: table or json (-o for short)");
ABSL_FLAG(std::string, job_id, "", "submit: the new job's id (empty: the coordinator picks one)");
ABSL_FLAG(bool, wait, false,
          "submit, resume: wait for the job to end, like `wait`; checkpoint: wait until it is "
          "written");
ABSL_FLAG(std::string, init_from, "",
          "submit: start from saved weights: JOB or JOB@STEP (a checkpoint of a job this "
          "coordinator knows) or FILE.safetensors (an export, in either layout)");
ABSL_FLAG(std::string, out, "", "export: the safetensors file to write (the spec goes beside it)");
ABSL_FLAG(int64_t, checkpoint, 0, "export: the checkpoint's step (0: the newest)");
ABSL_FLAG(std::string, layout, "pytorch",
          "export: pytorch (PyTorch's names and layouts) or native (ours)");
ABSL_FLAG(std::string, timeout, "0",
          "wait: give up after this long (e.g. 90s, 10m; a bare number is "
          "seconds; 0 = no limit)");
ABSL_FLAG(std::string, connect_timeout, "5s",
          "how long to wait for the coordinator to accept the connection");
ABSL_FLAG(std::string, reconnect_timeout, "30s",
          "wait: how long to keep trying to reach a coordinator that went "
          "away before giving up");
ABSL_FLAG(std::string, format, "idx", "dataset import: input format (idx)");
ABSL_FLAG(std::string, images, "", "dataset import: IDX images file");
ABSL_FLAG(std::string, labels, "", "dataset import: IDX labels file");
ABSL_FLAG(std::string, out_dir, "", "dataset import: directory the record shards are written to");
ABSL_FLAG(std::string, name, "", "dataset import: name of the data set (shard file prefix)");
ABSL_FLAG(std::string, fashion_mnist, "",
          "dataset import: directory holding Fashion-MNIST's IDX files "
          "(default /usr/share/datasets/fashion-mnist); imports train and "
          "test");
ABSL_FLAG(int32_t, shards, 1, "dataset import: number of record files");
ABSL_FLAG(int64_t, limit, 0, "dataset import: import at most this many examples (0 = all)");

namespace downpour {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimedOut = 3;

constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
// Server-side timeout of each WatchJob long poll.
constexpr absl::Duration kWatchPoll = absl::Seconds(10);

constexpr char kUsage[] =
    R"(usage: downpourctl [--coordinator=HOST:PORT] [-o table|json] COMMAND [ARGS]

commands:
  nodes                 list shards and workers known to the coordinator
  submit FILE [--job_id=ID] [--wait] [--timeout=DURATION]
         [--init_from=JOB|JOB@STEP|WEIGHTS.safetensors]
                        submit the job spec in FILE (protobuf text format);
                        prints the job id; --init_from starts it from saved
                        weights (fine-tuning; optimizer state starts fresh)
  list                  list jobs
  get JOB               show one job
  wait JOB [--timeout=DURATION]
                        follow JOB until it ends (progress on stderr, final
                        line on stdout); exit 0 only if it succeeded
  stop JOB              stop JOB
  checkpoint JOB [--wait]
                        checkpoint JOB now (at its next step); --wait until
                        the checkpoint is written
  resume JOB [--wait]   continue a FAILED or STOPPED JOB from its newest
                        complete checkpoint
  export JOB --out=FILE [--checkpoint=STEP] [--layout=pytorch|native]
                        write the model of JOB's newest (or STEP's)
                        checkpoint as one safetensors file that PyTorch's
                        load_state_dict takes, and its spec beside it
  dataset import --format=idx --images=PATH --labels=PATH --out_dir=DIR
                 --name=NAME [--shards=N] [--limit=N]
                        convert an IDX image/label pair into record shards
  dataset import [--fashion_mnist=DIR] --out_dir=DIR [--shards=N] [--limit=N]
                        import Fashion-MNIST's train and test sets from DIR
                        (default /usr/share/datasets/fashion-mnist)

flags: --coordinator (default 127.0.0.1:7070), -o/--output table|json,
       --connect_timeout (default 5s), --reconnect_timeout (wait; default
       30s); see --help for all.
exit status: 0 ok, 1 failed (job failed or stopped, coordinator error),
             2 usage error or rejected input, 3 wait timed out.)";

enum class OutputFormat { kTable, kJson };

struct Options {
  std::string coordinator;
  OutputFormat output = OutputFormat::kTable;
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration wait_timeout = absl::ZeroDuration();  // Zero: no limit.
  absl::Duration reconnect_timeout = absl::Seconds(30);
};

// Prints one sentence to stderr and returns `code`.
int Fail(int code, absl::string_view message) {
  std::cerr << "downpourctl: " << message << std::endl;
  return code;
}

int FailStatus(const absl::Status& status) { return Fail(kExitFailed, status.message()); }

int UsageError(absl::string_view message) { return Fail(kExitUsage, message); }

// A bare number is seconds; otherwise absl's duration syntax ("90s", "10m").
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& name, const std::string& text) {
  double seconds;
  if (absl::SimpleAtod(text, &seconds) && seconds >= 0) {
    return absl::Seconds(seconds);
  }
  absl::Duration d;
  if (absl::ParseDuration(text, &d) && d >= absl::ZeroDuration()) return d;
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, "=", text, " is not a duration (e.g. 90s, 10m, or 0)"));
}

// "45s", "1m05s", "2h03m", "3d04h".
std::string FormatShortDuration(absl::Duration d) {
  int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Only fails for Any or other well-known types, which jobs do not hold.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

template <typename Message>
void PrintJsonArray(const std::vector<Message>& messages) {
  std::vector<std::string> items;
  items.reserve(messages.size());
  for (const Message& m : messages) items.push_back(ToJson(m));
  std::cout << "[" << (items.empty() ? "" : "\n") << absl::StrJoin(items, ",\n") << "]"
            << std::endl;
}

// Left-aligned columns, two spaces apart.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
  std::cout.flush();
}

std::string StepsText(const JobStatus& job) {
  return absl::StrCat(job.step(), "/", job.spec().steps());
}

std::string LossText(const JobStatus& job) {
  if (job.step() == 0 && job.state() == PENDING) return "-";
  return absl::StrFormat("%.4f", job.loss());
}

std::string TestAccuracyText(const JobStatus& job) {
  if (!control::IsTerminal(job.state()) || job.test_accuracy() < 0) return "-";
  return absl::StrFormat("%.4f", job.test_accuracy());
}

// Seconds the job ran: start to end, or since submission if it never started;
// a job still running counts up to now.
double WallSeconds(const JobStatus& job) {
  const int64_t start = job.start_time_ms() > 0 ? job.start_time_ms() : job.submit_time_ms();
  const int64_t end = job.end_time_ms() > 0 ? job.end_time_ms() : NowMs();
  if (start <= 0 || end < start) return 0;
  return (end - start) / 1000.0;
}

absl::StatusOr<std::unique_ptr<RemoteCoordinator>> ConnectTo(const Options& options) {
  return RemoteCoordinator::Connect(options.coordinator, options.connect_timeout);
}

// ------------------------------------------------------------------ nodes

int RunNodes(const Options& options) {
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<std::vector<NodeInfo>> nodes = (*client)->ListNodes();
  if (!nodes.ok()) return FailStatus(nodes.status());
  if (options.output == OutputFormat::kJson) {
    PrintJsonArray(*nodes);
    return kExitOk;
  }
  const int64_t now = NowMs();
  std::vector<std::vector<std::string>> rows;
  for (const NodeInfo& node : *nodes) {
    std::string heartbeat = "-";
    if (node.last_heartbeat_ms() > 0) {
      heartbeat = absl::StrCat(
          FormatShortDuration(absl::Milliseconds(now - node.last_heartbeat_ms())), " ago");
    }
    std::string devices = absl::StrJoin(node.devices(), ",");
    rows.push_back({node.id(), NodeRole_Name(node.role()), node.address(),
                    node.alive() ? "yes" : "no", heartbeat, devices.empty() ? "-" : devices});
  }
  PrintTable({"ID", "ROLE", "ADDRESS", "ALIVE", "LAST_HEARTBEAT", "DEVICES"}, rows);
  return kExitOk;
}

// ------------------------------------------------------------------- wait

// Estimates time to completion from the step rate this client has observed.
class EtaEstimator {
 public:
  void Observe(int64_t step) {
    const absl::Time now = absl::Now();
    if (!started_) {
      started_ = true;
      first_time_ = now;
      first_step_ = step;
    }
    last_time_ = now;
    last_step_ = step;
  }

  std::string Eta(int64_t total_steps) const {
    if (!started_ || last_step_ <= first_step_) return "?";
    const double seconds = absl::ToDoubleSeconds(last_time_ - first_time_);
    if (seconds <= 0) return "?";
    const double rate = (last_step_ - first_step_) / seconds;
    const int64_t left = std::max<int64_t>(0, total_steps - last_step_);
    return FormatShortDuration(absl::Seconds(left / rate));
  }

 private:
  bool started_ = false;
  absl::Time first_time_;
  int64_t first_step_ = 0;
  absl::Time last_time_;
  int64_t last_step_ = 0;
};

void PrintProgress(const JobStatus& job, const EtaEstimator& eta) {
  std::string line = absl::StrCat("job ", job.id(), " ", JobState_Name(job.state()));
  if (job.state() == RUNNING) {
    absl::StrAppendFormat(&line, " step %d/%d loss %.3f %.0f ex/s ETA %s", job.step(),
                          job.spec().steps(), job.loss(), job.examples_per_sec(),
                          eta.Eta(job.spec().steps()));
  } else if (!job.message().empty()) {
    absl::StrAppend(&line, ": ", job.message());
  }
  std::cerr << line << std::endl;
}

int PrintFinal(const JobStatus& job, const Options& options) {
  if (options.output == OutputFormat::kJson) {
    std::cout << ToJson(job) << std::endl;
  } else {
    std::cout << absl::StrFormat("job %s %s steps=%d test_accuracy=%.4f wall_s=%.1f", job.id(),
                                 JobState_Name(job.state()), job.step(), job.test_accuracy(),
                                 WallSeconds(job))
              << std::endl;
  }
  if (job.state() == SUCCEEDED) return kExitOk;
  return Fail(kExitFailed, absl::StrCat("job ", job.id(), " ", JobState_Name(job.state()),
                                        job.message().empty() ? "" : ": ", job.message()));
}

bool IsTransient(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

int WaitForJob(RemoteCoordinator& client, const std::string& job_id, const Options& options) {
  const absl::Time give_up = options.wait_timeout > absl::ZeroDuration()
                                 ? absl::Now() + options.wait_timeout
                                 : absl::InfiniteFuture();
  EtaEstimator eta;
  int64_t known_version = 0;
  int64_t printed_step = -1;
  JobState printed_state = JOB_STATE_UNSPECIFIED;
  absl::Time lost_since = absl::InfiniteFuture();
  while (true) {
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return Fail(kExitTimedOut, absl::StrCat("job ", job_id, " did not end within --timeout=",
                                              absl::FormatDuration(options.wait_timeout)));
    }
    const absl::Duration poll = std::max(absl::Milliseconds(1), std::min(kWatchPoll, left));
    absl::StatusOr<JobStatus> job = client.WatchJob(job_id, known_version, poll);
    if (!job.ok()) {
      if (!IsTransient(job.status())) return FailStatus(job.status());
      const absl::Time now = absl::Now();
      if (lost_since == absl::InfiniteFuture()) {
        lost_since = now;
        std::cerr << "downpourctl: lost the coordinator at " << client.address() << " ("
                  << job.status().message() << "); reconnecting for up to "
                  << absl::FormatDuration(options.reconnect_timeout) << std::endl;
      }
      const absl::Duration reconnect_left = lost_since + options.reconnect_timeout - now;
      if (reconnect_left <= absl::ZeroDuration()) {
        return Fail(kExitFailed, absl::StrCat("lost the coordinator at ", client.address(),
                                              " while waiting for job ", job_id,
                                              " and could not reconnect within ",
                                              absl::FormatDuration(options.reconnect_timeout)));
      }
      if (client.WaitUntilConnected(reconnect_left).ok()) {
        // Connected but the call still failed (e.g. the server is shutting
        // down): pause briefly rather than spin.
        absl::SleepFor(absl::Milliseconds(200));
      }
      // A restarted coordinator may count versions afresh.
      known_version = 0;
      continue;
    }
    if (lost_since != absl::InfiniteFuture()) {
      lost_since = absl::InfiniteFuture();
      std::cerr << "downpourctl: reconnected to the coordinator at " << client.address()
                << std::endl;
    }
    known_version = job->version();
    if (job->state() == RUNNING) eta.Observe(job->step());
    if (control::IsTerminal(job->state())) return PrintFinal(*job, options);
    // One line per step reached (every worker's report bumps the version).
    if (job->step() != printed_step || job->state() != printed_state) {
      PrintProgress(*job, eta);
      printed_step = job->step();
      printed_state = job->state();
    }
  }
}

int RunWait(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("wait needs exactly one job id: downpourctl wait JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  return WaitForJob(**client, args[0], options);
}

// ----------------------------------------------------------------- submit

int RunSubmit(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("submit needs exactly one job spec file: downpourctl submit FILE");
  }
  const std::string& path = args[0];
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  if (!spec.ok()) return Fail(kExitUsage, spec.status().message());
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  SubmitJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.set_job_id(absl::GetFlag(FLAGS_job_id));
  const std::string init_from = absl::GetFlag(FLAGS_init_from);
  if (absl::EndsWith(init_from, ".safetensors")) {
    absl::StatusOr<std::string> weights = ReadFileToString(init_from);
    if (!weights.ok())
      return Fail(kExitUsage, absl::StrCat("--init_from: ", weights.status().message()));
    request.mutable_init_from()->set_weights(*std::move(weights));
    request.mutable_init_from()->set_weights_name(init_from);
  } else if (!init_from.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(init_from, absl::MaxSplits('@', 1));
    int64_t step = 0;
    if (parts[0].empty() ||
        (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &step) || step < 0))) {
      return UsageError(absl::StrCat("--init_from=", init_from,
                                     " is neither JOB, JOB@STEP nor a .safetensors file"));
    }
    request.mutable_init_from()->set_job_id(parts[0]);
    request.mutable_init_from()->set_step(step);
  }
  absl::StatusOr<JobStatus> job = (*client)->SubmitJob(request);
  if (!job.ok()) {
    if (job.status().code() == absl::StatusCode::kInvalidArgument) {
      return Fail(kExitUsage, absl::StrCat("the coordinator rejected job spec ", path, ": ",
                                           job.status().message()));
    }
    return FailStatus(job.status());
  }
  if (absl::GetFlag(FLAGS_wait)) {
    std::cerr << "submitted job " << job->id() << std::endl;
    return WaitForJob(**client, job->id(), options);
  }
  if (options.output == OutputFormat::kJson) {
    std::cout << ToJson(*job) << std::endl;
  } else {
    std::cout << job->id() << std::endl;
  }
  return kExitOk;
}

// ------------------------------------------------------------------- list

int RunList(const Options& options) {
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<std::vector<JobStatus>> jobs = (*client)->ListJobs();
  if (!jobs.ok()) return FailStatus(jobs.status());
  if (options.output == OutputFormat::kJson) {
    PrintJsonArray(*jobs);
    return kExitOk;
  }
  const int64_t now = NowMs();
  std::vector<std::vector<std::string>> rows;
  for (const JobStatus& job : *jobs) {
    std::string age = "-";
    if (job.submit_time_ms() > 0) {
      age = FormatShortDuration(absl::Milliseconds(now - job.submit_time_ms()));
    }
    rows.push_back({job.id(), job.spec().name().empty() ? "-" : job.spec().name(),
                    JobState_Name(job.state()), StepsText(job), LossText(job),
                    TestAccuracyText(job), age});
  }
  PrintTable({"ID", "NAME", "STATE", "STEP/STEPS", "LOSS", "TEST_ACC", "AGE"}, rows);
  return kExitOk;
}

// -------------------------------------------------------------------- get

void PrintJobSummary(const JobStatus& job) {
  const int64_t now = NowMs();
  auto line = [](absl::string_view key, absl::string_view value) {
    std::cout << absl::StrFormat("%-15s %s\n", absl::StrCat(key, ":"), value);
  };
  line("id", job.id());
  line("name", job.spec().name().empty() ? "-" : job.spec().name());
  line("state", JobState_Name(job.state()));
  line("step", StepsText(job));
  line("loss", LossText(job));
  line("examples/s", absl::StrFormat("%.0f", job.examples_per_sec()));
  line("test accuracy", TestAccuracyText(job));
  line("message", job.message().empty() ? "-" : job.message());
  if (job.submit_time_ms() > 0) {
    line("submitted",
         absl::StrCat(FormatShortDuration(absl::Milliseconds(now - job.submit_time_ms())), " ago"));
  }
  if (job.start_time_ms() > 0) {
    line("wall time", absl::StrFormat("%.1fs", WallSeconds(job)));
  }
  const Placement& placement = job.placement();
  if (placement.shard_nodes_size() == 0 && placement.worker_nodes_size() == 0) {
    line("placement", "-");
  } else {
    line("shards", absl::StrCat(placement.shard_nodes_size(), " [",
                                absl::StrJoin(placement.shard_nodes(), ", "), "], ",
                                placement.partitions_size(), " partitions"));
    line("workers", absl::StrCat(placement.worker_nodes_size(), " [",
                                 absl::StrJoin(placement.worker_nodes(), ", "), "]"));
  }
  for (const WorkerProgress& w : job.workers()) {
    // Which record files the rank reads (the coordinator's share).
    std::string data;
    if (w.data_size() > 0) {
      data = absl::StrCat("  ", w.data_size(), " file", w.data_size() == 1 ? "" : "s");
      if (w.data(0).stride() > 1)
        absl::StrAppend(&data, " (1 in ", w.data(0).stride(), " records)");
    }
    const char* state = w.absorbed()   ? "  absorbed"
                        : w.lost()     ? "  lost"
                        : w.finished() ? "  finished"
                                       : "";
    std::cout << absl::StrFormat("  rank %d  %s  step %d%s  loss %.4f  %.0f ex/s%s%s\n", w.rank(),
                                 w.node_id().empty() ? "-" : w.node_id(), w.step(),
                                 w.steps() > 0 ? absl::StrCat("/", w.steps()) : "", w.loss(),
                                 w.examples_per_sec(), data, state);
  }
  if (job.resumed_from_step() > 0) {
    line("resumed from", absl::StrCat("step ", job.resumed_from_step()));
  }
  line("checkpoints", job.checkpoints().empty() ? "-" : absl::StrCat(job.checkpoints_size()));
  for (const CheckpointInfo& c : job.checkpoints()) {
    std::cout << absl::StrFormat("  step %d  %s  %.1f MiB  %s ago\n", c.step(), c.dir(),
                                 c.bytes() / 1048576.0,
                                 FormatShortDuration(absl::Milliseconds(now - c.time_ms())));
  }
  // The test-accuracy curve: time since submission, as a user waits for it.
  if (!job.evaluations().empty()) line("evaluations", absl::StrCat(job.evaluations_size()));
  for (const Evaluation& e : job.evaluations()) {
    std::cout << absl::StrFormat(
        "  step %d  accuracy %.4f  at %s\n", e.step(), e.accuracy(),
        FormatShortDuration(absl::Milliseconds(e.time_ms() - job.submit_time_ms())));
  }
  line("events", job.events().empty() ? "-" : absl::StrCat(job.events_size()));
  for (const JobEvent& e : job.events()) {
    std::cout << absl::StrFormat(
        "  %s  %s\n",
        absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(e.time_ms()),
                         absl::LocalTimeZone()),
        e.message());
  }
  std::cout.flush();
}

int RunGet(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("get needs exactly one job id: downpourctl get JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->GetJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  if (options.output == OutputFormat::kJson) {
    std::cout << ToJson(*job) << std::endl;
  } else {
    PrintJobSummary(*job);
  }
  return kExitOk;
}

// ------------------------------------------------------------------- stop

int RunStop(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("stop needs exactly one job id: downpourctl stop JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->StopJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  if (options.output == OutputFormat::kJson) {
    std::cout << ToJson(*job) << std::endl;
  } else {
    std::cout << "job " << job->id() << " " << JobState_Name(job->state()) << std::endl;
  }
  return kExitOk;
}

// ------------------------------------------------- checkpoint, resume, export

// Waits until the checkpoint asked for at `requested_ms` is written (0) or
// given up (1, with the job's last event).
int WaitForCheckpoint(RemoteCoordinator& client, const std::string& job_id, int64_t requested_ms,
                      const Options& options) {
  const absl::Time give_up = options.wait_timeout > absl::ZeroDuration()
                                 ? absl::Now() + options.wait_timeout
                                 : absl::InfiniteFuture();
  int64_t known_version = 0;
  while (true) {
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return Fail(kExitTimedOut, absl::StrCat("job ", job_id, ": no checkpoint within --timeout=",
                                              absl::FormatDuration(options.wait_timeout)));
    }
    absl::StatusOr<JobStatus> job =
        client.WatchJob(job_id, known_version, std::min(kWatchPoll, left));
    if (!job.ok()) return FailStatus(job.status());
    known_version = job->version();
    for (const CheckpointInfo& c : job->checkpoints()) {
      if (c.time_ms() < requested_ms) continue;
      std::cout << absl::StrFormat("job %s checkpoint at step %d written: %s (%.1f MiB)", job_id,
                                   c.step(), c.dir(), c.bytes() / 1048576.0)
                << std::endl;
      return kExitOk;
    }
    if (job->checkpoint_requested_ms() != requested_ms || control::IsTerminal(job->state())) {
      return Fail(kExitFailed,
                  absl::StrCat("job ", job_id, ": the checkpoint was not written",
                               job->events().empty()
                                   ? ""
                                   : absl::StrCat(" (", job->events().rbegin()->message(), ")")));
    }
  }
}

int RunCheckpoint(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("checkpoint needs exactly one job id: downpourctl checkpoint JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->CheckpointJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  if (absl::GetFlag(FLAGS_wait)) {
    return WaitForCheckpoint(**client, job->id(), job->checkpoint_requested_ms(), options);
  }
  std::cout << "job " << job->id() << ": checkpoint asked for (taken at its next step)"
            << std::endl;
  return kExitOk;
}

int RunResume(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("resume needs exactly one job id: downpourctl resume JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->ResumeJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  std::cerr << "job " << job->id() << " resumes from its checkpoint at step "
            << job->resumed_from_step() << std::endl;
  if (absl::GetFlag(FLAGS_wait)) return WaitForJob(**client, job->id(), options);
  if (options.output == OutputFormat::kJson) std::cout << ToJson(*job) << std::endl;
  return kExitOk;
}

// "model.safetensors" -> "model.spec.pbtxt".
std::string SpecPathBeside(const std::string& out) {
  std::string base = out;
  if (absl::EndsWith(base, ".safetensors")) base.resize(base.size() - strlen(".safetensors"));
  return base + ".spec.pbtxt";
}

int RunExport(const Options& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("export needs exactly one job id: downpourctl export JOB --out=FILE");
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("export needs --out=FILE (a .safetensors file to write)");
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout != "pytorch" && layout != "native") {
    return UsageError(absl::StrCat("--layout=", layout, " is unknown; use pytorch or native"));
  }
  if (absl::GetFlag(FLAGS_checkpoint) < 0) {
    return UsageError("--checkpoint=STEP must not be negative");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<std::string> bytes =
      (*client)->ExportJob(args[0], absl::GetFlag(FLAGS_checkpoint), layout == "native");
  if (!bytes.ok()) return FailStatus(bytes.status());
  // What arrived is checked like any checkpoint file before it is written.
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(*bytes, "the exported model");
  if (!file.ok()) return FailStatus(file.status());
  const auto& meta = file->metadata();
  const std::string spec_path = SpecPathBeside(out);
  for (const auto& [path, contents] :
       {std::pair<std::string, std::string>{out, *bytes},
        {spec_path, meta.count("downpour.spec") ? meta.at("downpour.spec") : ""}}) {
    absl::StatusOr<std::unique_ptr<AtomicFile>> f = AtomicFile::Create(path, "export file");
    absl::Status written = f.ok() ? (*f)->Append(contents) : f.status();
    if (written.ok()) written = (*f)->Commit();
    if (!written.ok()) return FailStatus(written);
  }
  std::cout << absl::StrFormat(
                   "wrote %s (%d tensors, %.1f MiB, %s layout) from job %s step %s; "
                   "spec in %s",
                   out, file->tensors().size(), bytes->size() / 1048576.0, layout, args[0],
                   meta.count("downpour.step") ? meta.at("downpour.step") : "?", spec_path)
            << std::endl;
  return kExitOk;
}

// ---------------------------------------------------------------- dataset

// Imports one image/label pair; prints what was written.
int ImportOne(const data::IdxImportOptions& import) {
  absl::StatusOr<int64_t> written = data::ImportIdx(import);
  if (!written.ok()) return FailStatus(written.status());
  const std::string first = data::ShardFileName(import.name, 0, import.num_shards);
  const std::string last =
      data::ShardFileName(import.name, import.num_shards - 1, import.num_shards);
  std::cout << absl::StrFormat("%s: wrote %d examples to %s/%s%s", import.name, *written,
                               import.out_dir, first,
                               import.num_shards > 1 ? absl::StrCat(" .. ", last) : "")
            << std::endl;
  return kExitOk;
}

int RunDataset(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0] != "import") {
    return UsageError(
        "dataset takes one subcommand, import: downpourctl dataset import "
        "--out_dir=DIR ...");
  }
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  const int shards = absl::GetFlag(FLAGS_shards);
  const int64_t limit = absl::GetFlag(FLAGS_limit);
  if (out_dir.empty()) {
    return UsageError("dataset import needs --out_dir=DIR");
  }
  if (shards < 1) {
    return UsageError(absl::StrCat("--shards=", shards, " must be at least 1"));
  }
  if (limit < 0) {
    return UsageError(absl::StrCat("--limit=", limit, " must not be negative"));
  }
  data::IdxImportOptions import;
  import.out_dir = out_dir;
  import.num_shards = shards;
  import.limit = limit;

  const std::string images = absl::GetFlag(FLAGS_images);
  const std::string labels = absl::GetFlag(FLAGS_labels);
  std::string fashion_dir = absl::GetFlag(FLAGS_fashion_mnist);
  if (!fashion_dir.empty() || (images.empty() && labels.empty())) {
    if (!images.empty() || !labels.empty()) {
      return UsageError("--fashion_mnist imports its own files; drop --images and --labels");
    }
    if (fashion_dir.empty()) fashion_dir = kDefaultFashionMnistDir;
    struct Part {
      const char* name;
      const char* prefix;
    };
    for (const Part& part : {Part{"train", "train"}, Part{"test", "t10k"}}) {
      import.name = part.name;
      import.images_path = absl::StrCat(fashion_dir, "/", part.prefix, "-images-idx3-ubyte.gz");
      import.labels_path = absl::StrCat(fashion_dir, "/", part.prefix, "-labels-idx1-ubyte.gz");
      const int code = ImportOne(import);
      if (code != kExitOk) return code;
    }
    return kExitOk;
  }

  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "idx") {
    return UsageError(
        absl::StrCat("--format=", format, " is not supported; the only format is idx"));
  }
  if (images.empty() || labels.empty()) {
    return UsageError("dataset import needs both --images=PATH and --labels=PATH");
  }
  import.name = absl::GetFlag(FLAGS_name);
  if (import.name.empty()) {
    return UsageError("dataset import needs --name=NAME");
  }
  import.images_path = images;
  import.labels_path = labels;
  return ImportOne(import);
}

// ------------------------------------------------------------------- main

// `-o X` and `-o=X` are --output's short form: rewritten before parsing, so
// one flag holds the setting. Arguments after `--` are left alone.
absl::StatusOr<std::vector<std::string>> ExpandShortFlags(int argc, char** argv) {
  std::vector<std::string> args;
  bool flags = true;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags && arg == "--") flags = false;
    if (flags && arg == "-o") {
      if (i + 1 == argc) {
        return absl::InvalidArgumentError("-o needs a format: -o table or -o json");
      }
      args.push_back(absl::StrCat("--output=", argv[++i]));
    } else if (flags && absl::StartsWith(arg, "-o=")) {
      args.push_back(absl::StrCat("--output=", arg.substr(3)));
    } else {
      args.push_back(arg);
    }
  }
  return args;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::StatusOr<std::vector<std::string>> expanded = ExpandShortFlags(argc, argv);
  if (!expanded.ok()) return UsageError(expanded.status().message());
  std::vector<char*> expanded_argv;
  for (std::string& arg : *expanded) expanded_argv.push_back(arg.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(expanded_argv.size()), expanded_argv.data());
  if (positional.size() < 2) {
    std::cerr << kUsage << std::endl;
    return kExitUsage;
  }
  const std::string command = positional[1];
  const std::vector<std::string> args(positional.begin() + 2, positional.end());

  Options options;
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output == "table") {
    options.output = OutputFormat::kTable;
  } else if (output == "json") {
    options.output = OutputFormat::kJson;
  } else {
    return UsageError(
        absl::StrCat("output format '", output, "' is unknown; use -o table or -o json"));
  }
  absl::StatusOr<absl::Duration> timeout =
      ParseDurationFlag("timeout", absl::GetFlag(FLAGS_timeout));
  if (!timeout.ok()) return UsageError(timeout.status().message());
  options.wait_timeout = *timeout;
  absl::StatusOr<absl::Duration> connect_timeout =
      ParseDurationFlag("connect_timeout", absl::GetFlag(FLAGS_connect_timeout));
  if (!connect_timeout.ok()) return UsageError(connect_timeout.status().message());
  options.connect_timeout = *connect_timeout;
  absl::StatusOr<absl::Duration> reconnect_timeout =
      ParseDurationFlag("reconnect_timeout", absl::GetFlag(FLAGS_reconnect_timeout));
  if (!reconnect_timeout.ok()) {
    return UsageError(reconnect_timeout.status().message());
  }
  options.reconnect_timeout = *reconnect_timeout;

  if (command == "dataset") return RunDataset(args);

  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  absl::StatusOr<HostPort> address = ParseHostPort(options.coordinator);
  if (!address.ok()) {
    return UsageError(absl::StrCat("--coordinator=", options.coordinator,
                                   " is not HOST:PORT: ", address.status().message()));
  }

  if (command == "nodes" || command == "list") {
    if (!args.empty()) {
      return UsageError(absl::StrCat(command, " takes no arguments, got '", args[0], "'"));
    }
    return command == "nodes" ? RunNodes(options) : RunList(options);
  }
  if (command == "submit") return RunSubmit(options, args);
  if (command == "get") return RunGet(options, args);
  if (command == "wait") return RunWait(options, args);
  if (command == "stop") return RunStop(options, args);
  if (command == "checkpoint") return RunCheckpoint(options, args);
  if (command == "resume") return RunResume(options, args);
  if (command == "export") return RunExport(options, args);
  return UsageError(absl::StrCat("unknown command '", command,
                                 "'; commands are nodes, submit, list, get, "
                                 "wait, stop, checkpoint, resume, export and dataset import"));
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) { return downpour::Main(argc, argv); }
