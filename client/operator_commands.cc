// downpourctl's operator commands: describe (spec, placement, events,
// progress history), delete (an ended job leaves the store) and logs (the
// job's lines from its nodes and the coordinator, -f to follow).
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/output.h"
#include "google/protobuf/text_format.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace {

// Server-side timeout of each JobLogs long poll.
constexpr absl::Duration kLogsPoll = absl::Seconds(10);

std::string Clock(int64_t time_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(time_ms),
                          absl::LocalTimeZone());
}

void PrintLine(const JobLogLine& line, const CtlOptions& options) {
  if (options.output == OutputFormat::kJson) {
    // One object a line (JSON Lines), so -f output can be piped.
    std::string json = ToJson(line);
    json.erase(std::remove(json.begin(), json.end(), '\n'), json.end());
    std::cout << json << std::endl;
    return;
  }
  if (options.output == OutputFormat::kYaml) {
    std::string item = ToYaml(line, 2);
    if (item.size() >= 2) item.replace(0, 2, "- ");
    std::cout << item << std::flush;
    return;
  }
  std::cout << Clock(line.time_ms()) << "  " << line.source() << "  " << line.text() << std::endl;
}

}  // namespace

int RunDescribe(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("describe needs exactly one job id: downpourctl describe JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<JobDescription> description = (*client)->DescribeJob(args[0]);
  if (!description.ok()) return FailStatus(description.status());
  if (PrintsMessages(options.output)) {
    PrintMessage(*description, options.output);
    return kExitOk;
  }
  const JobStatus& job = description->job();
  PrintJobSummary(job);
  std::cout << "progress:" << (description->progress().empty() ? "       -" : "") << "\n";
  for (const ProgressPoint& p : description->progress()) {
    std::cout << absl::StrFormat("  %s  step %d  loss %.4f  %.0f ex/s\n", Clock(p.time_ms()),
                                 p.step(), p.loss(), p.examples_per_sec());
  }
  std::string spec;
  google::protobuf::TextFormat::PrintToString(job.spec(), &spec);
  std::cout << "spec:\n";
  for (size_t at = 0; at < spec.size();) {
    const size_t end = spec.find('\n', at);
    std::cout << "  " << spec.substr(at, end == std::string::npos ? end : end - at) << "\n";
    if (end == std::string::npos) break;
    at = end + 1;
  }
  std::cout.flush();
  return kExitOk;
}

int RunDelete(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("delete needs exactly one job id: downpourctl delete JOB");
  }
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::Status deleted = (*client)->DeleteJob(args[0], options.with_checkpoints);
  if (!deleted.ok()) return FailStatus(deleted);
  std::cout << "job " << args[0] << " deleted"
            << (options.with_checkpoints ? ", with its checkpoint files" : "") << std::endl;
  return kExitOk;
}

int RunLogs(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return UsageError("logs needs exactly one job id: downpourctl logs JOB [-f]");
  }
  if (options.tail < 0) return UsageError("--tail=N must not be negative");
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  JobLogsRequest request;
  request.set_job_id(args[0]);
  bool first = true;
  while (true) {
    absl::StatusOr<JobLogsResponse> response = (*client)->JobLogs(request);
    if (!response.ok()) return FailStatus(response.status());
    if (first && response->truncated()) {
      std::cerr << "downpourctl: older lines of job " << args[0]
                << " are no longer kept by the coordinator" << std::endl;
    }
    int skip = 0;
    if (first && options.tail > 0 && response->lines_size() > options.tail) {
      skip = response->lines_size() - static_cast<int>(options.tail);
    }
    for (int i = skip; i < response->lines_size(); ++i) PrintLine(response->lines(i), options);
    if (response->lines_size() > 0) {
      request.set_after_sequence(response->lines().rbegin()->sequence());
    }
    first = false;
    // Without -f: what is there now. With -f: until the job has ended and
    // its last lines are out.
    if (!options.follow || (response->job_ended() && response->lines_size() == 0)) {
      return kExitOk;
    }
    request.set_timeout_ms(absl::ToInt64Milliseconds(kLogsPoll));
  }
}

}  // namespace downpour
