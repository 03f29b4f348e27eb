#include "common/build_info.h"

namespace downpour {

// Written by the build_stamp genrule (common/BUILD.bazel).
extern const char kBuildCommit[];

const char* BuildVersion() { return "0.1.0"; }

const char* BuildCommit() { return kBuildCommit; }

}  // namespace downpour
