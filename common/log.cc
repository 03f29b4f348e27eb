#include "common/log.h"

#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace downpour {
namespace {

absl::Mutex log_mu;
std::string* log_prefix ABSL_GUARDED_BY(log_mu) = nullptr;
absl::Mutex observer_mu;
std::function<void(absl::Time, absl::string_view)>* log_observer ABSL_GUARDED_BY(observer_mu) =
    nullptr;

}  // namespace

void SetLogPrefix(const std::string& prefix) {
  absl::MutexLock lock(&log_mu);
  delete log_prefix;
  log_prefix = new std::string(prefix);
}

void SetLogObserver(std::function<void(absl::Time, absl::string_view)> observer) {
  absl::MutexLock lock(&observer_mu);
  delete log_observer;
  log_observer = observer
                     ? new std::function<void(absl::Time, absl::string_view)>(std::move(observer))
                     : nullptr;
}

void Log(absl::string_view message) {
  const absl::Time now = absl::Now();
  const std::string time = absl::FormatTime("%Y-%m-%dT%H:%M:%E3S", now, absl::LocalTimeZone());
  {
    absl::MutexLock lock(&log_mu);
    std::fprintf(stderr, "%s %s: %.*s\n", time.c_str(),
                 log_prefix ? log_prefix->c_str() : "downpour", static_cast<int>(message.size()),
                 message.data());
    std::fflush(stderr);
  }
  // Held while the observer runs, so SetLogObserver(nullptr) returns only
  // once no call of the old observer is in flight.
  absl::ReaderMutexLock lock(&observer_mu);
  if (log_observer != nullptr) (*log_observer)(now, message);
}

int ExitWithError(const absl::Status& status) {
  absl::MutexLock lock(&log_mu);
  std::fprintf(stderr, "%s: %.*s\n", log_prefix ? log_prefix->c_str() : "downpour",
               static_cast<int>(status.message().size()), status.message().data());
  return 1;
}

}  // namespace downpour
