// What build of Downpour this binary is: its release version and the git
// commit it was built from (stamped by Bazel through
// scripts/workspace_status.sh; "unknown" when built outside a git checkout).
// Thread-safe (constants).
#ifndef DOWNPOUR_COMMON_BUILD_INFO_H_
#define DOWNPOUR_COMMON_BUILD_INFO_H_

namespace downpour {

// The release version ("0.1.0").
const char* BuildVersion();
// The commit's short hash, or "unknown".
const char* BuildCommit();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_BUILD_INFO_H_
