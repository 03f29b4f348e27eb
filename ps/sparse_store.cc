#include "ps/sparse_store.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/cpu/optimizer.h"
#include "ps/gradient_runs.h"
#include "ps/lr_schedule.h"
#include "spec/job_validation.h"
#include "spec/proto_dtype.h"
#include "spec/sparse_ids.h"

namespace downpour {
namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

}  // namespace

SparseStore::SparseStore(std::string job_id, const JobSpec& spec, int shard_index,
                         DivergedFn diverged, WorkPool* pool)
    : job_id_(std::move(job_id)),
      shard_(shard_index),
      num_shards_(spec.num_shards()),
      num_workers_(spec.num_workers()),
      mode_(spec.consistency().mode()),
      steps_per_push_(std::max(1, spec.consistency().push_every())),
      backup_workers_(spec.consistency().backup_workers()),
      diverged_(std::move(diverged)),
      pool_(pool) {
  absl::MutexLock lock(&mu_);
  presence_.assign(num_workers_, Presence::kCounts);
  arrived_.assign(num_workers_, false);
  held_.resize(num_workers_);
}

SparseStore::~SparseStore() = default;

absl::StatusOr<std::unique_ptr<SparseStore>> SparseStore::Create(
    const std::string& job_id, const JobSpec& spec, int shard_index, MemoryBudget* budget,
    DivergedFn diverged, WorkPool* pool) {
  ASSIGN_OR_RETURN(ModelShape model, InferModel(spec.model()));
  if (model.sparse_tables.empty()) return nullptr;
  std::unique_ptr<SparseStore> store(
      new SparseStore(job_id, spec, shard_index, std::move(diverged), pool));
  for (SparseTableInfo& info : model.sparse_tables) {
    // The coordinator validated the spec; this guards a caller that did not.
    RETURN_IF_ERROR(ValidateSparseTableOptimizer(info, spec.optimizer()));
    Table table;
    table.optimizer = info.has_optimizer ? info.optimizer : spec.optimizer();
    SparseTableOptions options;
    options.name = info.name;
    options.dim = info.dim;
    options.optimizer = *OptimizerKindOf(table.optimizer);  // Validated above.
    options.hyper = HyperparamsAt(table.optimizer, 0, 1);
    options.init_scale = info.init_scale;
    options.seed = spec.seed();
    // This shard's share of the bound, rounded up.
    options.max_rows =
        info.max_rows > 0 ? (info.max_rows + spec.num_shards() - 1) / spec.num_shards() : 0;
    options.eviction =
        info.eviction == EmbeddingLayer::LFU ? EvictionPolicy::kLfu : EvictionPolicy::kLru;
    options.budget = budget;
    ASSIGN_OR_RETURN(table.rows, SparseTable::Create(options));
    table.info = std::move(info);
    store->tables_.push_back(std::move(table));
  }
  absl::MutexLock lock(&store->mu_);
  for (Held& held : store->held_) {
    held.ids.resize(store->tables_.size());
    held.grads.resize(store->tables_.size());
  }
  store->previous_.resize(store->tables_.size());
  return store;
}

