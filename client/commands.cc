#include "client/commands.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "control/coordinator.h"

namespace downpour {

int Fail(int code, absl::string_view message) {
  std::cerr << "downpourctl: " << message << std::endl;
  return code;
}

int FailStatus(const absl::Status& status) {
  const bool rejected = status.code() == absl::StatusCode::kInvalidArgument ||
                        status.code() == absl::StatusCode::kAlreadyExists;
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    return Fail(kExitFailed,
                absl::StrCat("the coordinator does not know who you are: ", status.message()));
  }
  if (status.code() == absl::StatusCode::kPermissionDenied) {
    return Fail(kExitFailed, absl::StrCat("the coordinator refused: ", status.message()));
  }
  return Fail(rejected ? kExitUsage : kExitFailed, status.message());
}

int UsageError(absl::string_view message) { return Fail(kExitUsage, message); }

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

absl::StatusOr<std::unique_ptr<RemoteCoordinator>> ConnectTo(const CtlOptions& options) {
  return RemoteCoordinator::Connect(options.coordinator, options.connect_timeout,
                                    options.credentials);
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

std::string TestAucText(const JobStatus& job) {
  if (TestAccuracyText(job) == "-" || !job.has_test_auc()) return "-";
  return absl::StrFormat("%.4f", job.test_auc());
}

}  // namespace downpour
