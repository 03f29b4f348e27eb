// The files of a checkpoint, as every daemon reads and writes them (layout
// ROOT/JOB_ID/step-S/): each shard's part, shard-K.safetensors, with its
// partitions of the job (values, optimizer slots, version, updates applied),
// the workers' pushed-step counts and the exactly-once windows; the workers'
// state, worker.safetensors; and manifest.json, written last, naming every
// file with its size and CRC32C. Loading checks both before using a byte.
//
// Shard file layout: tensor "t<T>.p<P>" holds partition P of parameter
// tensor T (F32), "t<T>.p<P>.slot<K>" its optimizer slot K; "worker_steps"
// (I64) each rank's pushed steps; metadata "job", "shard", "step", "mode",
// "partitions" (one "T P offset elements version updates" line each) and
// "requests" (one "incarnation floor seq,seq,... worker_id" line per worker).
// A job with sparse embedding tables also has metadata "sparse": a line
// "version V" (the tables' version: SYNC, the step), then one "rows dim
// slots name" line per table, and per table NAME ("<layer>/table") the rows
// this shard holds, sorted by id: "sparse/NAME/ids" (I64 [rows]),
// "sparse/NAME/values" (F32 [rows, dim]), "sparse/NAME/slot<K>" (F32 [rows,
// dim], optimizer slot K), "sparse/NAME/updates" and "sparse/NAME/touches"
// (I64 [rows]). A file without "sparse" (written before checkpoints held
// the tables) reads with has_sparse false. The manifest's size and CRC32C
// cover the whole file, tables included.
//
// Thread-safety: the functions are thread-safe.
#ifndef DOWNPOUR_SPEC_CHECKPOINT_FILES_H_
#define DOWNPOUR_SPEC_CHECKPOINT_FILES_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "proto/job.pb.h"

namespace downpour {

// One worker's exactly-once window on a shard (ps/request_dedup.h).
struct RequestWindow {
  std::string worker_id;
  int64_t incarnation = 0;
  int64_t floor = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> applied;  // Above the floor, ascending.
};

struct PartitionSnapshot {
  int32_t tensor_id = 0;
  int32_t partition = 0;
  int64_t offset = 0;
  int64_t version = 0;
  int64_t updates = 0;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

// One sparse embedding table's rows on a shard (ps/sparse_table.h): only
// the rows that exist, sorted by id, with their optimizer state and counts.
struct SparseTableSnapshot {
  std::string name;  // "<layer>/table" (spec/model_shape.h SparseTableInfo).
  int64_t dim = 0;
  int slots = 0;  // Optimizer slots per row: SGD 0, Adagrad 1, Adam 2.
  std::vector<int64_t> ids;
  std::vector<float> values;       // [rows * dim], row-major.
  std::vector<float> slot_values;  // [slots][rows * dim], slot-major.
  std::vector<int64_t> updates;    // Per row: optimizer updates (Adam's t).
  std::vector<int64_t> touches;    // Per row: touches (its eviction order).
};

struct ShardSnapshot {
  std::string job_id;
  int shard = 0;
  int64_t step = 0;
  int64_t attempt = 1;  // The job's start (Task.attempt).
  bool sync = true;
  std::vector<PartitionSnapshot> partitions;  // Sorted by (tensor, partition).
  std::vector<int64_t> worker_steps;
  std::vector<RequestWindow> requests;
  // The job's sparse tables on this shard (ps/sparse_store.h), in the
  // model's table order: false for a job without tables, and in a file
  // written before checkpoints held them. `sparse_version` is the tables'
  // version (SYNC: the step; ASYNC/SSP: pushes of rows received).
  bool has_sparse = false;
  int64_t sparse_version = 0;
  std::vector<SparseTableSnapshot> sparse_tables;
  // Non-empty: the capture failed (a partition was past the step); nothing
  // else is set but the job, shard and step.
  std::string error;
};

// "shard-K.safetensors".
std::string ShardFileName(int shard);
// "JOB_ID/step-S" for the job's first start (attempt 0 or 1), else
// "JOB_ID/step-S.attempt-N", relative to the checkpoint root: each start of a
// job writes its own directories, so a process of an earlier start that is
// still writing (a shard that was frozen, then woke) never touches a newer
// start's files.
std::string CheckpointDir(const std::string& job_id, int64_t step, int64_t attempt = 1);

// InvalidArgument naming the table for a sparse table whose vectors do not
// have the sizes its ids, dim and slots give.
absl::StatusOr<WrittenFile> WriteShardSnapshot(const std::string& path,
                                               const ShardSnapshot& snapshot);

// A partition to write from arrays its owner keeps, not copied: `values` and
// each of `slots` hold `num_elements` floats.
struct PartitionArrays {
  int32_t tensor_id = 0;
  int32_t partition = 0;
  int64_t offset = 0;
  int64_t version = 0;
  int64_t updates = 0;
  int64_t num_elements = 0;
  const float* values = nullptr;
  std::vector<const float*> slots;
};

// The arrays of `p`, valid while it is unchanged.
PartitionArrays ArraysOf(const PartitionSnapshot& p);

// WriteShardSnapshot with `partitions` (sorted by (tensor, partition)) in
// place of snapshot.partitions, which is ignored.
absl::StatusOr<WrittenFile> WriteShardSnapshot(const std::string& path,
                                               const ShardSnapshot& snapshot,
                                               const std::vector<PartitionArrays>& partitions);

// Reads a shard file, first checking it has `expected`'s size and CRC32C (a
// file that does not is DataLoss naming it: partial or corrupt); a file
// whose contents do not hold together (a sparse table's tensor missing or of
// another shape) is DataLoss naming it and what is wrong.
absl::StatusOr<ShardSnapshot> ReadShardSnapshot(const std::string& path,
                                                const CheckpointFile& expected);

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kWorkerStateName[] = "worker.safetensors";
// In the workers' state, beside the model's local state by name: FP16's loss
// scale (F64; 0 or less: the worker keeps its own).
inline constexpr char kLossScaleTensor[] = "loss_scale";

// ROOT/DIR/manifest.json.
std::string ManifestPath(const std::string& root, const std::string& dir);

// Reads a checkpoint file whole, first checking it has `expected`'s size and
// CRC32C: a file that is missing, short or different is DataLoss naming it.
absl::StatusOr<std::string> ReadVerified(const std::string& path, const CheckpointFile& expected);

// Writes ROOT/JOB_ID/step-S/manifest.json atomically (the checkpoint's
// directory exists: its files are in it).
absl::StatusOr<WrittenFile> WriteManifest(const std::string& root,
                                          const CheckpointManifest& manifest);
// Reads ROOT/DIR/manifest.json; DataLoss naming it when it is missing (the
// checkpoint never completed), unparsable or of another checkpoint.
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& root, const std::string& dir);
// ReadManifest, then ReadVerified of every file it names: the first problem
// is DataLoss naming the file.
absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& root,
                                                    const std::string& dir);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_CHECKPOINT_FILES_H_
