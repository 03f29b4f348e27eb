// Job spec files: a JobSpec written in protobuf text format
// (examples/*.pbtxt), as downpourctl submits them.
#ifndef DOWNPOUR_CLIENT_JOB_SPEC_FILE_H_
#define DOWNPOUR_CLIENT_JOB_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace downpour {

// Reads the JobSpec in `path`. A missing file is NotFound naming it; a
// directory or a parse error is InvalidArgument ("FILE:LINE:COL: message"
// for the latter).
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_JOB_SPEC_FILE_H_