absl::Status SparseStore::CheckRow(const Table& table, int64_t id, const std::string& where) const {
  if (id < 0 || id >= table.info.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": table ", table.info.name,
                                                   " has no row ", id, " (vocab_size ",
                                                   table.info.vocab_size, ")"));
  }
  const int owner = SparseShardOf(id, num_shards_);
  if (owner != shard_) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": row ", id, " of table ",
                                                   table.info.name, " belongs to shard ", owner,
                                                   ", not ", shard_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SparseStore::PushPiece>> SparseStore::ParsePush(
    const PushRequest& request, const Payload& payload, size_t offset, size_t* end) const {
  std::vector<PushPiece> pieces;
  pieces.reserve(request.sparse_size());
  std::vector<bool> listed(tables_.size(), false);
  absl::flat_hash_set<int64_t> seen;
  // Made once: CheckRow takes it for every id.
  const std::string push_where = absl::StrCat("push to job ", job_id_);
  for (const SparseRows& rows : request.sparse()) {
    if (rows.table() < 0 || rows.table() >= num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat("push to job ", job_id_, ": sparse table ",
                                                     rows.table(), " is outside the job's ",
                                                     num_tables()));
    }
    const Table& table = tables_[rows.table()];
    const std::string where = absl::StrCat("push to job ", job_id_, ": table ", table.info.name);
    if (listed[rows.table()])
      return absl::InvalidArgumentError(absl::StrCat(where, " is listed twice"));
    listed[rows.table()] = true;
    absl::StatusOr<WireDtype> dtype = WireDtypeOf(rows.dtype());
    if (!dtype.ok()) return Annotate(dtype.status(), where);
    // Rows differ from step to step: nothing would carry an int8 push's
    // rounding over (a worker sends them in BFLOAT16 for INT8 jobs).
    if (*dtype == WireDtype::kInt8) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rows cannot travel as INT8"));
    }
    seen.clear();
    seen.reserve(rows.ids_size());
    for (int64_t id : rows.ids()) {
      RETURN_IF_ERROR(CheckRow(table, id, push_where));
      if (!seen.insert(id).second) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": row ", id, " is listed twice"));
      }
    }
    const int64_t size =
        request.skipped() ? 0 : WireBytes(*dtype, rows.ids_size() * table.info.dim);
    if (static_cast<int64_t>(offset) + size > static_cast<int64_t>(payload.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": payload has ", payload.size(), " bytes, fewer than the ",
                       rows.ids_size(), " rows of ", table.info.dim, " elements need"));
    }
    pieces.push_back({rows.table(), &rows, offset, *dtype});
    offset += size;
  }
  *end = offset;
  return pieces;
}

absl::Status SparseStore::CheckStep(int64_t step) const {
  if (!sync()) return absl::OkStatus();
  const int64_t version = version_.load(std::memory_order_acquire);
  if (step <= version) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("push to job ", job_id_, ": step ", step,
                                                    " of the sparse tables is ahead of their "
                                                    "version ",
                                                    version, "; pull version ", step, " first"));
}

void SparseStore::Decode(const Payload& payload, const PushPiece& piece,
                         std::vector<float>* out) const {
  const int64_t n = piece.rows->ids_size() * tables_[piece.table].info.dim;
  out->resize(n);
  // The server thread's own, kept across pushes.
  thread_local std::vector<float> scratch;
  ForEachGradientRun(payload, piece.offset, n, piece.dtype, &scratch,
                     [out](const float* grad, int64_t start, int64_t count) {
                       std::copy(grad, grad + count, out->data() + start);
                     });
}

absl::Status SparseStore::ApplyRows(int t, const int64_t* ids, int64_t n, const float* grads,
                                    int64_t progress, int64_t step, int rank, std::string* diverged,
                                    float* before) {
  Table& table = tables_[t];
  if (!kernels::cpu::AllFinite(grads, n * table.info.dim)) {
    // Not applied: the rows stay finite, and the job fails with the reason.
    const std::string who =
        rank >= 0 ? absl::StrCat("worker rank ", rank, "'s gradient") : "the workers' gradient";
    *diverged = absl::StrCat("training diverged at step ", step, ": ", who, " for sparse table ",
                             table.info.name, " is not finite (found by shard ", shard_, ")");
    return absl::OkStatus();
  }
  const float learning_rate = HyperparamsAt(table.optimizer, progress, 1).learning_rate;
  absl::Status applied = table.rows->Apply(ids, n, grads, learning_rate, before);
  if (!applied.ok()) return Annotate(applied, absl::StrCat("push to job ", job_id_));
  return absl::OkStatus();
}

