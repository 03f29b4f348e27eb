#include "worker/row_cache.h"

#include <cstring>
#include <utility>

namespace downpour {

RowCache::RowCache(std::vector<int64_t> dims) : tables_(dims.size()) {
  for (size_t t = 0; t < dims.size(); ++t) tables_[t].dim = dims[t];
}

void RowCache::Missing(int table, const std::vector<int64_t>& rows, int64_t min_stamp,
                       std::vector<int64_t>* missing) const {
  const Table& kept = tables_[table];
  for (int64_t row : rows) {
    auto it = kept.where.find(row);
    if (it == kept.where.end() || kept.stamps[it->second] < min_stamp) missing->push_back(row);
  }
}

void RowCache::Put(int table, const std::vector<int64_t>& rows, const float* values,
                   int64_t stamp) {
  Table& kept = tables_[table];
  const int64_t dim = kept.dim;
  for (size_t i = 0; i < rows.size(); ++i) {
    auto [it, fresh] = kept.where.try_emplace(rows[i], 0);
    if (fresh) {
      if (!kept.free.empty()) {
        it->second = kept.free.back();
        kept.free.pop_back();
      } else {
        it->second = static_cast<int64_t>(kept.stamps.size());
        kept.stamps.push_back(0);
        kept.ids.push_back(0);
        kept.values.resize(kept.values.size() + dim);
        kept.is_written.push_back(false);
      }
      kept.ids[it->second] = rows[i];
    }
    kept.stamps[it->second] = stamp;
    if (!kept.is_written[it->second]) {
      kept.is_written[it->second] = true;
      kept.written.push_back(static_cast<int32_t>(it->second));
    }
    std::memcpy(kept.values.data() + it->second * dim, values + i * dim, sizeof(float) * dim);
  }
}

void RowCache::Places(int table, const std::vector<int64_t>& rows, int32_t* out) const {
  const Table& kept = tables_[table];
  for (size_t i = 0; i < rows.size(); ++i) out[i] = static_cast<int32_t>(kept.where.at(rows[i]));
}

void RowCache::CopyRows(int table, const int32_t* places, int64_t n, float* out) const {
  const Table& kept = tables_[table];
  const size_t row_bytes = sizeof(float) * kept.dim;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * kept.dim, kept.values.data() + int64_t{places[i]} * kept.dim, row_bytes);
  }
}

void RowCache::TakeWritten(int table, std::vector<int32_t>* places) {
  Table& kept = tables_[table];
  places->swap(kept.written);
  kept.written.clear();
  for (int32_t place : *places) kept.is_written[place] = false;
}

void RowCache::Drop(int table, int64_t min_stamp) {
  Table& kept = tables_[table];
  for (int64_t place = 0; place < static_cast<int64_t>(kept.stamps.size()); ++place) {
    if (kept.stamps[place] >= min_stamp || kept.ids[place] < 0) continue;
    kept.where.erase(kept.ids[place]);
    kept.ids[place] = -1;  // Free (ids are never negative).
    kept.free.push_back(place);
  }
}

}  // namespace downpour
