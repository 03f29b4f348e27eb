#include "common/log.h"

#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace downpour {
namespace {

absl::Mutex log_mu;
std::string* log_prefix ABSL_GUARDED_BY(log_mu) = nullptr;

}  // namespace

void SetLogPrefix(const std::string& prefix) {
  absl::MutexLock lock(&log_mu);
  delete log_prefix;
  log_prefix = new std::string(prefix);
}

void Log(absl::string_view message) {
  const std::string time =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  absl::MutexLock lock(&log_mu);
  std::fprintf(stderr, "%s %s: %.*s\n", time.c_str(), log_prefix ? log_prefix->c_str() : "downpour",
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
}

int ExitWithError(const absl::Status& status) {
  absl::MutexLock lock(&log_mu);
  std::fprintf(stderr, "%s: %.*s\n", log_prefix ? log_prefix->c_str() : "downpour",
               static_cast<int>(status.message().size()), status.message().data());
  return 1;
}

}  // namespace downpour
