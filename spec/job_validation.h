// Checks a submitted JobSpec before it is queued, so a bad spec is rejected at
// submit time with one message that names the field.
#ifndef DOWNPOUR_SPEC_JOB_VALIDATION_H_
#define DOWNPOUR_SPEC_JOB_VALIDATION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "spec/model_shape.h"
#include "spec/params.h"

namespace downpour {

// Fills the defaults of unset optional fields (partition size, log cadence,
// dataset keys). Idempotent.
void ApplyJobDefaults(JobSpec* spec);

// Returns the model's parameters when `spec` (after ApplyJobDefaults) is
// valid, or InvalidArgument naming the first bad field. The sizes of
// spec/limits.h are checked first (every string and list, the placement's
// partitions, the whole spec), and the record-file globs must be relative
// with no component that can match "..".
absl::StatusOr<std::vector<ParamInfo>> ValidateJobSpec(const JobSpec& spec);

// The optimizer sparse table `table` runs: its own, or else the job's
// (`job_optimizer`), checked as ValidateJobSpec checks it (its values, named
// by the table's own field where it is the table's, then
// CheckSparseTableOptimizerKind). ValidateJobSpec calls it for every table; a
// shard calls it again for the tables it creates.
absl::Status ValidateSparseTableOptimizer(const SparseTableInfo& table,
                                          const OptimizerSpec& job_optimizer);

// Job ids: 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit.
absl::Status ValidateJobId(const std::string& job_id);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_JOB_VALIDATION_H_
