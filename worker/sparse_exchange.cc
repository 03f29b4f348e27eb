#include "worker/sparse_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "spec/proto_dtype.h"
#include "worker/shard_retry.h"

namespace downpour {

SparseExchange::SparseExchange(const ModelShape& shape, ExchangeOptions options,
                               std::vector<ParameterShard*> shards)
    : shape_(shape),
      options_(std::move(options)),
      shards_(std::move(shards)),
      sequence_(options_.first_sequence),
      pool_(static_cast<int>(shards_.size()), "sparse-rows") {
  const size_t tables = shape_.sparse_tables.size();
  pulled_.assign(tables, std::vector<std::vector<float>>(shards_.size()));
  row_pointers_.assign(tables, std::vector<const float*>(shards_.size(), nullptr));
  encoded_.resize(shards_.size());
  versions_.assign(shards_.size(), 0);
  asked_.assign(shards_.size(), 0);
  answered_.assign(shards_.size(), 0);
  handled_.assign(shards_.size(), 0);
}

SparseExchange::~SparseExchange() { (void)Finish(); }

void SparseExchange::Begin(int64_t step, const SparseBatch* pushed,
                           const std::vector<std::vector<std::vector<float>>>* grads,
                           const RowIds* next, int64_t min_version, int64_t min_worker_steps,
                           std::function<bool()> cancelled, bool read_only, int64_t checkpoint_step,
                           bool exact_version) {
  step_ = step;
  read_only_ = read_only;
  exact_version_ = exact_version;
  checkpoint_step_ = checkpoint_step;
  pushed_ = pushed;
  grads_ = grads;
  next_ = next;
  min_version_ = min_version;
  min_worker_steps_ = min_worker_steps;
  cancelled_ = std::move(cancelled);
  results_.assign(shards_.size(), absl::OkStatus());
  std::fill(asked_.begin(), asked_.end(), 0);
  std::fill(answered_.begin(), answered_.end(), 0);
  std::fill(handled_.begin(), handled_.end(), 0);
  in_flight_ = true;
  const int64_t first = sequence_ + 1;
  if (pushed_ != nullptr) sequence_ += static_cast<int64_t>(shards_.size());
  batch_ = pool_.Start(static_cast<int>(shards_.size()),
                       [this, first](int s) { results_[s] = ExchangeWithShard(s, first + s); });
}

absl::Status SparseExchange::Finish() {
  if (!in_flight_) return absl::OkStatus();
  in_flight_ = false;
  batch_->Wait();
  batch_.reset();
  absl::Status first;
  for (const absl::Status& s : results_) first.Update(s);
  results_.clear();
  if (first.ok()) {
    // The shard whose answer came last, and its last attempt: what the
    // exchange waited for, and what of it that shard says it held.
    const size_t slowest = std::max_element(answered_.begin(), answered_.end()) - answered_.begin();
    if (handled_[slowest] > 0) {
      round_trip_seconds_ += answered_[slowest] - asked_[slowest];
      shard_seconds_ += handled_[slowest];
    }
  }
  if (first.ok() && next_ != nullptr) {
    for (size_t t = 0; t < pulled_.size(); ++t) {
      for (size_t s = 0; s < shards_.size(); ++s) {
        row_pointers_[t][s] = pulled_[t][s].data();
        rows_pulled_ += static_cast<int64_t>((*next_)[t][s].size());
      }
    }
    pulled_version_ = *std::min_element(versions_.begin(), versions_.end());
  }
  if (first.ok() && pushed_ != nullptr) rows_pushed_ += pushed_->distinct_rows();
  // The caller's plans and gradients are not ours to keep.
  pushed_ = nullptr;
  next_ = nullptr;
  grads_ = nullptr;
  return first;
}

absl::Status SparseExchange::ExchangeWithShard(int s, int64_t sequence) {
  const int tables = static_cast<int>(shape_.sparse_tables.size());
  PushRequest push;
  Payload push_payload;
  if (pushed_ != nullptr) {
    push.set_job_id(options_.job_id);
    push.set_worker_rank(options_.rank);
    push.set_step(step_);
    push.set_attempt(options_.attempt);
    push.set_checkpoint_step(checkpoint_step_);
    RequestId* id = push.mutable_request_id();
    id->set_worker_id(absl::StrCat(options_.worker_id, "#sparse"));
    id->set_incarnation(options_.incarnation);
    id->set_sequence(sequence);
    // Rows differ each step: nothing would carry an int8 push's rounding
    // over, so an INT8 job's rows go as bfloat16.
    const WireDtype dtype = options_.gradient_dtype == WireDtype::kInt8 ? WireDtype::kBfloat16
                                                                        : options_.gradient_dtype;
    const int bytes = static_cast<int>(WireBytes(dtype, 1));
    int64_t elements = 0;
    for (int t = 0; t < tables; ++t) elements += static_cast<int64_t>((*grads_)[t][s].size());
    if (dtype != WireDtype::kFloat32) encoded_[s].resize(elements * bytes);
    int64_t at = 0;
    for (int t = 0; t < tables; ++t) {
      SparseRows* rows = push.add_sparse();
      rows->set_table(t);
      rows->set_dtype(DTypeOf(dtype));
      const std::vector<int64_t>& ids = pushed_->rows(t, s);
      rows->mutable_ids()->Assign(ids.begin(), ids.end());
      const std::vector<float>& g = (*grads_)[t][s];
      if (g.empty()) continue;
      if (dtype == WireDtype::kFloat32) {
        push_payload.Append(reinterpret_cast<const char*>(g.data()), sizeof(float) * g.size());
      } else {
        char* out = encoded_[s].data() + at * bytes;
        EncodeFloats(dtype, g.data(), static_cast<int64_t>(g.size()), out);
        push_payload.Append(out, bytes * g.size());
      }
      at += static_cast<int64_t>(g.size());
    }
  }
  PullRequest pull;
  if (next_ != nullptr) {
    pull.set_job_id(options_.job_id);
    pull.set_worker_rank(options_.rank);
    pull.set_min_version(min_version_);
    pull.set_min_worker_steps(min_worker_steps_);
    pull.set_dtype(FLOAT32);
    pull.set_sparse_read_only(read_only_);
    pull.set_exact_version(exact_version_);
    for (int t = 0; t < tables; ++t) {
      SparseRows* rows = pull.add_sparse();
      rows->set_table(t);
      const std::vector<int64_t>& ids = (*next_)[t][s];
      rows->mutable_ids()->Assign(ids.begin(), ids.end());
    }
  }
  // The same request on every attempt (worker/shard_retry.h).
  const absl::Duration timeout = next_ != nullptr ? options_.pull_timeout : options_.push_timeout;
  Payload pulled;
  PullResponse response;
  const absl::Status exchanged = CallShardWithRetries(
      absl::StrCat("exchanging sparse rows with shard ", s), absl::Now() + timeout,
      options_.pull_slice, cancelled_, [&](absl::Time deadline) -> absl::Status {
        if (pushed_ != nullptr && next_ != nullptr) {
          asked_[s] = MonotonicSeconds();
          absl::StatusOr<PushPullResponse> answer =
              shards_[s]->PushPull(push, push_payload, pull, deadline, &pulled);
          if (answer.ok()) {
            answered_[s] = MonotonicSeconds();
            handled_[s] = static_cast<double>(answer->handled_us()) * 1e-6;
            response = std::move(*answer->mutable_pull());
          }
          return answer.status();
        }
        if (pushed_ != nullptr) return shards_[s]->Push(push, push_payload).status();
        absl::StatusOr<PullResponse> answer = shards_[s]->Pull(pull, deadline, &pulled);
        if (answer.ok()) response = *std::move(answer);
        return answer.status();
      });
  if (absl::IsCancelled(exchanged) && pushed_ != nullptr && options_.push_cancelled &&
      !options_.push_cancelled()) {
    // Stopping where pushes go on (ExchangeOptions::push_cancelled): the
    // step's rows still go, the same request (applied once), alone.
    RETURN_IF_ERROR(CallShardWithRetries(
        absl::StrCat("pushing sparse rows to shard ", s), absl::Now() + options_.push_timeout,
        options_.pull_slice, options_.push_cancelled,
        [&](absl::Time) { return shards_[s]->Push(push, push_payload).status(); }));
  }
  RETURN_IF_ERROR(exchanged);
  if (next_ == nullptr) return absl::OkStatus();
  // The rows, table after table, as asked.
  if (response.sparse_size() != tables) {
    return absl::InternalError(absl::StrCat("shard ", s, " answered ", response.sparse_size(),
                                            " sparse tables of ", tables));
  }
  size_t offset = 0;
  for (const PartitionHeader& p : response.partitions()) offset += sizeof(float) * p.num_elements();
  versions_[s] = tables > 0 ? response.sparse(0).version() : 0;
  if (exact_version_ && tables > 0 && versions_[s] != min_version_) {
    // A shard from before exact versions answers its current rows.
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", s, " answered sparse rows at version ", versions_[s],
                     ", not the exact version ", min_version_, " asked for"));
  }
  for (int t = 0; t < tables; ++t) {
    const SparseRows& rows = response.sparse(t);
    const std::vector<int64_t>& asked = (*next_)[t][s];
    if (rows.table() != t || rows.ids_size() != static_cast<int>(asked.size()) ||
        (rows.dtype() != FLOAT32 && rows.dtype() != DTYPE_UNSPECIFIED)) {
      return absl::InternalError(
          absl::StrCat("shard ", s, " answered other rows than asked of table ", t));
    }
    const size_t bytes = sizeof(float) * asked.size() * shape_.sparse_tables[t].dim;
    if (offset + bytes > pulled.size()) {
      return absl::InternalError(absl::StrCat("shard ", s, " sent ", pulled.size(),
                                              " bytes, fewer than the rows asked for"));
    }
    std::vector<float>& out = pulled_[t][s];
    out.resize(bytes / sizeof(float));
    pulled.CopyTo(offset, bytes, reinterpret_cast<char*>(out.data()));
    offset += bytes;
  }
  return absl::OkStatus();
}

}  // namespace downpour
