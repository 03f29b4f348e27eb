#include "worker/sparse_batch.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "spec/sparse_ids.h"

namespace downpour {

void PackDenseInputs(const ModelShape& shape, const std::vector<data::InputBatch>& inputs,
                     int64_t batch, float* features) {
  for (const InputSlot& slot : shape.input_slots) {
    if (slot.input < 0) continue;
    const std::vector<float>& values = inputs[slot.input].values;
    std::memcpy(features + batch * slot.offset, values.data(), sizeof(float) * batch * slot.width);
  }
}

absl::StatusOr<SparseBatch> SparseBatch::Plan(const ModelShape& shape,
                                              const std::vector<data::InputBatch>& inputs,
                                              int64_t batch, int num_shards, WorkPool* pool) {
  SparseBatch plan;
  plan.batch_ = batch;
  plan.num_shards_ = num_shards;
  const int tables = static_cast<int>(shape.sparse_tables.size());
  plan.tables_.resize(tables);
  plan.rows_.resize(tables);
  std::vector<absl::Status> planned(tables);
  WorkPool::ForEach(pool, tables, [&](int t) {
    const SparseTableInfo& info = shape.sparse_tables[t];
    const data::InputBatch& input = inputs[info.input];
    Table& table = plan.tables_[t];
    table.dim = info.dim;
    table.slot_offset = shape.input_slots[info.slot].offset;
    table.mean = info.mean;
    table.offsets = input.offsets;
    std::vector<std::vector<int64_t>>& shard_rows = plan.rows_[t];
    shard_rows.resize(num_shards);
    table.id_shard.resize(input.ids.size());
    table.id_place.resize(input.ids.size());
    absl::flat_hash_map<int64_t, int64_t> seen;  // Row -> shard << 32 | place.
    seen.reserve(input.ids.size());
    for (size_t k = 0; k < input.ids.size(); ++k) {
      absl::StatusOr<int64_t> row = SparseRowOf(info, input.ids[k]);
      if (!row.ok()) {
        planned[t] = row.status();
        return;
      }
      auto [it, fresh] = seen.try_emplace(*row, 0);
      if (fresh) {
        const int shard = SparseShardOf(*row, num_shards);
        std::vector<int64_t>& rows = shard_rows[shard];
        it->second = (static_cast<int64_t>(shard) << 32) | static_cast<int64_t>(rows.size());
        rows.push_back(*row);
      }
      table.id_shard[k] = static_cast<int32_t>(it->second >> 32);
      table.id_place[k] = static_cast<int32_t>(it->second & 0xffffffff);
    }
  });
  for (const absl::Status& status : planned) RETURN_IF_ERROR(status);
  return plan;
}

int64_t SparseBatch::ids_read() const {
  int64_t n = 0;
  for (const Table& t : tables_) n += static_cast<int64_t>(t.id_shard.size());
  return n;
}

int64_t SparseBatch::distinct_rows() const {
  int64_t n = 0;
  for (const auto& table : rows_) {
    for (const auto& rows : table) n += static_cast<int64_t>(rows.size());
  }
  return n;
}

void SparseBatch::Pool(const std::vector<std::vector<const float*>>& values, float* features,
                       WorkPool* pool) const {
  WorkPool::ForEach(pool, num_tables(), [&](int t) {
    const Table& table = tables_[t];
    const int64_t dim = table.dim;
    float* slot = features + batch_ * table.slot_offset;
    std::fill(slot, slot + batch_ * dim, 0.f);
    const std::vector<int64_t>& offsets = table.offsets;
    for (int64_t b = 0; b < batch_; ++b) {
      float* out = slot + b * dim;
      for (int64_t k = offsets[b]; k < offsets[b + 1]; ++k) {
        const float* row = values[t][table.id_shard[k]] + int64_t{table.id_place[k]} * dim;
        for (int64_t d = 0; d < dim; ++d) out[d] += row[d];
      }
      const int64_t count = offsets[b + 1] - offsets[b];
      if (table.mean && count > 1) {
        const float inv = 1.f / static_cast<float>(count);
        for (int64_t d = 0; d < dim; ++d) out[d] *= inv;
      }
    }
  });
}

void SparseBatch::RowGradients(const float* input_grad,
                               std::vector<std::vector<std::vector<float>>>* grads,
                               WorkPool* pool) const {
  grads->resize(tables_.size());
  WorkPool::ForEach(pool, num_tables(), [&](int t) {
    const Table& table = tables_[t];
    const int64_t dim = table.dim;
    std::vector<std::vector<float>>& out = (*grads)[t];
    out.resize(num_shards_);
    for (int s = 0; s < num_shards_; ++s) out[s].assign(rows_[t][s].size() * dim, 0.f);
    const float* slot = input_grad + batch_ * table.slot_offset;
    const std::vector<int64_t>& offsets = table.offsets;
    for (int64_t b = 0; b < batch_; ++b) {
      const float* g = slot + b * dim;
      const int64_t count = offsets[b + 1] - offsets[b];
      const float scale = table.mean && count > 1 ? 1.f / static_cast<float>(count) : 1.f;
      for (int64_t k = offsets[b]; k < offsets[b + 1]; ++k) {
        float* row = out[table.id_shard[k]].data() + int64_t{table.id_place[k]} * dim;
        for (int64_t d = 0; d < dim; ++d) row[d] += scale * g[d];
      }
    }
  });
}

std::vector<int32_t> SparseBatch::table_rows() const {
  std::vector<int32_t> rows;
  for (const auto& table : rows_) {
    int64_t n = 0;
    for (const auto& shard : table) n += static_cast<int64_t>(shard.size());
    rows.push_back(static_cast<int32_t>(n));
  }
  return rows;
}

std::vector<int32_t> SparseBatch::table_ids() const {
  std::vector<int32_t> ids;
  for (const Table& t : tables_) ids.push_back(static_cast<int32_t>(t.id_shard.size()));
  return ids;
}

void SparseBatch::WritePooled(int t, const std::vector<const float*>& values,
                              PooledRows* pooled) const {
  const Table& table = tables_[t];
  PooledRows& out = *pooled;
  // Shard s's rows start at base[s] of the table's.
  std::vector<int32_t> base(num_shards_ + 1, 0);
  for (int s = 0; s < num_shards_; ++s) {
    const size_t n = rows_[t][s].size();
    base[s + 1] = base[s] + static_cast<int32_t>(n);
    if (n > 0 && out.values != nullptr) {
      std::memcpy(out.values + int64_t{base[s]} * table.dim, values[s],
                  sizeof(float) * n * table.dim);
    }
  }
  for (int64_t b = 0; b <= batch_; ++b) out.offsets[b] = static_cast<int32_t>(table.offsets[b]);
  const int32_t rows = base[num_shards_];
  const int64_t ids = static_cast<int64_t>(table.id_shard.size());
  // Each row's readers in id order: counted, then placed (row_reads[r]
  // advances to where row r + 1's start, and is moved back after).
  std::fill(out.row_reads, out.row_reads + rows + 1, 0);
  for (int64_t k = 0; k < ids; ++k) {
    out.index[k] = base[table.id_shard[k]] + table.id_place[k];
    ++out.row_reads[out.index[k] + 1];
  }
  for (int32_t r = 0; r < rows; ++r) out.row_reads[r + 1] += out.row_reads[r];
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t k = table.offsets[b]; k < table.offsets[b + 1]; ++k) {
      out.readers[out.row_reads[out.index[k]]++] = static_cast<int32_t>(b);
    }
  }
  for (int32_t r = rows; r > 0; --r) out.row_reads[r] = out.row_reads[r - 1];
  out.row_reads[0] = 0;
}

void SparseBatch::RowGradientsFrom(const std::vector<PooledRows>& pooled,
                                   std::vector<std::vector<std::vector<float>>>* grads,
                                   WorkPool* pool) const {
  grads->resize(tables_.size());
  WorkPool::ForEach(pool, num_tables(), [&](int t) {
    const int64_t dim = tables_[t].dim;
    std::vector<std::vector<float>>& out = (*grads)[t];
    out.resize(num_shards_);
    const float* from = pooled[t].grads;
    for (int s = 0; s < num_shards_; ++s) {
      const int64_t n = static_cast<int64_t>(rows_[t][s].size()) * dim;
      out[s].assign(from, from + n);
      from += n;
    }
  });
}

}  // namespace downpour
