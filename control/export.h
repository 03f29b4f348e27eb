// A checkpoint's model as one safetensors file a user takes away: every
// parameter, joined from the shards' partitions, and every buffer (batch
// norm's running statistics, from the workers' state).
//
// Layouts. kPyTorch (the default) names and lays out tensors the way a
// PyTorch module of the same architecture does, so load_state_dict takes the
// file as it is: a layer's tensors are "<layer>.weight" / "<layer>.bias";
// a dense weight is [out, in] (ours is [in, out]); a conv2d weight is
// [out, in, kh, kw] (ours [out, kh, kw, in]); batch norm's gamma and beta are
// "<layer>.weight" and "<layer>.bias", beside "<layer>.running_mean",
// "<layer>.running_var" and "<layer>.num_batches_tracked" (I64, the steps
// trained); an embedding's table is "<layer>.weight"; and the first dense
// layer after a flatten of an image takes its inputs in PyTorch's NCHW order
// (ours are NHWC). kNative keeps our names ("<layer>/weight") and layouts.
//
// The other way: a new job's initial weights (fine-tuning) from a file in
// either layout, written as the job's checkpoint at step 0.
//
// Thread-safety: thread-safe; touches only files.
#ifndef DOWNPOUR_CONTROL_EXPORT_H_
#define DOWNPOUR_CONTROL_EXPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

enum class ExportLayout { kPyTorch, kNative };

// The safetensors bytes of `checkpoint` (verified: a damaged file is
// DataLoss naming it) of a job of `spec`, with the spec (text format) and the
// checkpoint's job and step in the file's metadata.
absl::StatusOr<std::string> ExportCheckpoint(const std::string& root, const std::string& job_id,
                                             const JobSpec& spec,
                                             const CheckpointRestore& checkpoint,
                                             ExportLayout layout);

// Writes `weights` (a safetensors file in either layout: every parameter and
// batch-norm statistic of `spec`'s model, by our name or PyTorch's) as job
// `job_id`'s checkpoint at step 0 — shard files of the job's partitions
// without optimizer state (which starts fresh), the workers' state, the
// manifest — and returns what the job records. InvalidArgument naming the
// tensor that is missing or of another shape.
absl::StatusOr<CheckpointInfo> WriteInitialCheckpoint(const std::string& root,
                                                      const std::string& job_id,
                                                      const JobSpec& spec,
                                                      const SafetensorsFile& weights,
                                                      int64_t time_ms);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_EXPORT_H_
