#include "common/platform/mutex_tuning.h"

#include "absl/synchronization/mutex.h"

namespace downpour {

void SkipMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace downpour