absl::Status SparseStore::ApplyNow(const PushRequest& request, const Payload& payload,
                                   const std::vector<PushPiece>& pieces) {
  const int64_t version = version_.load(std::memory_order_acquire);
  if (!request.skipped()) {
    const int64_t progress = version * steps_per_push_ / num_workers_;
    // Tables are independent: each is decoded and applied on its own
    // thread, as a SYNC step's are.
    std::vector<absl::Status> applied(pieces.size());
    std::vector<std::string> diverged(pieces.size());
    WorkPool::ForEach(pool_, static_cast<int>(pieces.size()), [&](int p) {
      const PushPiece& piece = pieces[p];
      const int64_t n = piece.rows->ids_size();
      if (n == 0) return;
      // The thread's own, kept across pushes.
      thread_local std::vector<float> grads;
      Decode(payload, piece, &grads);
      applied[p] = ApplyRows(piece.table, piece.rows->ids().data(), n, grads.data(), progress,
                             request.step(), request.worker_rank(), &diverged[p]);
    });
    for (size_t p = 0; p < pieces.size(); ++p) {
      if (!applied[p].ok()) {
        absl::MutexLock lock(&mu_);
        Fail(applied[p]);
        return applied[p];
      }
    }
    // The first table found not finite names the divergence (the others
    // were applied; the job fails on it).
    for (const std::string& reason : diverged) {
      if (!reason.empty()) {
        diverged_(reason);
        break;
      }
    }
  }
  version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::StatusOr<bool> SparseStore::Push(const PushRequest& request, const Payload& payload,
                                       const std::vector<PushPiece>& pieces) {
  RETURN_IF_ERROR(failure());
  if (!sync()) {
    RETURN_IF_ERROR(ApplyNow(request, payload, pieces));
    return false;
  }
  const int rank = request.worker_rank();
  // Decoded before the lock, so ranks decode in parallel.
  Held mine;
  if (!request.skipped()) {
    mine.ids.resize(tables_.size());
    mine.grads.resize(tables_.size());
    for (const PushPiece& piece : pieces) {
      mine.ids[piece.table].assign(piece.rows->ids().begin(), piece.rows->ids().end());
      Decode(payload, piece, &mine.grads[piece.table]);
    }
  }
  bool late = false;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    const int64_t version = version_.load(std::memory_order_relaxed);
    if (request.step() < version) {
      late = true;
    } else if (request.step() > version) {
      return CheckStep(request.step());
    } else {
      if (presence_[rank] == Presence::kJoining) presence_[rank] = Presence::kCounts;
      // An absent rank (a worker the coordinator gave up on, still pushing)
      // and a second push of the same step bring nothing.
      if (presence_[rank] == Presence::kCounts && !arrived_[rank]) {
        arrived_[rank] = true;
        ++num_arrived_;
        if (!request.skipped()) {
          ++num_contributors_;
          for (size_t t = 0; t < tables_.size(); ++t) {
            held_bytes_ += static_cast<int64_t>(mine.ids[t].size() * sizeof(int64_t) +
                                                mine.grads[t].size() * sizeof(float));
            held_[rank].ids[t].swap(mine.ids[t]);
            held_[rank].grads[t].swap(mine.grads[t]);
          }
        }
        MaybeCompleteStep();
      }
    }
  }
  ReportDiverged();
  RETURN_IF_ERROR(failure());
  return late;
}

absl::Status SparseStore::ApplyStep(int t, const int64_t* ids, int64_t n, const float* grads,
                                    int64_t version, std::string* diverged) {
  Previous& kept = previous_[t];
  kept.ids.assign(ids, ids + n);
  kept.values.resize(n * tables_[t].info.dim);
  absl::Status applied =
      ApplyRows(t, ids, n, grads, version, version, /*rank=*/-1, diverged, kept.values.data());
  // Not applied: no row changed, none is kept (the values mean nothing
  // without ids, as after DropPrevious).
  if (!diverged->empty()) kept.ids.clear();
  return applied;
}

void SparseStore::DropPrevious() {
  // Cleared, not freed: the next step keeps about as many rows (MemoryBytes
  // counts their capacity). The values stay, meaningless without ids: the
  // next step overwrites them (resized, not zeroed again).
  for (Previous& kept : previous_) {
    kept.ids.clear();
    kept.index.clear();
  }
  previous_version_ = -1;
}

