// Where the rows of a sparse table (spec/model_shape.h SparseTableInfo) are:
// the row an id of the data names, and the shard that holds it. The worker
// (which asks for rows) and the shards (which check what they are asked)
// agree through these. Pure functions; thread-safe.
#ifndef DOWNPOUR_SPEC_SPARSE_IDS_H_
#define DOWNPOUR_SPEC_SPARSE_IDS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "spec/model_shape.h"

namespace downpour {

// The row of `id`: with hash_ids, a 64-bit mix of the id reduced into
// [0, vocab_size); otherwise the id itself, which must lie in [0,
// vocab_size) (InvalidArgument naming the table and the id).
absl::StatusOr<int64_t> SparseRowOf(const SparseTableInfo& table, int64_t id);

// The shard (of `num_shards`) holding `row` of any table: a mix of the row,
// so consecutive rows spread evenly. REQUIRES: num_shards > 0.
int SparseShardOf(int64_t row, int num_shards);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_SPARSE_IDS_H_
