#include "worker/input_stage.h"

#include <utility>

#include "common/status.h"

namespace downpour {

InputStage::InputStage(const ModelShape& shape, ExchangeOptions options,
                       std::vector<ParameterShard*> shards, std::function<bool()> cancelled,
                       int table_threads)
    : shape_(shape),
      num_shards_(static_cast<int>(shards.size())),
      cancelled_(std::move(cancelled)),
      tables_(shape.sparse_tables.empty() ? 0 : table_threads),
      planner_(shape.sparse_tables.empty() ? 0 : 1) {
  if (!shape.sparse_tables.empty()) {
    exchange_ = std::make_unique<SparseExchange>(shape, std::move(options), std::move(shards));
  }
}

absl::StatusOr<const float*> InputStage::Pack(const data::Batch& batch, const SparseBatch* plan) {
  features_.resize(batch.size * shape_.input_size);
  PackDenseInputs(shape_, batch.inputs, batch.size, features_.data());
  if (plan != nullptr) plan->Pool(exchange_->rows(), features_.data(), &tables_);
  return features_.data();
}

absl::StatusOr<const float*> InputStage::Features(const data::Batch& batch, int64_t min_version,
                                                  int64_t min_worker_steps) {
  if (exchange_ == nullptr) return Pack(batch, nullptr);
  if (next_pulled_) {
    next_pulled_ = false;
    RETURN_IF_ERROR(exchange_->Finish());
    std::swap(current_, next_);
    return Pack(batch, current_.get());
  }
  RETURN_IF_ERROR(exchange_->Finish());
  ASSIGN_OR_RETURN(SparseBatch plan,
                   SparseBatch::Plan(shape_, batch.inputs, batch.size, num_shards_, &tables_));
  current_ = std::make_unique<SparseBatch>(std::move(plan));
  exchange_->Begin(0, nullptr, nullptr, current_.get(), min_version, min_worker_steps, cancelled_,
                   /*read_only=*/false);
  RETURN_IF_ERROR(exchange_->Finish());
  return Pack(batch, current_.get());
}

InputStage::~InputStage() { AwaitPlan(); }

void InputStage::AwaitPlan() {
  if (planning_ != nullptr) planning_->Wait();
}

void InputStage::PlanAhead(const data::Batch* next) {
  if (exchange_ == nullptr) return;
  AwaitPlan();
  planning_for_ = next;
  planning_ = planner_.Start(1, [this, next](int) {
    planned_ = SparseBatch::Plan(shape_, next->inputs, next->size, num_shards_, &tables_);
  });
}

absl::Status InputStage::Exchange(int64_t step, const Model& model, const data::Batch* next,
                                  int64_t min_version, int64_t min_worker_steps,
                                  int64_t checkpoint_step) {
  if (exchange_ == nullptr) return absl::OkStatus();
  current_->RowGradients(model.input_grad(), &grads_, &tables_);
  next_.reset();
  AwaitPlan();
  if (next != nullptr) {
    if (planning_ != nullptr && planning_for_ == next) {
      RETURN_IF_ERROR(planned_.status());
      next_ = std::make_unique<SparseBatch>(*std::move(planned_));
    } else {
      ASSIGN_OR_RETURN(SparseBatch plan,
                       SparseBatch::Plan(shape_, next->inputs, next->size, num_shards_, &tables_));
      next_ = std::make_unique<SparseBatch>(std::move(plan));
    }
  }
  planning_.reset();
  planning_for_ = nullptr;
  exchange_->Begin(step, current_.get(), &grads_, next_.get(), min_version, min_worker_steps,
                   cancelled_, /*read_only=*/false, checkpoint_step);
  next_pulled_ = next != nullptr;
  return absl::OkStatus();
}

absl::Status InputStage::Finish() {
  return exchange_ == nullptr ? absl::OkStatus() : exchange_->Finish();
}

absl::StatusOr<const float*> InputStage::EvalFeatures(const data::Batch& batch, int64_t min_version,
                                                      int64_t min_worker_steps) {
  if (exchange_ == nullptr) return Pack(batch, nullptr);
  RETURN_IF_ERROR(exchange_->Finish());
  ASSIGN_OR_RETURN(SparseBatch plan,
                   SparseBatch::Plan(shape_, batch.inputs, batch.size, num_shards_, &tables_));
  exchange_->Begin(0, nullptr, nullptr, &plan, min_version, min_worker_steps, cancelled_,
                   /*read_only=*/true);
  RETURN_IF_ERROR(exchange_->Finish());
  return Pack(batch, &plan);
}

}  // namespace downpour