absl::Status SparseStore::CompleteTable(int t, int64_t version, std::string* diverged) {
  const int64_t dim = tables_[t].info.dim;
  if (num_contributors_ == 1) {
    // One rank's rows (a worker pushes each row once): its gradients are
    // the mean.
    for (int rank = 0; rank < num_workers_; ++rank) {
      const std::vector<int64_t>& ids = held_[rank].ids[t];
      if (!arrived_[rank] || ids.empty()) continue;
      return ApplyStep(t, ids.data(), static_cast<int64_t>(ids.size()), held_[rank].grads[t].data(),
                       version, diverged);
    }
    return absl::OkStatus();
  }
  // The rows any rank brought, in the order first seen, and their sums in
  // rank order: ((g0 + g1) + g2) ...
  absl::flat_hash_map<int64_t, int64_t> index;
  std::vector<int64_t> ids;
  std::vector<float> sum;
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (!arrived_[rank]) continue;
    const std::vector<int64_t>& rank_ids = held_[rank].ids[t];
    const float* grads = held_[rank].grads[t].data();
    index.reserve(index.size() + rank_ids.size());
    for (size_t i = 0; i < rank_ids.size(); ++i) {
      const float* g = grads + i * dim;
      auto [it, fresh] = index.emplace(rank_ids[i], static_cast<int64_t>(ids.size()));
      if (fresh) {
        ids.push_back(rank_ids[i]);
        sum.insert(sum.end(), g, g + dim);
      } else {
        float* into = sum.data() + it->second * dim;
        for (int64_t k = 0; k < dim; ++k) into[k] += g[k];
      }
    }
  }
  if (ids.empty()) return absl::OkStatus();
  const float scale = 1.f / static_cast<float>(num_contributors_);
  for (float& v : sum) v *= scale;
  return ApplyStep(t, ids.data(), static_cast<int64_t>(ids.size()), sum.data(), version, diverged);
}

bool SparseStore::StepComplete() const {
  if (num_arrived_ == 0) return false;
  // A rank that arrived and then went absent (it finished: its push was the
  // last) brings its rows but stands in for no rank that counts.
  int counting = 0, counted = 0;
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (presence_[rank] != Presence::kCounts) continue;
    ++counting;
    if (arrived_[rank]) ++counted;
  }
  return counting == 0 || counted >= std::max(1, counting - backup_workers_);
}

void SparseStore::MaybeCompleteStep() {
  if (!failure_.ok() || !StepComplete()) return;
  const int64_t version = version_.load(std::memory_order_relaxed);
  // A capture of this version whose rows nobody has copied yet: now,
  // before the step changes them.
  if (std::shared_ptr<SparseCapture> frozen = frozen_.lock()) {
    if (frozen->version() == version && !frozen->copied_) CopyRows(frozen.get());
  }
  frozen_.reset();
  // What this step changes is kept from before it (CompleteTable), for an
  // exact pull of `version`; what the step before kept is dropped.
  DropPrevious();
  if (num_contributors_ > 0) {
    // Tables are independent: each is summed and applied on its own thread.
    std::vector<absl::Status> applied(tables_.size());
    std::vector<std::string> diverged(tables_.size());
    WorkPool::ForEach(pool_, num_tables(), [&](int t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      // mu_ is held by the caller, who waits for every table.
      applied[t] = CompleteTable(t, version, &diverged[t]);
    });
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (!applied[t].ok()) {
        Fail(applied[t]);
        return;
      }
      if (!diverged[t].empty()) divergences_.push_back(std::move(diverged[t]));
    }
  }
  for (int rank = 0; rank < num_workers_; ++rank) {
    arrived_[rank] = false;
    for (std::vector<int64_t>& ids : held_[rank].ids) ids.clear();
    for (std::vector<float>& grads : held_[rank].grads) grads.clear();
  }
  num_arrived_ = 0;
  num_contributors_ = 0;
  held_bytes_ = 0;
  previous_version_ = version;
  version_.store(version + 1, std::memory_order_release);
  if (capture_at_ == version + 1) {
    handoffs_.emplace_back(std::move(capture_fn_), Freeze(version + 1));
    capture_at_ = 0;
    capture_fn_ = nullptr;
  }
}

void SparseStore::Fail(const absl::Status& status) {
  if (failure_.ok()) failure_ = status;
  failed_.store(true, std::memory_order_release);
}

