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
// Sparse embeddings (EmbeddingLayer sparse: true) hold only the rows that
// exist on the shards (trained or looked up, not evicted), so each is two
// tensors, gathered from every shard's file: "<layer>.ids" (I64 [rows], in
// increasing order: each row's id in the table, which with hash_ids is the
// hashed id spec/sparse_ids.h SparseRowOf gives, not the raw feature value)
// and "<layer>.weight" (F32 [rows, dim]: row k is id ids[k]); kNative names
// them "<layer>/ids" and "<layer>/table". Optimizer state is not exported.
// In PyTorch, with `ids` and `weight` from the file, `rows` a batch's ids
// (hashed as the job hashes them) and `offsets` its bags:
//   n = len(ids)
//   w = torch.cat([weight, torch.zeros(1, weight.shape[1])])  # w[n]: unknown
//   pos = torch.searchsorted(ids, rows)
//   pos[ids[pos.clamp(max=n - 1)] != rows] = n  # never trained (or evicted)
//   bag = torch.nn.EmbeddingBag.from_pretrained(w, mode="sum")  # or "mean"
//   out = bag(pos, offsets)
// (or a dict {id: k} for lookups one at a time; register `ids` as a buffer to
// load the file with load_state_dict). A row not in `ids` has its initial
// value in the job (InitSparseRow, ps/sparse_table.h: uniform in
// [-init_scale, init_scale]); zeros or one's own initialisation stand in
// for it. A checkpoint written before checkpoints held the tables exports
// them with no rows.
//
// The other way: a new job's initial weights (fine-tuning) from a file in
// either layout, written as the job's checkpoint at step 0. A sparse table's
// rows, when the file has both of its tensors, go to the shards that hold
// them in the new job (SparseShardOf over its num_shards), without optimizer
// state; a table the file lacks starts afresh.
//
// Thread-safety: thread-safe; touches only files.
#ifndef DOWNPOUR_CONTROL_EXPORT_H_
#define DOWNPOUR_CONTROL_EXPORT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

enum class ExportLayout { kPyTorch, kNative };

// The safetensors bytes of `checkpoint` (verified: a damaged file is
// DataLoss naming it) of a job of `spec`, with the spec (text format), the
// checkpoint's job and step, and `extra` in the file's metadata.
absl::StatusOr<std::string> ExportCheckpoint(const std::string& root, const std::string& job_id,
                                             const JobSpec& spec,
                                             const CheckpointRestore& checkpoint,
                                             ExportLayout layout,
                                             const std::map<std::string, std::string>& extra = {});

// Writes `weights` (a safetensors file in either layout: every parameter and
// batch-norm statistic of `spec`'s model, by our name or PyTorch's) as job
// `job_id`'s checkpoint at step 0 — shard files of the job's partitions
// without optimizer state (which starts fresh), the workers' state, the
// manifest — and returns what the job records. InvalidArgument naming the
// tensor that is missing or of another shape (a sparse table's: one of its
// two tensors without the other, or an id outside its vocabulary).
absl::StatusOr<CheckpointInfo> WriteInitialCheckpoint(const std::string& root,
                                                      const std::string& job_id,
                                                      const JobSpec& spec,
                                                      const SafetensorsFile& weights,
                                                      int64_t time_ms);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_EXPORT_H_
