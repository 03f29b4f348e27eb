// RowCache: the sparse-table rows a worker keeps between steps, for tables
// whose reads may be stale (EmbeddingLayer.embedding_staleness k > 0). Each
// kept row has a stamp: the tables' version it was read at (SYNC) or the
// step it was pulled for (ASYNC/SSP). A step s reads a kept row only while
// its stamp is at least s - k; older rows are pulled again (Missing) and
// dropped once no later step may read them (Drop), so a table keeps the
// rows of about its last k steps.
//
// A device may hold a copy of the kept rows by place (Model::PooledStaging's
// stored tables): Places says where each row is, and TakeWritten the places
// written since it was last called, whose values (CopyRows) the copy
// lacks.
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
  // Forgets the rows stamped before `min_stamp` (their places are taken by
  // later Puts; until then they keep their values).
  void Drop(int table, int64_t min_stamp);

  // Writes the place of each of `rows` to `out` (CopyRows reads their
  // values). REQUIRES: every row is kept.
  void Places(int table, const std::vector<int64_t>& rows, int32_t* out) const;
  // Copies the values at `n` places, one row after another, to `out`
  // (n * dim floats).
  void CopyRows(int table, const int32_t* places, int64_t n, float* out) const;
  // The places Put wrote since the last TakeWritten (each once), moved to
  // `places` (cleared first).
  void TakeWritten(int table, std::vector<int32_t>* places);
  int64_t written(int table) const { return static_cast<int64_t>(tables_[table].written.size()); }
  // Every place there is (kept or free).
  int64_t places(int table) const { return static_cast<int64_t>(tables_[table].stamps.size()); }

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
    // The places written since TakeWritten, and which those are.
    std::vector<int32_t> written;
    std::vector<bool> is_written;
  };
  std::vector<Table> tables_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_ROW_CACHE_H_
