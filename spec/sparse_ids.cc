#include "spec/sparse_ids.h"

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"

namespace downpour {

absl::StatusOr<int64_t> SparseRowOf(const SparseTableInfo& table, int64_t id) {
  if (table.hash_ids) {
    const uint64_t mixed = SplitMix64(static_cast<uint64_t>(id) ^ 0x5eedf00dcafe1234ULL);
    return static_cast<int64_t>(mixed % static_cast<uint64_t>(table.vocab_size));
  }
  if (id < 0 || id >= table.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("id ", id, " is outside table ", table.name,
                                                   " (vocab_size ", table.vocab_size,
                                                   "; set hash_ids to hash any id into it)"));
  }
  return id;
}

int SparseShardOf(int64_t row, int num_shards) {
  return static_cast<int>(SplitMix64(static_cast<uint64_t>(row)) %
                          static_cast<uint64_t>(num_shards));
}

}  // namespace downpour
