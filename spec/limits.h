// The size limits of everything a client or a node can send the control
// plane or a shard: one table, so the checks at each door (spec/
// job_validation for a job spec, control/request_limits for the
// coordinator's requests, ps/parameter_store for pushes and pulls) agree,
// and so what the daemons later send out stays within their peers' limits.
//
// What the limits protect. Every node and downpourctl take messages of up
// to 256 MiB from the coordinator (rpc/remote_coordinator.cc), a shard and
// a worker 256 MiB from each other, and the coordinator copies what it
// accepts into later messages:
//   - into every Task of every heartbeat response (one per running job the
//     node takes part in) the spec (<= 128 KiB), the placement (<= 3 MiB of
//     partitions, <= 2.5 MiB of node ids) and the shards' addresses
//     (<= 0.5 MiB); a worker's Task also its data share (<= 16 MiB) and the
//     workers' state (<= 2 x 8 MiB): a worker, in one job at a time, gets
//     at most ~40 MiB per rank it trains (kMaxRanksPerWorker: ~160 MiB); a
//     shard ~6 MiB per job (a job that large has thousands of workers and a
//     32 GiB model);
//   - into ListJobs a summary of every job (control/coordinator.h): the
//     spec and the placement's node ids, the workers' progress, the
//     checkpoints kept — a few KiB plus the spec for jobs of tens of
//     workers, so the 1000 jobs --job_retention_count keeps by default
//     list in about 130 MiB even if every spec is at its limit;
//   - into GetJob, WatchJob and DescribeJob the whole job, below 64 MiB:
//     the above, the data listing (8 MiB) and shares (16 MiB), 200 events
//     of <= 16 KiB, the workers' state.
// So no single field anyone sends can push a later message past a
// receiver's limit or grow the coordinator's memory without bound.
//
// Sizes are bytes of UTF-8 (what protobuf stores), counts are entries.
// Thread-safety: constants and pure functions.
#ifndef DOWNPOUR_SPEC_LIMITS_H_
#define DOWNPOUR_SPEC_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace downpour {

// ------------------------------------------------------------- identifiers

// Job ids name directories (checkpoints, TensorBoard files) and metric
// labels: 1 to 64 of [A-Za-z0-9._-] (spec/job_validation.h checks the
// characters).
inline constexpr size_t kMaxJobIdBytes = 64;
// A node id or address: a DNS host name (at most 253 bytes) with a role
// prefix ("worker@") and a port, with room. Placement repeats node ids once
// per worker and shard, so 4096 workers of the longest ids are 2 MiB.
inline constexpr size_t kMaxNodeIdBytes = 512;
inline constexpr size_t kMaxAddressBytes = 512;
inline constexpr size_t kMaxHostnameBytes = 256;
// A worker's compute devices ("cuda:0 NVIDIA H100 80GB HBM3"): hosts have 8
// or 16 GPUs today.
inline constexpr size_t kMaxDevices = 64;
inline constexpr size_t kMaxDeviceBytes = 256;
// Ranks of a SYNC job one worker trains at most (its own and those of lost
// workers it took over: control/rank_handover.h); its heartbeat carries a
// task per rank.
inline constexpr int kMaxRanksPerWorker = 4;
// A whole NodeInfo as registered (stored and listed as sent: this also
// bounds fields a newer node may add that this coordinator does not know).
inline constexpr size_t kMaxNodeInfoBytes = 64 << 10;

// ---------------------------------------------------------------- job spec

