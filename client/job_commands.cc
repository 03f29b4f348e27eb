// downpourctl's job commands: submit, list, get, wait, stop.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/job_spec_file.h"
#include "client/output.h"
#include "common/file.h"
#include "control/coordinator.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace {

// Server-side timeout of each WatchJob long poll.
constexpr absl::Duration kWatchPoll = absl::Seconds(10);

// Seconds from `start_ms` to the job's end (a job still running: to now).
double SecondsToEnd(const JobStatus& job, int64_t start_ms) {
  const int64_t end = job.end_time_ms() > 0 ? job.end_time_ms() : NowMs();
  if (start_ms <= 0 || end < start_ms) return 0;
  return (end - start_ms) / 1000.0;
}

// When the job first started: the first of its attempts (a coordinator that
// predates first_start_time_ms: the latest), or its submission if it never
// started.
int64_t FirstStartMs(const JobStatus& job) {
  if (job.first_start_time_ms() > 0) return job.first_start_time_ms();
  return job.start_time_ms() > 0 ? job.start_time_ms() : job.submit_time_ms();
}

// Seconds the whole job ran, from its first start, restarts and the waits
// between them included.
double WallSeconds(const JobStatus& job) { return SecondsToEnd(job, FirstStartMs(job)); }

// Whether the job started more than once (its latest attempt began after
// its first): its last attempt's time differs from its whole wall time.
bool Restarted(const JobStatus& job) {
  return job.start_time_ms() > 0 && job.start_time_ms() != FirstStartMs(job);
}

// Seconds the latest attempt ran.
double LastAttemptSeconds(const JobStatus& job) { return SecondsToEnd(job, job.start_time_ms()); }

}  // namespace

// ------------------------------------------------------------------- wait

