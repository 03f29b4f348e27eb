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
      }
      kept.ids[it->second] = rows[i];
    }
    kept.stamps[it->second] = stamp;
    std::memcpy(kept.values.data() + it->second * dim, values + i * dim, sizeof(float) * dim);
  }
}

void RowCache::Get(int table, const std::vector<int64_t>& rows, float* out) const {
  const Table& kept = tables_[table];
  const int64_t dim = kept.dim;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t place = kept.where.at(rows[i]);
    std::memcpy(out + i * dim, kept.values.data() + place * dim, sizeof(float) * dim);
  }
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