void SparseStore::ReportDiverged() {
  std::vector<std::string> reasons;
  std::vector<std::pair<CapturedFn, std::shared_ptr<SparseCapture>>> handoffs;
  {
    absl::MutexLock lock(&mu_);
    reasons.swap(divergences_);
    handoffs.swap(handoffs_);
  }
  for (const std::string& why : reasons) diverged_(why);
  for (auto& [captured, capture] : handoffs) captured(std::move(capture));
}

absl::Status SparseStore::failure() const {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return failure_;
}

void SparseStore::SetAbsentWorkers(const std::vector<int>& ranks) {
  {
    absl::MutexLock lock(&mu_);
    for (int rank = 0; rank < num_workers_; ++rank) {
      const bool absent = std::count(ranks.begin(), ranks.end(), rank) > 0;
      if (absent) {
        presence_[rank] = Presence::kAbsent;
      } else if (presence_[rank] == Presence::kAbsent) {
        presence_[rank] = Presence::kJoining;
      }
    }
    if (sync()) MaybeCompleteStep();
  }
  ReportDiverged();
}

absl::StatusOr<int64_t> SparseStore::PullBytes(const PullRequest& request) const {
  int64_t bytes = 0;
  for (const SparseRows& rows : request.sparse()) {
    if (rows.table() < 0 || rows.table() >= num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat("pull from job ", job_id_, ": sparse table ",
                                                     rows.table(), " is outside the job's ",
                                                     num_tables()));
    }
    const Table& table = tables_[rows.table()];
    const std::string where = absl::StrCat("pull from job ", job_id_);
    for (int64_t id : rows.ids()) RETURN_IF_ERROR(CheckRow(table, id, where));
    bytes += rows.ids_size() * table.info.dim * kFloatBytes;
  }
  return bytes;
}

absl::Status SparseStore::Pull(const PullRequest& request, char* out, PullResponse* response)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ is held for an exact pull only.
  RETURN_IF_ERROR(failure());
  // An exact pull holds mu_ throughout: no step completes while its rows
  // are read and the kept values laid over them.
  std::optional<absl::MutexLock> exact_lock;
  const bool exact = request.exact_version();
  const int64_t exact_version = request.min_version();
  if (exact) {
    exact_lock.emplace(&mu_);
    const int64_t at = version_.load(std::memory_order_relaxed);
    if (at != exact_version && !(at == exact_version + 1 && previous_version_ == exact_version)) {
      return absl::FailedPreconditionError(
          absl::StrCat("pull from job ", job_id_, ": the sparse tables are at version ", at,
                       " and no longer keep their rows of version ", exact_version));
    }
  }
  // Where each table's rows go in `out`; then the tables are looked up at
  // once (a table's lookups create its new rows).
  const int asked_tables = request.sparse_size();
  // Read before the rows: they have at least this version's updates.
  const int64_t version = exact ? exact_version : version_.load(std::memory_order_acquire);
  std::vector<float*> rows_out(asked_tables);
  for (int i = 0; i < asked_tables; ++i) {
    const SparseRows& asked = request.sparse(i);
    SparseRows* rows = response->add_sparse();
    rows->set_table(asked.table());
    *rows->mutable_ids() = asked.ids();
    rows->set_dtype(FLOAT32);
    rows->set_version(version);
    // The buffer is aligned for floats, and every part of it is whole floats.
    rows_out[i] = reinterpret_cast<float*>(out);
    out += asked.ids_size() * tables_[asked.table()].info.dim * kFloatBytes;
  }
  std::vector<absl::Status> looked_up(asked_tables);
  const auto look_up = [&](int i) {
    const SparseRows& asked = request.sparse(i);
    SparseTable& rows = *tables_[asked.table()].rows;
    looked_up[i] = request.sparse_read_only()
                       ? rows.Peek(asked.ids().data(), asked.ids_size(), rows_out[i])
                       : rows.Lookup(asked.ids().data(), asked.ids_size(), rows_out[i]);
  };
  WorkPool::ForEach(pool_, asked_tables, look_up);
  for (const absl::Status& status : looked_up) {
    if (!status.ok()) return Annotate(status, absl::StrCat("pull from job ", job_id_));
  }
  if (exact && version_.load(std::memory_order_relaxed) != exact_version) {
    // One step on: the rows it changed, as they were before it.
    for (int i = 0; i < asked_tables; ++i) {
      const SparseRows& asked = request.sparse(i);
      Previous& kept = previous_[asked.table()];
      if (kept.index.empty()) {
        kept.index.reserve(kept.ids.size());
        // The first of a repeated id: its value before the step.
        for (size_t k = 0; k < kept.ids.size(); ++k) kept.index.emplace(kept.ids[k], k);
      }
      const int64_t dim = tables_[asked.table()].info.dim;
      for (int64_t j = 0; j < asked.ids_size(); ++j) {
        auto it = kept.index.find(asked.ids(j));
        if (it == kept.index.end()) continue;
        std::memcpy(rows_out[i] + j * dim, kept.values.data() + it->second * dim,
                    dim * sizeof(float));
      }
    }
  }
  return absl::OkStatus();
}