namespace {

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

int PrintFinal(const JobStatus& job, const CtlOptions& options) {
  if (PrintsMessages(options.output)) {
    PrintMessage(job, options.output);
  } else {
    // A job that measured no accuracy (it failed first) shows none; the AUC
    // and log loss are there when its metrics asked for them.
    std::string figures;
    if (job.test_accuracy() >= 0) {
      figures = absl::StrFormat(" test_accuracy=%.4f", job.test_accuracy());
      if (job.has_test_auc()) absl::StrAppendFormat(&figures, " test_auc=%.4f", job.test_auc());
      if (job.has_test_log_loss()) {
        absl::StrAppendFormat(&figures, " test_log_loss=%.4f", job.test_log_loss());
      }
    }
    // A job that restarted also shows its last attempt's time; one that did
    // not shows wall_s only.
    std::string times = absl::StrFormat(" wall_s=%.1f", WallSeconds(job));
    if (Restarted(job)) {
      absl::StrAppendFormat(&times, " last_attempt_s=%.1f", LastAttemptSeconds(job));
    }
    std::cout << absl::StrFormat("job %s %s steps=%d%s%s", job.id(), JobState_Name(job.state()),
                                 job.step(), figures, times)
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

}  // namespace

int WaitForJob(RemoteCoordinator& client, const std::string& job_id, const CtlOptions& options) {
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
    if (job->step() > printed_step || job->state() != printed_state) {
      PrintProgress(*job, eta);
      printed_step = job->step();
      printed_state = job->state();
    }
  }
}

int RunWait(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("wait needs exactly one job id: downpourctl wait JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  return WaitForJob(**client, args[0], options);
}

// ----------------------------------------------------------------- submit

int RunSubmit(const CtlOptions& options, const std::vector<std::string>& args) {
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
  request.set_job_id(options.job_id);
  const std::string init_from = options.init_from;
  if (!options.model.empty()) {
    // The coordinator imports the file (spec/onnx_import.h): the spec then
    // holds the training part only.
    if (!init_from.empty()) {
      return UsageError("--model starts the job from the ONNX graph's weights; drop --init_from");
    }
    if (request.spec().has_model()) {
      return UsageError(absl::StrCat(path,
                                     " has a model and --model names one; leave model out "
                                     "of the spec"));
    }
    absl::StatusOr<std::string> onnx = ReadModelFile(options.model);
    if (!onnx.ok()) return Fail(kExitUsage, absl::StrCat("--model: ", onnx.status().message()));
    request.mutable_model_file()->set_onnx(*std::move(onnx));
    request.mutable_model_file()->set_name(options.model);
  }
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
    // A duplicate id is rejected input too (exit 2).
    return FailStatus(job.status());
  }
  if (options.wait) {
    std::cerr << "submitted job " << job->id() << std::endl;
    return WaitForJob(**client, job->id(), options);
  }
  if (PrintsMessages(options.output)) {
    PrintMessage(*job, options.output);
  } else {
    std::cout << job->id() << std::endl;
  }
  return kExitOk;
}

// ------------------------------------------------------------------- list

int RunList(const CtlOptions& options, const std::vector<std::string>& args) {
  if (!args.empty())
    return UsageError(absl::StrCat("list takes no arguments, got '", args[0], "'"));
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<std::vector<JobStatus>> jobs = (*client)->ListJobs();
  if (!jobs.ok()) return FailStatus(jobs.status());
  if (PrintsMessages(options.output)) {
    PrintMessages(*jobs, options.output);
    return kExitOk;
  }
  const bool wide = options.output == OutputFormat::kWide;
  // A TEST_AUC column only where some job has an AUC (JobSpec.metrics), so
  // a list of classifiers stays as narrow as it was.
  const bool auc = std::any_of(jobs->begin(), jobs->end(),
                               [](const JobStatus& job) { return TestAucText(job) != "-"; });
  const int64_t now = NowMs();
  std::vector<std::vector<std::string>> rows;
  for (const JobStatus& job : *jobs) {
    std::string age = "-";
    if (job.submit_time_ms() > 0) {
      age = FormatShortDuration(absl::Milliseconds(now - job.submit_time_ms()));
    }
    rows.push_back({job.id(), job.spec().name().empty() ? "-" : job.spec().name(),
                    JobState_Name(job.state()), StepsText(job), LossText(job),
                    TestAccuracyText(job)});
    if (auc) rows.back().push_back(TestAucText(job));
    rows.back().push_back(age);
    if (wide) {
      rows.back().push_back(absl::StrCat(job.placement().worker_nodes_size()));
      rows.back().push_back(absl::StrCat(job.placement().shard_nodes_size()));
      rows.back().push_back(absl::StrFormat("%.0f", job.examples_per_sec()));
      rows.back().push_back(job.message().empty() ? "-" : job.message());
    }
  }
  std::vector<std::string> header = {"ID", "NAME", "STATE", "STEP/STEPS", "LOSS", "TEST_ACC"};
  if (auc) header.push_back("TEST_AUC");
  header.push_back("AGE");
  if (wide) header.insert(header.end(), {"WORKERS", "SHARDS", "EXAMPLES/S", "MESSAGE"});
  PrintTable(header, rows);
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
  // Before the final evaluation, the latest periodic one's.
  const char* latest = TestAccuracyText(job) == "-" ? " (latest evaluation)" : "";
  if (job.has_test_auc()) line("test AUC", absl::StrFormat("%.4f%s", job.test_auc(), latest));
  if (job.has_test_log_loss()) {
    line("test log loss", absl::StrFormat("%.4f%s", job.test_log_loss(), latest));
  }
  line("message", job.message().empty() ? "-" : job.message());
  if (job.submit_time_ms() > 0) {
    line("submitted",
         absl::StrCat(FormatShortDuration(absl::Milliseconds(now - job.submit_time_ms())), " ago"));
  }
  if (job.start_time_ms() > 0) {
    line("wall time", absl::StrFormat("%.1fs", WallSeconds(job)));
    if (Restarted(job)) {
      line("last attempt",
           absl::StrFormat("%.1fs (attempt %d)", LastAttemptSeconds(job), job.attempt()));
    }
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
  if (!job.final_checkpoint_missing().empty()) {
    line("final state", absl::StrCat("not saved: ", job.final_checkpoint_missing()));
  }
  if (job.checkpoint_failures() > 0) {
    line("failed checkpoints",
         absl::StrCat(job.checkpoint_failures(), " (the last: ", job.last_checkpoint_error(), ")"));
  }
  for (const CheckpointInfo& c : job.checkpoints()) {
    std::cout << absl::StrFormat("  step %d  %s  %.1f MiB  %s ago\n", c.step(), c.dir(),
                                 c.bytes() / 1048576.0,
                                 FormatShortDuration(absl::Milliseconds(now - c.time_ms())));
  }
  // The test-accuracy curve (and AUC, log loss where measured): time since
  // submission, as a user waits for it.
  if (!job.evaluations().empty()) line("evaluations", absl::StrCat(job.evaluations_size()));
  for (const Evaluation& e : job.evaluations()) {
    std::string figures = absl::StrFormat("accuracy %.4f", e.accuracy());
    if (e.has_auc()) absl::StrAppendFormat(&figures, "  AUC %.4f", e.auc());
    if (e.has_log_loss()) absl::StrAppendFormat(&figures, "  log loss %.4f", e.log_loss());
    std::cout << absl::StrFormat(
        "  step %d  %s  at %s\n", e.step(), figures,
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

int RunGet(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("get needs exactly one job id: downpourctl get JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->GetJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  if (PrintsMessages(options.output)) {
    PrintMessage(*job, options.output);
  } else {
    PrintJobSummary(*job);
  }
  return kExitOk;
}

// ------------------------------------------------------------------- stop

int RunStop(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("stop needs exactly one job id: downpourctl stop JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->StopJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  if (PrintsMessages(options.output)) {
    PrintMessage(*job, options.output);
  } else {
    std::cout << "job " << job->id() << " " << JobState_Name(job->state()) << std::endl;
  }
  return kExitOk;
}

}  // namespace downpour
