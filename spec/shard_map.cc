#include "spec/shard_map.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<std::vector<PartitionPlacement>> PlacePartitions(
    const std::vector<ParamInfo>& params, int num_shards, int64_t partition_bytes) {
  if (num_shards < 1) return absl::InvalidArgumentError("num_shards must be at least 1");
  const int64_t max_elements = std::max<int64_t>(1, partition_bytes / sizeof(float));
  std::vector<PartitionPlacement> partitions;
  for (const ParamInfo& param : params) {
    int32_t index = 0;
    for (int64_t offset = 0; offset < param.num_elements; offset += max_elements, ++index) {
      PartitionPlacement p;
      p.set_tensor_id(param.id);
      p.set_partition(index);
      p.set_offset(offset);
      p.set_num_elements(std::min(max_elements, param.num_elements - offset));
      partitions.push_back(p);
    }
  }
  if (static_cast<int>(partitions.size()) < num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards (", num_shards, ") exceeds the model's ", partitions.size(),
                     " parameter partitions; use fewer shards or a smaller partition_bytes"));
  }
  std::vector<size_t> order(partitions.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return partitions[a].num_elements() > partitions[b].num_elements();
  });
  std::vector<int64_t> load(num_shards, 0);
  for (size_t i : order) {
    const int shard = std::min_element(load.begin(), load.end()) - load.begin();
    partitions[i].set_shard(shard);
    load[shard] += partitions[i].num_elements();
  }
  return partitions;
}

absl::Status CheckPlacement(const std::vector<ParamInfo>& params,
                            const std::vector<PartitionPlacement>& partitions, int num_shards) {
  std::set<std::pair<int32_t, int32_t>> seen;
  for (const PartitionPlacement& p : partitions) {
    const std::string name = absl::StrCat("partition ", p.tensor_id(), "/", p.partition());
    if (p.tensor_id() < 0 || p.tensor_id() >= static_cast<int64_t>(params.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": tensor_id out of range [0, ", params.size(), ")"));
    }
    const ParamInfo& param = params[p.tensor_id()];
    if (p.num_elements() <= 0 || p.offset() < 0 ||
        p.offset() + p.num_elements() > param.num_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": range [", p.offset(), ", ", p.offset() + p.num_elements(),
          ") is not inside tensor ", param.name, " of ", param.num_elements, " elements"));
    }
    if (p.shard() < 0 || p.shard() >= num_shards) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": shard ", p.shard(), " is outside [0, ", num_shards, ")"));
    }
    if (!seen.insert({p.tensor_id(), p.partition()}).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is placed twice"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> BytesPerShard(const std::vector<PartitionPlacement>& partitions,
                                   int num_shards) {
  std::vector<int64_t> bytes(num_shards, 0);
  for (const auto& p : partitions) {
    if (p.shard() >= 0 && p.shard() < num_shards) {
      bytes[p.shard()] += p.num_elements() * static_cast<int64_t>(sizeof(float));
    }
  }
  return bytes;
}

}  // namespace downpour