std::string SparseStore::Unmet(int64_t min_version) const {
  const int64_t version = version_.load(std::memory_order_acquire);
  if (version >= min_version) return "";
  std::string unmet =
      absl::StrCat("the sparse tables still at version ", version, " < ", min_version);
  // The ranks missing from the step, unless a step is being applied now
  // (the caller holds its job's lock: it does not wait for that).
  if (sync() && mu_.TryLock()) {
    std::vector<int> missing;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (presence_[rank] == Presence::kCounts && !arrived_[rank]) missing.push_back(rank);
    }
    mu_.Unlock();
    if (!missing.empty()) {
      absl::StrAppend(&unmet, " (step ", version, " waits for worker rank",
                      missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "), ")");
    }
  }
  return unmet;
}

std::vector<SparseTableStats> SparseStore::Stats() const {
  std::vector<SparseTableStats> stats;
  for (const Table& table : tables_) {
    stats.push_back(
        {table.info.name, table.rows->rows(), table.rows->evictions(), table.rows->bytes()});
  }
  return stats;
}

int64_t SparseStore::MemoryBytes() const {
  int64_t bytes = 0;
  for (const Table& table : tables_) bytes += table.rows->bytes();
  absl::MutexLock lock(&mu_);
  // The kept rows' memory as allocated (cleared, not freed, each step).
  for (const Previous& kept : previous_) {
    bytes += static_cast<int64_t>(kept.ids.capacity() * sizeof(int64_t) +
                                  kept.values.capacity() * sizeof(float) +
                                  kept.index.capacity() * (2 * sizeof(int64_t) + 1));
  }
  return bytes + held_bytes_;
}

std::vector<SparseTable::Snapshot> SparseStore::Snapshot() const {
  std::vector<SparseTable::Snapshot> snapshots;
  for (const Table& table : tables_) snapshots.push_back(table.rows->TakeSnapshot());
  return snapshots;
}

void SparseCapture::Take(ShardSnapshot* info, bool keep) {
  {
    absl::MutexLock lock(&store_->mu_);
    if (!copied_) store_->CopyRows(this);
  }
  info->has_sparse = true;
  info->sparse_version = version_;
  if (keep) {
    info->sparse_tables = tables_;
  } else {
    info->sparse_tables = std::move(tables_);
    tables_.clear();
  }
}

std::shared_ptr<SparseCapture> SparseStore::Freeze(int64_t version) {
  std::shared_ptr<SparseCapture> capture(new SparseCapture(this, version));
  frozen_ = capture;
  return capture;
}

void SparseStore::CopyRows(SparseCapture* capture) {
  capture->tables_.clear();
  capture->tables_.reserve(tables_.size());
  for (const Table& table : tables_) {
    SparseTable::Snapshot rows = table.rows->TakeSnapshot();
    SparseTableSnapshot out;
    out.name = table.info.name;
    out.dim = rows.dim;
    out.slots = rows.slots;
    out.ids = std::move(rows.ids);
    out.values = std::move(rows.values);
    out.slot_values = std::move(rows.slot_values);
    out.updates = std::move(rows.updates);
    out.touches = std::move(rows.touches);
    capture->tables_.push_back(std::move(out));
  }
  capture->copied_ = true;
}

