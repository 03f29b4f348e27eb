// SparseBatch: a training step's sparse work on the worker, between the
// batch's named inputs (data/example.h InputBatch) and the model's input
// (slot-major, spec/model_shape.h InputSlot).
//
// Per sparse table (SparseTableInfo), Plan maps each id of the batch to its
// row (spec/sparse_ids.h), keeps each row once (a step pulls and pushes a row
// once however often the batch reads it) and sorts the rows by the shard
// that holds them. Once the rows are pulled, Pool combines each example's
// rows (SUM or MEAN) into its table's input slot; after the backward pass,
// RowGradients turns the slot's gradient into each row's: the sum over the
// examples reading it of their slot gradient (divided by the example's
// number of ids for MEAN). An example with no ids pools to zeros and gives
// no gradient.
//
// Thread-compatible: a SparseBatch belongs to one step of one trainer; its
// const methods may run concurrently.
#ifndef DOWNPOUR_WORKER_SPARSE_BATCH_H_
#define DOWNPOUR_WORKER_SPARSE_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/work_pool.h"
#include "data/example.h"
#include "model/model.h"
#include "spec/model_shape.h"

namespace downpour {

// Copies the batch's DENSE inputs (`inputs`, one per ModelSpec.inputs) into
// their slots of `features` (batch * input_size floats, slot-major).
// Row ids by [table][shard]: the rows a step reads (SparseBatch::row_ids),
// or those of them a pull asks for.
using RowIds = std::vector<std::vector<std::vector<int64_t>>>;

void PackDenseInputs(const ModelShape& shape, const std::vector<data::InputBatch>& inputs,
                     int64_t batch, float* features);

class SparseBatch {
 public:
  // InvalidArgument naming the table and id for an id outside an exact
  // vocabulary. REQUIRES: inputs holds one InputBatch per shape.inputs, of
  // `batch` examples; num_shards > 0.
  // With `pool` (may be null), the tables are planned on its threads, as
  // Pool and RowGradients run them.
  static absl::StatusOr<SparseBatch> Plan(const ModelShape& shape,
                                          const std::vector<data::InputBatch>& inputs,
                                          int64_t batch, int num_shards, WorkPool* pool = nullptr);

  int64_t batch() const { return batch_; }
  int num_tables() const { return static_cast<int>(tables_.size()); }
  int num_shards() const { return num_shards_; }
  // The distinct rows of `table` held by `shard`, in the order their values
  // are pulled and their gradients pushed.
  const std::vector<int64_t>& rows(int table, int shard) const { return rows_[table][shard]; }
  const RowIds& row_ids() const { return rows_; }
  // Ids the batch read in all (before de-duplication) and distinct rows.
  int64_t ids_read() const;
  int64_t distinct_rows() const;

  // Writes every sparse table's slot of `features` (batch * input_size,
  // slot-major) from the pulled rows: values[table][shard] holds
  // rows(table, shard).size() * dim floats.
  void Pool(const std::vector<std::vector<const float*>>& values, float* features,
            WorkPool* pool = nullptr) const;

  // From the model's input gradient (Model::input_grad, slot-major), each
  // row's gradient: (*grads)[table][shard] is resized to rows(table,
  // shard).size() * dim floats, in the order of rows().
  void RowGradients(const float* input_grad, std::vector<std::vector<std::vector<float>>>* grads,
                    WorkPool* pool = nullptr) const;

  // Pooling on the device instead (Model::PooledStaging): per table, the
  // distinct rows and the ids the batch reads (the block's sizes), then
  // WritePooled fills a table's block with what Pool reads — its rows,
  // `values` shard after shard (none for a table whose block has no
  // values: the device keeps its rows), the examples' ids, each id's row
  // and each row's readers; tables may be written concurrently — and
  // after the step RowGradientsFrom splits the rows' gradients the device
  // computed (PooledRows::grads, in that row order) into RowGradients'
  // [table][shard] (within rounding of RowGradients' sums: the device sums
  // a row's reads in kPoolLanes partial sums).
  std::vector<int32_t> table_rows() const;
  std::vector<int32_t> table_ids() const;
  void WritePooled(int table, const std::vector<const float*>& values, PooledRows* pooled) const;
  void RowGradientsFrom(const std::vector<PooledRows>& pooled,
                        std::vector<std::vector<std::vector<float>>>* grads,
                        WorkPool* pool = nullptr) const;

 private:
  struct Table {
    int64_t dim = 0;
    int64_t slot_offset = 0;  // Of the slot, per example (times batch).
    bool mean = false;
    std::vector<int64_t> offsets;  // The input's, batch + 1.
    // Per id of the input (in order): its row's shard and place there.
    std::vector<int32_t> id_shard;
    std::vector<int32_t> id_place;
  };
  int64_t batch_ = 0;
  int num_shards_ = 0;
  std::vector<Table> tables_;
  RowIds rows_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_SPARSE_BATCH_H_
