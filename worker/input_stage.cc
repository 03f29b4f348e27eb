#include "worker/input_stage.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"

namespace downpour {

InputStage::InputStage(const ModelShape& shape, ExchangeOptions options,
                       std::vector<ParameterShard*> shards, std::function<bool()> cancelled,
                       int table_threads, bool sync)
    : shape_(shape),
      num_shards_(static_cast<int>(shards.size())),
      cancelled_(std::move(cancelled)),
      tables_(shape.sparse_tables.empty() ? 0 : table_threads, "input-tables"),
      planner_(shape.sparse_tables.empty() ? 0 : 1, "input-planner"),
      sync_(sync) {
  if (shape.sparse_tables.empty()) return;
  std::vector<int64_t> dims;  // Of the kept tables' rows (0: not kept).
  size_t kept = 0;
  for (const SparseTableInfo& table : shape.sparse_tables) {
    dims.push_back(table.staleness > 0 ? table.dim : 0);
    if (table.staleness <= 0) continue;
    min_staleness_ = kept++ == 0 ? table.staleness : std::min(min_staleness_, table.staleness);
  }
  keeps_rows_ = kept > 0;
  all_kept_ = kept == shape.sparse_tables.size();
  depth_ = all_kept_ ? 2 : 1;
  if (keeps_rows_) {
    cache_ = std::make_unique<RowCache>(std::move(dims));
    prefetch_ = std::make_unique<SparseExchange>(shape, options, shards);
    kept_values_.resize(shape.sparse_tables.size());
    kept_places_.resize(shape.sparse_tables.size());
    written_.resize(shape.sparse_tables.size());
  }
  exchange_ = std::make_unique<SparseExchange>(shape, options, shards);
  // Evaluations pull on a lane of their own: the push lane may hold the
  // next training batch's rows.
  eval_ = std::make_unique<SparseExchange>(shape, std::move(options), std::move(shards));
}

InputStage::Rows InputStage::TrainingRows(const SparseBatch& plan, bool gather) {
  if (!keeps_rows_) return exchange_->rows();
  Rows rows(shape_.sparse_tables.size());
  for (size_t t = 0; t < rows.size(); ++t) {
    if (shape_.sparse_tables[t].staleness <= 0) rows[t] = exchange_->rows()[t];
  }
  if (!gather) return rows;
  WorkPool::ForEach(&tables_, plan.num_tables(), [&](int t) {
    if (shape_.sparse_tables[t].staleness <= 0) return;
    const int64_t dim = shape_.sparse_tables[t].dim;
    const int32_t* place = kept_places_[t].data();
    kept_values_[t].resize(num_shards_);
    for (int s = 0; s < num_shards_; ++s) {
      const int64_t n = static_cast<int64_t>(plan.rows(t, s).size());
      std::vector<float>& out = kept_values_[t][s];
      out.resize(n * dim);
      cache_->CopyRows(t, place, n, out.data());
      place += n;
      rows[t].push_back(out.data());
    }
  });
  return rows;
}

absl::Status InputStage::WriteStored(int t, PooledRows* block) {
  if (static_cast<int64_t>(kept_places_[t].size()) != block->rows ||
      cache_->written(t) != block->fresh) {
    return absl::InternalError(
        absl::StrCat("table ", shape_.sparse_tables[t].name, ": a block for ", block->rows,
                     " rows and ", block->fresh, " written, but the step reads ",
                     kept_places_[t].size(), " and ", cache_->written(t), " were written"));
  }
  std::copy(kept_places_[t].begin(), kept_places_[t].end(), block->places);
  cache_->TakeWritten(t, &written_[t]);
  std::copy(written_[t].begin(), written_[t].end(), block->fresh_places);
  cache_->CopyRows(t, written_[t].data(), block->fresh, block->fresh_values);
  return absl::OkStatus();
}

void InputStage::PackInto(const data::Batch& batch, const SparseBatch* plan, const Rows& rows,
                          float* features) {
  PackDenseInputs(shape_, batch.inputs, batch.size, features);
  if (plan != nullptr) plan->Pool(rows, features, &tables_);
}

float* InputStage::Destination(const data::Batch& batch, float* staging,
                               std::vector<float>* features) {
  if (staging != nullptr) return staging;
  features->resize(batch.size * shape_.input_size);
  return features->data();
}

absl::StatusOr<const float*> InputStage::TimedPack(const data::Batch& batch,
                                                   const SparseBatch* plan, float* staging,
                                                   const PoolOnDevice& pool_on_device,
                                                   const Planned* ahead) {
  const double began = MonotonicSeconds();
  absl::StatusOr<const float*> packed = Pack(batch, plan, staging, pool_on_device, ahead);
  lay_seconds_ += MonotonicSeconds() - began;
  return packed;
}

void InputStage::LayReads(Planned* p) {
  const SparseBatch& plan = *p->planned;
  const std::vector<int32_t> rows = plan.table_rows(), ids = plan.table_ids();
  p->reads.resize(plan.num_tables());
  WorkPool::ForEach(&tables_, plan.num_tables(), [&](int t) {
    Planned::Reads& reads = p->reads[t];
    reads.offsets.resize(plan.batch() + 1);
    reads.index.resize(ids[t]);
    reads.row_reads.resize(rows[t] + 1);
    reads.readers.resize(ids[t]);
    PooledRows view;
    view.rows = rows[t];
    view.ids = ids[t];
    view.offsets = reads.offsets.data();
    view.index = reads.index.data();
    view.row_reads = reads.row_reads.data();
    view.readers = reads.readers.data();
    plan.WritePooled(t, {}, &view);
  });
}

absl::StatusOr<const float*> InputStage::Pack(const data::Batch& batch, const SparseBatch* plan,
                                              float* staging, const PoolOnDevice& pool_on_device,
                                              const Planned* ahead) {
  float* features = Destination(batch, staging, &features_);
  if (plan != nullptr && staging != nullptr && pool_on_device != nullptr) {
    // Kept tables' rows stay on the device: the block carries the rows
    // written since the last one.
    std::vector<StoredRows> stored;
    if (keeps_rows_) {
      stored.resize(shape_.sparse_tables.size());
      for (size_t t = 0; t < stored.size(); ++t) {
        if (shape_.sparse_tables[t].staleness <= 0) continue;
        stored[t].places = cache_->places(t);
        stored[t].fresh = static_cast<int32_t>(cache_->written(t));
      }
    }
    const double began = MonotonicSeconds();
    absl::StatusOr<std::vector<PooledRows>*> block =
        pool_on_device(batch.size, plan->table_rows(), plan->table_ids(), stored);
    block_seconds_ += MonotonicSeconds() - began;
    // No room on the device for the block: this step pools here (the rows
    // written stay to be sent with the next block).
    if (!block.ok() && !absl::IsResourceExhausted(block.status())) return block.status();
    pooled_ = block.ok() ? *block : nullptr;
    if (pooled_ != nullptr) {
      PackDenseInputs(shape_, batch.inputs, batch.size, features);
      // Laid out ahead only where every table keeps its rows (no values
      // to write).
      const bool laid = ahead != nullptr && !ahead->reads.empty();
      const Rows rows = laid ? Rows() : TrainingRows(*plan, /*gather=*/false);
      std::vector<absl::Status> written(plan->num_tables());
      WorkPool::ForEach(&tables_, plan->num_tables(), [&](int t) {
        PooledRows& out = (*pooled_)[t];
        if (laid) {
          const Planned::Reads& reads = ahead->reads[t];
          std::copy(reads.offsets.begin(), reads.offsets.end(), out.offsets);
          std::copy(reads.index.begin(), reads.index.end(), out.index);
          std::copy(reads.row_reads.begin(), reads.row_reads.end(), out.row_reads);
          std::copy(reads.readers.begin(), reads.readers.end(), out.readers);
        } else {
          plan->WritePooled(t, rows[t], &out);
        }
        if (shape_.sparse_tables[t].staleness > 0) written[t] = WriteStored(t, &out);
      });
      for (absl::Status& status : written) RETURN_IF_ERROR(status);
      for (const StoredRows& table : stored) rows_to_device_ += table.fresh;
      return features;
    }
  }
  PackInto(batch, plan, plan != nullptr ? TrainingRows(*plan, /*gather=*/true) : Rows(), features);
  return features;
}

const RowIds* InputStage::PushLaneRows(const SparseBatch* plan) {
  if (plan == nullptr || !keeps_rows_) return plan == nullptr ? nullptr : &plan->row_ids();
  // Kept tables' rows come on the prefetch lane.
  push_pull_ids_.resize(shape_.sparse_tables.size());
  for (size_t t = 0; t < push_pull_ids_.size(); ++t) {
    const bool kept = shape_.sparse_tables[t].staleness > 0;
    push_pull_ids_[t].resize(num_shards_);
    for (int s = 0; s < num_shards_; ++s) {
      if (kept) {
        push_pull_ids_[t][s].clear();
      } else {
        push_pull_ids_[t][s] = plan->rows(t, s);
      }
    }
  }
  return &push_pull_ids_;
}

void InputStage::Prefetch(const SparseBatch& plan, int64_t step, int64_t min_version,
                          int64_t min_worker_steps) {
  const int tables = plan.num_tables();
  prefetched_.assign(tables, std::vector<std::vector<int64_t>>(num_shards_));
  WorkPool::ForEach(&tables_, tables, [&](int t) {
    if (shape_.sparse_tables[t].staleness <= 0) return;
    for (int s = 0; s < num_shards_; ++s) {
      cache_->Missing(t, plan.rows(t, s), MinStamp(t, step), &prefetched_[t][s]);
    }
  });
  prefetch_step_ = step;
  // SYNC: the rows may be min_staleness_ steps behind the step's version.
  prefetch_->Begin(0, nullptr, nullptr, &prefetched_,
                   std::max<int64_t>(0, min_version - min_staleness_), min_worker_steps,
                   cancelled_);
}

absl::Status InputStage::TakePrefetched(const SparseBatch& plan, int64_t step) {
  RETURN_IF_ERROR(prefetch_->Finish());
  if (prefetch_step_ != step) {
    return absl::InternalError(
        absl::StrCat("the rows prefetched were for step ", prefetch_step_, ", not ", step));
  }
  // The rows have every update up to the tables' version (SYNC), or were
  // pulled for this step.
  const int64_t stamp = sync_ ? prefetch_->pulled_version() : step;
  const std::vector<std::vector<const float*>>& pulled = prefetch_->rows();
  std::vector<int64_t> kept(plan.num_tables(), 0);
  WorkPool::ForEach(&tables_, plan.num_tables(), [&](int t) {
    if (shape_.sparse_tables[t].staleness <= 0) return;
    // No step from this one on reads a row older than its limit; the step
    // before (which may read older ones) has its input: pooled, or its
    // block laid out with the rows the device lacked (a place freed here
    // changes on the device only with this step's block, after that
    // step's pooling).
    cache_->Drop(t, MinStamp(t, step));
    std::vector<int32_t>& places = kept_places_[t];
    places.resize(0);
    for (int s = 0; s < num_shards_; ++s) {
      cache_->Put(t, prefetched_[t][s], pulled[t][s], stamp);
      const std::vector<int64_t>& rows = plan.rows(t, s);
      kept[t] += static_cast<int64_t>(rows.size() - prefetched_[t][s].size());
      places.resize(places.size() + rows.size());
      cache_->Places(t, rows, places.data() + places.size() - rows.size());
    }
  });
  for (int64_t n : kept) rows_kept_ += n;
  prefetch_step_ = -1;
  return absl::OkStatus();
}

absl::StatusOr<const float*> InputStage::Features(int64_t step, const data::Batch& batch,
                                                  int64_t min_version, int64_t min_worker_steps,
                                                  bool exact_version, float* staging,
                                                  const PoolOnDevice& pool_on_device) {
  pooled_ = nullptr;
  if (exchange_ == nullptr) return Pack(batch, nullptr, staging);
  if (next_pulled_) {
    next_pulled_ = false;
    // With kept tables only, the push lane's answer is waited for by the
    // next push, not by this step.
    if (!all_kept_) RETURN_IF_ERROR(exchange_->Finish());
    std::swap(current_, next_);
    const std::shared_ptr<Planned> planned = std::move(next_planned_);
    if (keeps_rows_) {
      if (planned != nullptr) {
        // Its rows may have been taken by its own task (one ahead) or by
        // the next batch's (two ahead: that one is waited for).
        if (depth_ == 2) AwaitPlan();
        RETURN_IF_ERROR(planned->taken);
        if (planned->ahead == Ahead::kPooled) {
          std::swap(features_, next_features_);
          return features_.data();
        }
      }
      if (planned == nullptr || planned->ahead == Ahead::kPlanned) {
        RETURN_IF_ERROR(TakePrefetched(*current_, step));
      }
    }
    return TimedPack(batch, current_.get(), staging, pool_on_device, planned.get());
  }
  AwaitPlan();
  RETURN_IF_ERROR(exchange_->Finish());
  ASSIGN_OR_RETURN(SparseBatch plan,
                   SparseBatch::Plan(shape_, batch.inputs, batch.size, num_shards_, &tables_));
  current_ = std::make_unique<SparseBatch>(std::move(plan));
  // Kept tables' rows through the prefetch lane (into the cache), the
  // others' on the push lane, at once.
  if (keeps_rows_) {
    RETURN_IF_ERROR(prefetch_->Finish());
    Prefetch(*current_, step, min_version, min_worker_steps);
  }
  exchange_->Begin(0, nullptr, nullptr, PushLaneRows(current_.get()), min_version, min_worker_steps,
                   cancelled_, /*read_only=*/false, /*checkpoint_step=*/0, exact_version);
  if (keeps_rows_) RETURN_IF_ERROR(TakePrefetched(*current_, step));
  RETURN_IF_ERROR(exchange_->Finish());
  return TimedPack(batch, current_.get(), staging, pool_on_device);
}

absl::StatusOr<int64_t> InputStage::TablesVersion() {
  RETURN_IF_ERROR(exchange_->Finish());
  const RowIds none(shape_.sparse_tables.size(), std::vector<std::vector<int64_t>>(num_shards_));
  exchange_->Begin(0, nullptr, nullptr, &none, /*min_version=*/0, /*min_worker_steps=*/0,
                   cancelled_, /*read_only=*/true);
  RETURN_IF_ERROR(exchange_->Finish());
  return exchange_->pulled_version();
}

InputStage::~InputStage() {
  AwaitPlan();
  // An exchange still in flight reads the plans and gradients destroyed
  // before it (current_, next_, grads_ are members after exchange_): it is
  // finished first. Without this a worker whose job ended mid-exchange
  // crashed in SparseExchange::Finish (SIGSEGV, three times in an hour of
  // bench/chaos.py).
  if (exchange_ != nullptr) (void)exchange_->Finish();
  if (prefetch_ != nullptr) (void)prefetch_->Finish();
  if (eval_ != nullptr) (void)eval_->Finish();
}

void InputStage::AwaitPlan() {
  // The planner runs its tasks in turn: the last one started is the last
  // to end (a task no longer queued here is done: Exchange waited for it).
  if (!planned_.empty()) planned_.back()->done.WaitForNotification();
}

void InputStage::AwaitBatch() {
  if (depth_ == 2 && last_pool_here_) AwaitPlan();
}

void InputStage::PlanAhead(int64_t step, const data::Batch* next, int64_t min_version,
                           int64_t min_worker_steps) {
  if (exchange_ == nullptr) return;
  // One batch ahead: the last one's task is done first, as its plan is.
  if (depth_ == 1) AwaitPlan();
  auto planned = std::make_shared<Planned>();
  planned->step = step;
  planned->batch = next;
  // Two ahead, the task also takes the rows of the batch planned before
  // this one (their pull begun by its task, a step earlier).
  std::shared_ptr<Planned> before = depth_ == 2 && !planned_.empty() ? planned_.back() : nullptr;
  // A step whose rows went to the device for pooling: the next one's will
  // too (laid out in the block once this step has uploaded it).
  const bool pool_here = pooled_ == nullptr;
  last_pool_here_ = pool_here;
  const auto work = [this, planned = planned.get(), before, min_version, min_worker_steps,
                     pool_here] {
    const int64_t step = planned->step;
    const data::Batch& batch = *planned->batch;
    Laps laps;
    absl::StatusOr<SparseBatch> plan =
        SparseBatch::Plan(shape_, batch.inputs, batch.size, num_shards_, &tables_);
    laps.Add(&ahead_.plan);
    ++ahead_.batches;
    if (plan.ok()) {
      planned->plan = std::make_unique<SparseBatch>(*std::move(plan));
      planned->planned = planned->plan.get();
    } else {
      planned->status = plan.status();
    }
    if (!keeps_rows_) return;
    // Takes p's rows from the prefetch lane into the cache and, unless the
    // device pools them, pools p's input.
    auto take = [&](Planned* p) {
      absl::Status taken = prefetch_->Finish();
      laps.Add(&ahead_.pull);
      if (taken.ok()) taken = TakePrefetched(*p->planned, p->step);
      laps.Add(&ahead_.cache);
      p->taken = taken;
      if (!taken.ok()) return;
      ++ahead_.taken;
      p->ahead = Ahead::kTaken;
      if (!pool_here) {
        // The device pools it: its block's reads laid out here.
        LayReads(p);
        laps.Add(&ahead_.pool);
        return;
      }
      PackInto(*p->batch, p->planned, TrainingRows(*p->planned, /*gather=*/true),
               Destination(*p->batch, nullptr, &next_features_));
      laps.Add(&ahead_.pool);
      ++ahead_.pooled;
      p->ahead = Ahead::kPooled;
    };
    // Two ahead: the batch before's rows, pulled beside the step before.
    if (before != nullptr && before->planned != nullptr && prefetch_step_ == before->step) {
      take(before.get());
    }
    if (planned->planned == nullptr) return;
    // A pull no step will take (none should be left): ended, not
    // overlapped by a second on the same lane.
    if (prefetch_step_ >= 0) (void)prefetch_->Finish();
    Prefetch(*planned->planned, step, min_version, min_worker_steps);
    laps.Add(&ahead_.cache);
    // One ahead with every table kept: this batch's rows are all on the
    // prefetch lane, taken here while the step computes.
    if (all_kept_ && depth_ == 1) take(planned);
  };
  (void)planner_.Start(1, [work, planned](int) {
    work();
    planned->done.Notify();
  });
  planned_.push_back(std::move(planned));
}

absl::Status InputStage::Exchange(int64_t step, const Model& model, const data::Batch* next,
                                  int64_t min_version, int64_t min_worker_steps,
                                  int64_t checkpoint_step) {
  if (exchange_ == nullptr) return absl::OkStatus();
  // The last push's answer (kept tables: the shards applied that step); it
  // sent grads_ and the plan now in next_.
  RETURN_IF_ERROR(exchange_->Finish());
  if (pooled_ != nullptr) {
    current_->RowGradientsFrom(*pooled_, &grads_, &tables_);
    pooled_ = nullptr;
  } else {
    current_->RowGradients(model.input_grad(), &grads_, &tables_);
  }
  next_.reset();
  next_planned_.reset();
  // The plan of `next` (step + 1's), made ahead: the oldest not yet taken.
  std::shared_ptr<Planned> planned;
  if (next != nullptr && !planned_.empty() && planned_.front()->batch == next &&
      planned_.front()->step == step + 1) {
    planned = std::move(planned_.front());
    planned_.pop_front();
  }
  if (planned != nullptr) {
    // Its task, not the ones after it (they run beside the steps).
    planned->done.WaitForNotification();
    RETURN_IF_ERROR(planned->status);
    next_ = std::move(planned->plan);
    next_planned_ = std::move(planned);
  } else {
    // Nothing (or another batch) planned ahead: every task ends first, and
    // what they took is not next's.
    AwaitPlan();
    planned_.clear();
    if (next != nullptr) {
      ASSIGN_OR_RETURN(SparseBatch plan,
                       SparseBatch::Plan(shape_, next->inputs, next->size, num_shards_, &tables_));
      next_ = std::make_unique<SparseBatch>(std::move(plan));
      if (keeps_rows_) {
        RETURN_IF_ERROR(prefetch_->Finish());
        Prefetch(*next_, step + 1, min_version, min_worker_steps);
      }
    }
  }
  exchange_->Begin(step, current_.get(), &grads_, PushLaneRows(next_.get()), min_version,
                   min_worker_steps, cancelled_, /*read_only=*/false, checkpoint_step);
  next_pulled_ = next != nullptr;
  return absl::OkStatus();
}

absl::Status InputStage::Finish() {
  AwaitPlan();
  absl::Status status = exchange_ == nullptr ? absl::OkStatus() : exchange_->Finish();
  if (prefetch_ != nullptr) status.Update(prefetch_->Finish());
  return status;
}

void InputStage::NewEvaluation() {
  EndEvaluation();
  eval_rows_read_ = eval_rows_pulled_ = 0;
}

void InputStage::EndEvaluation() {
  eval_cache_.reset();
  eval_values_ = {};
  eval_rows_ = {};
  eval_missing_ = {};
}

absl::Status InputStage::BeginEvalFeatures(const data::Batch& batch, int64_t min_version,
                                           int64_t min_worker_steps) {
  if (exchange_ == nullptr) return absl::OkStatus();
  // A pull left by an evaluation that failed midway is not waited for.
  (void)eval_->Finish();
  eval_plan_.reset();
  eval_awaited_ = false;
  ASSIGN_OR_RETURN(SparseBatch plan,
                   SparseBatch::Plan(shape_, batch.inputs, batch.size, num_shards_, &tables_));
  eval_plan_ = std::make_unique<SparseBatch>(std::move(plan));
  const int tables = eval_plan_->num_tables();
  // A row pulled for one test batch serves the evaluation's later ones.
  // Past eval_cache_bytes_ (its values and about kEvalRowBytes more a row of
  // the cache's own) the kept rows go: tables larger than that are pulled
  // again, batch by batch.
  int64_t kept_bytes = 0;
  if (eval_cache_ != nullptr) {
    for (int t = 0; t < tables; ++t) {
      kept_bytes +=
          eval_cache_->places(t) *
          (shape_.sparse_tables[t].dim * static_cast<int64_t>(sizeof(float)) + kEvalRowBytes);
    }
  }
  if (eval_cache_ == nullptr || kept_bytes > eval_cache_bytes_) {
    std::vector<int64_t> dims;
    for (const SparseTableInfo& table : shape_.sparse_tables) dims.push_back(table.dim);
    eval_cache_ = std::make_unique<RowCache>(std::move(dims));
  }
  eval_missing_.assign(tables, std::vector<std::vector<int64_t>>(num_shards_));
  WorkPool::ForEach(&tables_, tables, [&](int t) {
    for (int s = 0; s < num_shards_; ++s) {
      eval_cache_->Missing(t, eval_plan_->rows(t, s), /*min_stamp=*/0, &eval_missing_[t][s]);
    }
  });
  for (int t = 0; t < tables; ++t) {
    for (int s = 0; s < num_shards_; ++s) {
      eval_rows_read_ += static_cast<int64_t>(eval_plan_->rows(t, s).size());
      eval_rows_pulled_ += static_cast<int64_t>(eval_missing_[t][s].size());
    }
  }
  eval_->Begin(0, nullptr, nullptr, &eval_missing_, min_version, min_worker_steps, cancelled_,
               /*read_only=*/true);
  return absl::OkStatus();
}

absl::Status InputStage::AwaitEvalRows() {
  if (exchange_ == nullptr || eval_awaited_) return absl::OkStatus();
  if (eval_plan_ == nullptr) {
    return absl::FailedPreconditionError("AwaitEvalRows without BeginEvalFeatures");
  }
  if (absl::Status pulled = eval_->Finish(); !pulled.ok()) {
    // The batch is not to be laid out (nor its pull awaited again: a second
    // Finish would find nothing in flight and no rows).
    eval_plan_.reset();
    return pulled;
  }
  // The rows pulled are kept; then the batch's rows, each table's by shard
  // in the plan's order, are copied out of the kept ones.
  const SparseBatch& plan = *eval_plan_;
  const int tables = plan.num_tables();
  eval_rows_.resize(tables);
  eval_values_.resize(tables);
  std::vector<std::vector<int32_t>> places(tables);
  WorkPool::ForEach(&tables_, tables, [&](int t) {
    const int64_t dim = shape_.sparse_tables[t].dim;
    eval_rows_[t].resize(num_shards_);
    eval_values_[t].resize(num_shards_);
    for (int s = 0; s < num_shards_; ++s) {
      eval_cache_->Put(t, eval_missing_[t][s], eval_->rows()[t][s], /*stamp=*/0);
    }
    for (int s = 0; s < num_shards_; ++s) {
      const std::vector<int64_t>& rows = plan.rows(t, s);
      const int64_t n = static_cast<int64_t>(rows.size());
      places[t].resize(n);
      eval_cache_->Places(t, rows, places[t].data());
      std::vector<float>& values = eval_values_[t][s];
      values.resize(n * dim);
      eval_cache_->CopyRows(t, places[t].data(), n, values.data());
      eval_rows_[t][s] = values.data();
    }
  });
  eval_awaited_ = true;
  return absl::OkStatus();
}

absl::StatusOr<const float*> InputStage::EvalFeatures(const data::Batch& batch, float* staging,
                                                      std::vector<float>* storage,
                                                      const PoolOnDevice& pool_on_device,
                                                      bool* on_device) {
  if (on_device != nullptr) *on_device = false;
  float* features = Destination(batch, staging, storage);
  if (exchange_ == nullptr) return Pack(batch, nullptr, features);
  if (eval_plan_ == nullptr) {
    return absl::FailedPreconditionError("EvalFeatures without BeginEvalFeatures");
  }
  RETURN_IF_ERROR(AwaitEvalRows());
  const std::unique_ptr<SparseBatch> plan = std::move(eval_plan_);
  // Pooled on the device where it has room for the block.
  if (staging != nullptr && pool_on_device != nullptr && on_device != nullptr) {
    absl::StatusOr<std::vector<PooledRows>*> block =
        pool_on_device(batch.size, plan->table_rows(), plan->table_ids(), {});
    if (!block.ok() && !absl::IsResourceExhausted(block.status())) {
      // The device's, not the test data's (whose errors are InvalidArgument).
      return absl::InternalError(
          absl::StrCat("laying out a test batch's rows: ", block.status().message()));
    }
    if (block.ok() && *block != nullptr) {
      PackDenseInputs(shape_, batch.inputs, batch.size, features);
      WorkPool::ForEach(&tables_, plan->num_tables(),
                        [&](int t) { plan->WritePooled(t, eval_rows_[t], &(**block)[t]); });
      *on_device = true;
      return features;
    }
  }
  PackInto(batch, plan.get(), eval_rows_, features);
  return features;
}

}  // namespace downpour
