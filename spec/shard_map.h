// Splits a model's parameter tensors into partitions and places them on
// shards so every shard holds about the same number of bytes.
#ifndef DOWNPOUR_SPEC_SHARD_MAP_H_
#define DOWNPOUR_SPEC_SHARD_MAP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "spec/params.h"

namespace downpour {

inline constexpr int64_t kDefaultPartitionBytes = 256 << 10;

// Partitions of at most `partition_bytes` (float32) per tensor, in tensor
// order, each assigned to one of `num_shards` shards: largest first onto the
// least-loaded shard (balanced bytes). Deterministic for the same input.
// InvalidArgument when there are fewer partitions than shards.
absl::StatusOr<std::vector<PartitionPlacement>> PlacePartitions(
    const std::vector<ParamInfo>& params, int num_shards, int64_t partition_bytes);

// OK when every partition of `partitions` names a tensor of `params`, a
// non-empty element range inside it, and a shard in [0, num_shards), with no
// (tensor, partition) placed twice; else InvalidArgument naming the partition
// ("partition 3/1: ..."). Shards and workers check a placement they are
// handed (a coordinator of another version may have made it) before they
// index tensors with it.
absl::Status CheckPlacement(const std::vector<ParamInfo>& params,
                            const std::vector<PartitionPlacement>& partitions, int num_shards);

// Bytes placed on each shard (for logs, metrics and tests).
std::vector<int64_t> BytesPerShard(const std::vector<PartitionPlacement>& partitions,
                                   int num_shards);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_SHARD_MAP_H_