void SparseStore::CaptureAt(int64_t step, CapturedFn captured) {
  absl::StatusOr<std::shared_ptr<SparseCapture>> result;
  {
    absl::MutexLock lock(&mu_);
    capture_at_ = 0;  // Replaced, if one was pending.
    capture_fn_ = nullptr;
    const int64_t version = version_.load(std::memory_order_acquire);
    if (!sync()) {
      result = std::shared_ptr<SparseCapture>(new SparseCapture(this, version));
      CopyRows(result->get());
    } else if (version > step) {
      result = absl::FailedPreconditionError(
          absl::StrCat("the sparse tables are already at version ", version,
                       ", past the checkpoint's step ", step));
    } else if (version == step) {
      result = Freeze(step);
    } else {
      capture_at_ = step;
      capture_fn_ = std::move(captured);
      return;
    }
  }
  captured(std::move(result));
}

absl::Status SparseStore::Restore(const ShardSnapshot& snapshot) {
  const std::string where = absl::StrCat("restoring job ", job_id_, " from step ", snapshot.step);
  int64_t version = snapshot.sparse_version;
  if (!snapshot.has_sparse) {
    version = snapshot.step;
    if (!sync()) {
      version = 0;
      for (const PartitionSnapshot& p : snapshot.partitions) version = std::max(version, p.version);
    }
    for (Table& table : tables_) {
      SparseTable::Snapshot none;
      none.dim = table.info.dim;
      none.slots = NumOptimizerSlots(*OptimizerKindOf(table.optimizer));
      RETURN_IF_ERROR(Annotate(table.rows->Restore(none), where));
    }
    Log(absl::StrCat("job ", job_id_, ": the checkpoint at step ", snapshot.step,
                     " holds no sparse table rows (written before checkpoints held them): "
                     "their rows start afresh at version ",
                     version));
  } else {
    int64_t rows_restored = 0;
    for (const SparseTableSnapshot& saved : snapshot.sparse_tables) {
      rows_restored += static_cast<int64_t>(saved.ids.size());
      if (std::none_of(tables_.begin(), tables_.end(),
                       [&](const Table& t) { return t.info.name == saved.name; })) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": the checkpoint's sparse table ",
                                                       saved.name, " is not the job's"));
      }
    }
    for (Table& table : tables_) {
      const SparseTableSnapshot* saved = nullptr;
      for (const SparseTableSnapshot& t : snapshot.sparse_tables) {
        if (t.name == table.info.name) saved = &t;
      }
      if (saved == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the checkpoint has no sparse table ", table.info.name));
      }
      for (int64_t id : saved->ids) RETURN_IF_ERROR(CheckRow(table, id, where));
      SparseTable::Snapshot rows;
      rows.dim = saved->dim;
      rows.slots = saved->slots;
      rows.ids = saved->ids;
      rows.values = saved->values;
      rows.slot_values = saved->slot_values;
      rows.updates = saved->updates;
      rows.touches = saved->touches;
      const int slots = NumOptimizerSlots(*OptimizerKindOf(table.optimizer));
      if (rows.slots == 0 && slots > 0 && rows.dim == table.info.dim) {
        // Rows without optimizer state (a new job's initial weights): the
        // state starts afresh, as a new row's.
        rows.slots = slots;
        rows.slot_values.assign(rows.ids.size() * rows.dim * slots, 0.f);
        rows.updates.assign(rows.ids.size(), 0);
      }
      absl::Status restored = table.rows->Restore(rows);
      if (!restored.ok()) return Annotate(restored, where);
    }
    Log(absl::StrCat("job ", job_id_, ": restored ", rows_restored, " rows of ", tables_.size(),
                     " sparse tables at version ", version));
  }
  absl::MutexLock lock(&mu_);
  for (int rank = 0; rank < num_workers_; ++rank) {
    arrived_[rank] = false;
    for (std::vector<int64_t>& ids : held_[rank].ids) ids.clear();
    for (std::vector<float>& grads : held_[rank].grads) grads.clear();
  }
  num_arrived_ = 0;
  num_contributors_ = 0;
  held_bytes_ = 0;
  DropPrevious();
  version_.store(version, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace downpour
