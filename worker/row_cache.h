// RowCache: the sparse-table rows a worker keeps between steps, for tables
// whose reads may be stale (EmbeddingLayer.embedding_staleness k > 0). Each
// kept row has a stamp: the tables' version it was read at (SYNC) or the
// step it was pulled for (ASYNC/SSP). A step s reads a kept row only while
// its stamp is at least s - k; older rows are pulled again (Missing) and
// dropped once no later step may read them (Drop), so a table keeps the
// rows of about its last k steps.
//
// Thread-compatible; calls for different tables may run concurrently.
#ifndef DOWNPOUR_WORKER_ROW_CACHE_H_
#define DOWNPOUR_WORKER_ROW_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace downpour {

class RowCache {
 public:
  // dims[t]: table t's row width (0: a table that keeps no rows).
  explicit RowCache(std::vector<int64_t> dims);

  // Appends to `missing` the ones of `rows` not kept with a stamp of at
  // least `min_stamp`.
  void Missing(int table, const std::vector<int64_t>& rows, int64_t min_stamp,
               std::vector<int64_t>* missing) const;
  // Keeps `rows` with their `values` (rows.size() * dim floats) and `stamp`,
  // replacing older copies.
  void Put(int table, const std::vector<int64_t>& rows, const float* values, int64_t stamp);
  // Writes the kept values of `rows` to `out` (rows.size() * dim floats).
  // REQUIRES: every row is kept.
  void Get(int table, const std::vector<int64_t>& rows, float* out) const;
  // Forgets the rows stamped before `min_stamp`.
  void Drop(int table, int64_t min_stamp);

  int64_t size(int table) const { return static_cast<int64_t>(tables_[table].where.size()); }

 private:
  struct Table {
    int64_t dim = 0;
    absl::flat_hash_map<int64_t, int64_t> where;  // Row id -> its place.
    // Per place: the values (dim floats), stamp and row id; free places.
    std::vector<float> values;
    std::vector<int64_t> stamps;
    std::vector<int64_t> ids;
    std::vector<int64_t> free;
  };
  std::vector<Table> tables_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_ROW_CACHE_H_