// Names people type: the job's name, a layer's name and the names of its
// inputs. They show in `list`, events and metric labels.
inline constexpr size_t kMaxNameBytes = 128;
// A file glob (dataset.train_files, dataset.test_files): PATH_MAX.
inline constexpr size_t kMaxPathBytes = 4096;
// A tf.train.Example feature name ("image/encoded").
inline constexpr size_t kMaxFeatureKeyBytes = 256;
// Model inputs are vectors or [height, width, channels] images.
inline constexpr int kMaxInputRank = 8;
// ResNet-152 in Downpour's layers (convolution, batch norm and ReLU apart)
// is about 520 layers.
inline constexpr int kMaxLayers = 2048;
// An `add` of several residual branches.
inline constexpr int kMaxLayerInputs = 64;
// Placement, the workers' progress and the shards' per-rank state grow with
// these; DistBelief-sized jobs use hundreds.
inline constexpr int kMaxWorkers = 4096;
inline constexpr int kMaxShards = 1024;
// Complete checkpoints kept (checkpoint.keep): each is the whole model on
// disk.
inline constexpr int kMaxCheckpointsKept = 100;
// A partition travels whole in one push or pull message (256 MiB at most
// between a worker and a shard); ARCHITECTURE.md's partitions are ~4 MiB.
inline constexpr int64_t kMaxPartitionBytes = int64_t{64} << 20;
// Every Task carries the job's placement, one ~23-byte entry per partition:
// 2^17 partitions are 3 MiB, and the largest model (32 GiB) in the default
// 256 KiB partitions.
inline constexpr int64_t kMaxPartitions = int64_t{1} << 17;
// A sparse table's embedding_staleness: the steps a worker may read a row
// it pulled before (it keeps the rows of that many steps).
inline constexpr int kMaxEmbeddingStaleness = 1000;
// The whole spec, serialized (fields this coordinator does not know
// included). ResNet-152 is about 30 KiB; the spec travels in every Task and
// every `list`.
inline constexpr size_t kMaxJobSpecBytes = 128 << 10;

// ---------------------------------------------------- what nodes report

// Free text a node or the coordinator writes about a job — a worker's error,
// a shard's checkpoint error, a log line — is cut to this (never refused:
// refusing a node's heartbeat over a long log line would make a healthy node
// look dead, refusing a worker's error would hide why its job failed).
inline constexpr size_t kMaxMessageBytes = 4096;
inline constexpr size_t kMaxLogLineBytes = 4096;
// A job event the coordinator writes (it names nodes, files, limits); a job
// keeps its newest 200.
inline constexpr size_t kMaxEventBytes = 16 << 10;
// Log lines in one heartbeat: what rpc/node_agent.h keeps while the
// coordinator is away (NodeAgent::kMaxPendingLogs).
inline constexpr int kMaxLogLinesPerHeartbeat = 2000;
// Checkpoint parts in one heartbeat: a shard repeats its last few per running
// job.
inline constexpr int kMaxCheckpointPartsPerHeartbeat = 4096;
// Jobs in one shard's heartbeat (HeartbeatRequest.job_steps).
inline constexpr int kMaxJobsPerHeartbeat = 4096;
// A worker's listing of the files matching train_files
// (ReportProgressRequest.data_files): ImageNet as TFRecords is ~1000 files.
inline constexpr int kMaxDataFiles = 100000;
inline constexpr size_t kMaxDataFilesBytes = 8 << 20;
// The job's data shares together (WorkerProgress.data): with fewer files
// than workers every rank holds every file's name, so the shares are
// num_workers times the listing.
inline constexpr size_t kMaxDataShareBytes = 16 << 20;
// Rank 0's state for a checkpoint (batch-norm running statistics and the
// loss scale): ResNet-152's is about 1 MiB. It goes into every worker's
// Task of a job that resumes.
inline constexpr size_t kMaxWorkerStateBytes = 8 << 20;

// ------------------------------------------------------------------ checks

// InvalidArgument "FIELD is N bytes; the limit is L bytes" when `value` is
// longer than `limit`.
absl::Status CheckBytes(absl::string_view field, absl::string_view value, size_t limit);
// The same for a size that is not a string (a serialized message).
absl::Status CheckSize(absl::string_view field, size_t size, size_t limit);
// InvalidArgument "FIELD has N entries; the limit is L" when `count` > `limit`.
absl::Status CheckCount(absl::string_view field, int64_t count, int64_t limit);

// A node id (`field` names it): at most kMaxNodeIdBytes, and no control
// characters (a shard's checkpoint writes worker ids one to a line).
absl::Status CheckNodeId(absl::string_view field, absl::string_view id);

// A record-file glob of a job spec (`field` names it in the message): at
// most kMaxPathBytes, relative (each worker resolves it against its
// --data_dir), and with no component that is or can match ".." (the glob
// ".*" matches ".."), so it cannot leave the data directory.
absl::Status CheckDataPath(absl::string_view field, absl::string_view path);

// `text` cut to at most `limit` bytes at a UTF-8 character boundary, ending
// in " [... N bytes cut]" when it was cut. REQUIRES: limit >= 64.
std::string TruncateText(absl::string_view text, size_t limit);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_LIMITS_H_
