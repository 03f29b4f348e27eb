// Model's sparse rows pooled on the device (model.h, PooledStaging): the
// block a caller fills and the pooling a step queues from it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/types.h"
#include "model/model.h"
#include "model/model_storage.h"

namespace downpour {

absl::Status Model::GrowRowStore(int table, int64_t places) {
  model_internal::Storage& st = *storage_;
  st.row_stores.resize(shape_.sparse_tables.size());
  kernels::DeviceMemory& store = st.row_stores[table];
  const size_t row_bytes = sizeof(float) * shape_.sparse_tables[table].dim;
  if (store.bytes() >= row_bytes * places) return absl::OkStatus();
  // Room for a quarter more: the cache takes a few more places as steps go.
  ASSIGN_OR_RETURN(kernels::DeviceMemory grown,
                   backend_->Allocate(row_bytes * (places + places / 4)));
  if (store.bytes() > 0) {
    // What it holds, moved (through the host: rare, a store grows a few
    // times in a run) once the steps reading it are done.
    std::vector<char> held(store.bytes());
    RETURN_IF_ERROR(backend_->Synchronize());
    RETURN_IF_ERROR(backend_->ToHost(held.data(), store.as<void>(), held.size()));
    RETURN_IF_ERROR(backend_->ToDevice(grown.as<void>(), held.data(), held.size()));
    RETURN_IF_ERROR(backend_->Synchronize());
  }
  store = std::move(grown);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PooledRows>*> Model::PooledStaging(
    int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
    const std::vector<StoredRows>& stored) {
  const std::vector<SparseTableInfo>& tables = shape_.sparse_tables;
  if (!backend_->gpu() || tables.empty()) return nullptr;
  if (rows.size() != tables.size() || ids.size() != tables.size() || batch < 1 ||
      (!stored.empty() && stored.size() != tables.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("pooled rows: ", rows.size(), ", ", ids.size(), " and ", stored.size(),
                     " table sizes for a batch of ", batch, "; the model has ", tables.size(),
                     " sparse tables"));
  }
  RETURN_IF_ERROR(backend_->MakeCurrent());
  const auto stores = [&](size_t t) { return !stored.empty() && stored[t].places > 0; };
  for (size_t t = 0; t < tables.size(); ++t) {
    if (stores(t)) RETURN_IF_ERROR(GrowRowStore(static_cast<int>(t), stored[t].places));
  }
  // The layout: the tables' descriptors, then each table's arrays, every
  // one 16-byte aligned; the gradients in a block of their own.
  const auto aligned = [](size_t n) { return (n + 15) & ~size_t{15}; };
  struct Place {
    size_t values, offsets, index, row_reads, readers, grads;
    size_t places, fresh_places, fresh_values;  // Stored tables'.
  };
  std::vector<Place> places(tables.size());
  size_t at = aligned(sizeof(kernels::PooledTable) * tables.size());
  size_t grad_at = 0;
  most_pool_work_ = most_grad_work_ = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    const int64_t dim = tables[t].dim;
    Place& p = places[t];
    if (stores(t)) {
      p.places = at;
      at += aligned(sizeof(int32_t) * rows[t]);
      p.fresh_places = at;
      at += aligned(sizeof(int32_t) * stored[t].fresh);
      p.fresh_values = at;
      at += aligned(sizeof(float) * stored[t].fresh * dim);
    } else {
      p.values = at;
      at += aligned(sizeof(float) * rows[t] * dim);
    }
    p.offsets = at;
    at += aligned(sizeof(int32_t) * (batch + 1));
    p.index = at;
    at += aligned(sizeof(int32_t) * ids[t]);
    p.row_reads = at;
    at += aligned(sizeof(int32_t) * (rows[t] + 1));
    p.readers = at;
    at += aligned(sizeof(int32_t) * ids[t]);
    p.grads = grad_at;
    grad_at += aligned(sizeof(float) * rows[t] * dim);
    most_pool_work_ = std::max(most_pool_work_, batch * dim);
    most_grad_work_ = std::max<int64_t>(most_grad_work_, rows[t]);
  }
  model_internal::Storage& st = *storage_;
  if (at > st.pooled_host.bytes() || grad_at > st.pooled_grads.bytes()) {
    // Room for a quarter more: the rows a batch reads vary a little.
    RETURN_IF_ERROR(backend_->Synchronize());
    pooled_batch_ = -1;  // No block until this one is laid out.
    st.pooled_host = {};
    st.pooled = {};
    st.pooled_grads = {};
    st.pooled_grads_host = {};
    const size_t bytes = aligned(at + at / 4), grad_bytes = aligned(grad_at + grad_at / 4);
    ASSIGN_OR_RETURN(st.pooled, backend_->Allocate(bytes));
    ASSIGN_OR_RETURN(st.pooled_host, backend_->AllocateHost(bytes));
    ASSIGN_OR_RETURN(st.pooled_grads, backend_->Allocate(grad_bytes));
    ASSIGN_OR_RETURN(st.pooled_grads_host, backend_->AllocateHost(grad_bytes));
  }
  char* host = st.pooled_host.as<char>();
  char* device = st.pooled.as<char>();
  auto* descriptors = reinterpret_cast<kernels::PooledTable*>(host);
  pooled_.assign(tables.size(), PooledRows());
  for (size_t t = 0; t < tables.size(); ++t) {
    const Place& p = places[t];
    PooledRows& view = pooled_[t];
    view.rows = rows[t];
    view.ids = ids[t];
    view.offsets = reinterpret_cast<int32_t*>(host + p.offsets);
    view.index = reinterpret_cast<int32_t*>(host + p.index);
    view.row_reads = reinterpret_cast<int32_t*>(host + p.row_reads);
    view.readers = reinterpret_cast<int32_t*>(host + p.readers);
    view.grads = reinterpret_cast<const float*>(st.pooled_grads_host.as<char>() + p.grads);
    kernels::PooledTable& d = descriptors[t];
    d = kernels::PooledTable();
    d.dim = tables[t].dim;
    d.slot = batch * shape_.input_slots[tables[t].slot].offset;
    d.mean = tables[t].mean ? 1 : 0;
    d.rows = rows[t];
    if (stores(t)) {
      view.places = reinterpret_cast<int32_t*>(host + p.places);
      view.fresh = stored[t].fresh;
      view.fresh_places = reinterpret_cast<int32_t*>(host + p.fresh_places);
      view.fresh_values = reinterpret_cast<float*>(host + p.fresh_values);
      d.store = st.row_stores[t].as<float>();
      d.places = reinterpret_cast<const int32_t*>(device + p.places);
      d.fresh = stored[t].fresh;
      d.fresh_places = reinterpret_cast<const int32_t*>(device + p.fresh_places);
      d.fresh_values = reinterpret_cast<const float*>(device + p.fresh_values);
    } else {
      view.values = reinterpret_cast<float*>(host + p.values);
      d.values = reinterpret_cast<const float*>(device + p.values);
    }
    d.offsets = reinterpret_cast<const int32_t*>(device + p.offsets);
    d.index = reinterpret_cast<const int32_t*>(device + p.index);
    d.row_reads = reinterpret_cast<const int32_t*>(device + p.row_reads);
    d.readers = reinterpret_cast<const int32_t*>(device + p.readers);
    d.grads = reinterpret_cast<float*>(st.pooled_grads.as<char>() + p.grads);
  }
  pooled_batch_ = batch;
  pooled_bytes_ = at;
  pooled_grad_bytes_ = grad_at;
  return &pooled_;
}

absl::Status Model::PoolStagedRows(int64_t batch) {
  model_internal::Storage& st = *storage_;
  RETURN_IF_ERROR(backend_->PoolRows(batch, static_cast<int>(pooled_.size()),
                                     st.pooled.as<kernels::PooledTable>(), most_pool_work_,
                                     st.features.as<float>()));
  return absl::OkStatus();
}

}  // namespace downpour
