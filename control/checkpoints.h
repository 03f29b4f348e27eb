// The coordinator's side of checkpoints, on the files under the checkpoint
// root (spec/checkpoint_files.h has their format): committing a checkpoint
// whose shard files are written (the workers' state, then the manifest,
// last), finding the newest complete one to continue from, removing old
// ones.
//
// Thread-safety: the functions are thread-safe; they touch only files.
#ifndef DOWNPOUR_CONTROL_CHECKPOINTS_H_
#define DOWNPOUR_CONTROL_CHECKPOINTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

// What a checkpoint gathers before it is committed.
struct CheckpointParts {
  int64_t step = 0;
  std::string worker_state;  // Rank 0's state (safetensors bytes).
  std::vector<CheckpointFile> shard_files;
};

// Writes ROOT/JOB/step-S/worker.safetensors and then the manifest naming it
// and every shard file (all already written, fsynced and renamed), and
// returns what the job records. `time_ms` is the commit's time.
absl::StatusOr<CheckpointInfo> CommitCheckpoint(const std::string& root, const JobStatus& job,
                                                const CheckpointParts& parts, int64_t time_ms);

// The newest of `checkpoints` (oldest first) at `step` (0: at any step)
// whose manifest and files all check out, as a restore. Each refused one is
// described in `refused` ("checkpoint at step S: <why>", naming the file).
// NotFound when none is complete.
absl::StatusOr<CheckpointRestore> CompleteCheckpoint(const std::string& root,
                                                     const std::vector<CheckpointInfo>& checkpoints,
                                                     int64_t step,
                                                     std::vector<std::string>* refused);

// Removes what ROOT/JOB_ID holds besides `kept` (the checkpoints the job
// records): older checkpoints, incomplete ones, those of the job's earlier
// starts — but not the current start's (`attempt`) beyond `step`, which may
// be being written. Returns the first error (the rest is still tried).
absl::Status RemoveStaleCheckpoints(const std::string& root, const std::string& job_id,
                                    const std::vector<CheckpointInfo>& kept, int64_t attempt,
                                    int64_t step);

// Removes what a checkpoint that was given up wrote: ROOT/CheckpointDir(
// job_id, step, attempt), unless a manifest made it complete. A shard that
// writes its file after this leaves it to the next RemoveStaleCheckpoints.
absl::Status RemoveAbandonedCheckpoint(const std::string& root, const std::string& job_id,
                                       int64_t step, int64_t attempt);

// Removes ROOT/JOB_ID and everything in it (none there is fine);
// InvalidArgument for a job id that is not a plain name.
absl::Status RemoveJobCheckpoints(const std::string& root, const std::string& job_id);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_CHECKPOINTS_H_
