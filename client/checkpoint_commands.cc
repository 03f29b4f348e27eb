// downpourctl's checkpoint commands: checkpoint, resume, export.
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
#include "client/output.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "control/coordinator.h"
#include "google/protobuf/text_format.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"
#include "spec/onnx_export.h"

namespace downpour {

namespace {

// Server-side timeout of each WatchJob long poll.
constexpr absl::Duration kWatchPoll = absl::Seconds(10);

// Waits until the checkpoint asked for at `requested_ms` is written (0) or
// given up (1, with the job's last event).
int WaitForCheckpoint(RemoteCoordinator& client, const std::string& job_id, int64_t requested_ms,
                      const CtlOptions& options) {
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

}  // namespace

int RunCheckpoint(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("checkpoint needs exactly one job id: downpourctl checkpoint JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->CheckpointJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  if (options.wait) {
    return WaitForCheckpoint(**client, job->id(), job->checkpoint_requested_ms(), options);
  }
  std::cout << "job " << job->id() << ": checkpoint asked for (taken at its next step)"
            << std::endl;
  return kExitOk;
}

int RunResume(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("resume needs exactly one job id: downpourctl resume JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobStatus> job = (*client)->ResumeJob(args[0]);
  if (!job.ok()) return FailStatus(job.status());
  std::cerr << "job " << job->id() << " resumes from its checkpoint at step "
            << job->resumed_from_step() << std::endl;
  if (options.wait) return WaitForJob(**client, job->id(), options);
  if (PrintsMessages(options.output)) {
    PrintMessage(*job, options.output);
  }
  return kExitOk;
}

namespace {

// "model.safetensors" (or "model.onnx") -> "model.spec.pbtxt".
std::string SpecPathBeside(const std::string& out) {
  std::string base = out;
  for (const char* extension : {".safetensors", ".onnx"}) {
    if (absl::EndsWith(base, extension)) base.resize(base.size() - strlen(extension));
  }
  return base + ".spec.pbtxt";
}

// The ONNX graph of an export in the pytorch layout, from the file alone:
// its metadata holds the job's spec.
absl::StatusOr<std::string> OnnxOfExport(const SafetensorsFile& file) {
  auto spec_text = file.metadata().find("downpour.spec");
  JobSpec spec;
  if (spec_text == file.metadata().end() ||
      !google::protobuf::TextFormat::ParseFromString(spec_text->second, &spec)) {
    return absl::DataLossError("the exported model carries no readable job spec");
  }
  return ExportOnnx(spec.model(), file);
}

}  // namespace

int RunExport(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("export needs exactly one job id: downpourctl export JOB --out=FILE");
  }
  const std::string out = options.out;
  const std::string format = options.export_format;
  if (format != "safetensors" && format != "onnx") {
    return UsageError(
        absl::StrCat("--format=", format, " is unknown for export; use safetensors or onnx"));
  }
  const bool onnx = format == "onnx";
  if (out.empty()) {
    return UsageError(absl::StrCat("export needs --out=FILE (a .", onnx ? "onnx" : "safetensors",
                                   " file to write)"));
  }
  const std::string layout = options.layout;
  if (layout != "pytorch" && layout != "native") {
    return UsageError(absl::StrCat("--layout=", layout, " is unknown; use pytorch or native"));
  }
  if (onnx && layout != "pytorch") {
    // The graph's initializers are PyTorch's tensors, by PyTorch's names.
    return UsageError("--format=onnx writes PyTorch's names and layouts; drop --layout=native");
  }
  if (options.checkpoint < 0) {
    return UsageError("--checkpoint=STEP must not be negative");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<std::string> bytes =
      (*client)->ExportJob(args[0], options.checkpoint, layout == "native");
  if (!bytes.ok()) return FailStatus(bytes.status());
  // What arrived is checked like any checkpoint file before it is written.
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(*bytes, "the exported model");
  if (!file.ok()) return FailStatus(file.status());
  const auto& meta = file->metadata();
  if (onnx) {
    // Converted here, from what arrived: the coordinator knows one export.
    absl::StatusOr<std::string> graph = OnnxOfExport(*file);
    if (!graph.ok()) {
      return FailStatus(absl::Status(
          graph.status().code(), absl::StrCat("job ", args[0], ": ", graph.status().message())));
    }
    *bytes = *std::move(graph);
  }
  const std::string spec_path = SpecPathBeside(out);
  for (const auto& [path, contents] :
       {std::pair<std::string, std::string>{out, *bytes},
        {spec_path, meta.count("downpour.spec") ? meta.at("downpour.spec") : ""}}) {
    absl::Status written = WriteFileAtomically(path, contents, "export file");
    if (!written.ok()) return FailStatus(written);
  }
  // The step and what the job measured of the model there.
  const std::string accuracy =
      meta.count("downpour.test_accuracy")
          ? absl::StrCat(" (test accuracy ", meta.at("downpour.test_accuracy"), ")")
          : "";
  const std::string what =
      onnx ? absl::StrFormat("ONNX opset %d, %.1f MiB", kOnnxOpset, bytes->size() / 1048576.0)
           : absl::StrFormat("%d tensors, %.1f MiB, %s layout", file->tensors().size(),
                             bytes->size() / 1048576.0, layout);
  std::cout << absl::StrFormat("wrote %s (%s) from job %s step %s%s; spec in %s", out, what,
                               args[0],
                               meta.count("downpour.step") ? meta.at("downpour.step") : "?",
                               accuracy, spec_path)
            << std::endl;
  return kExitOk;
}

}  // namespace downpour
