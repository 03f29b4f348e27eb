#include "ps/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/splitmix64.h"
#include "kernels/cpu/optimizer.h"
#include "ps/sparse_stripe_rows.h"

namespace downpour {
namespace {

using sparse_internal::IdHash;
using sparse_internal::kMaxStripeSlots;
using sparse_internal::kMaxTouches;
using sparse_internal::kNone;
using sparse_internal::RowMeta;
using sparse_internal::RowShape;
using sparse_internal::StripeRows;

// Stripes: up to 1 << kMaxStripeBits, each holding at least
// kMinRowsPerStripe rows of max_rows (see the header comment).
constexpr int kMaxStripeBits = 6;
constexpr int64_t kMinRowsPerStripe = 64;

constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxIdsPerCall = std::numeric_limits<int32_t>::max();

uint64_t Fnv1a64(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

void InitRow(uint64_t seed, uint64_t name_hash, int64_t id, float scale, int64_t dim, float* out) {
  const uint64_t key =
      SplitMix64(SplitMix64(seed ^ SplitMix64(name_hash)) + static_cast<uint64_t>(id));
  for (int64_t i = 0; i < dim; ++i) {
    const float u = static_cast<float>(SplitMix64(key + static_cast<uint64_t>(i)) >> 40) *
                    (1.0f / (1 << 24));  // [0, 1), 24 bits.
    out[i] = scale * (2.f * u - 1.f);
  }
}

std::string TableError(const std::string& table, const std::string& what) {
  return absl::StrCat("sparse table ", table, ": ", what);
}

absl::Status CheckCount(const std::string& table, int64_t n) {
  if (n < 0 || n > kMaxIdsPerCall) {
    return absl::InvalidArgumentError(
        TableError(table, absl::StrCat("a call takes 0 to ", kMaxIdsPerCall, " ids, got ", n)));
  }
  return absl::OkStatus();
}

// A row's record in the table's stripes. A table without max_rows never
// evicts: it keeps no eviction order.
RowShape ShapeOf(int64_t dim, int num_slots, int64_t max_rows, EvictionPolicy eviction) {
  return RowShape(dim, num_slots, /*ordered=*/max_rows > 0, eviction == EvictionPolicy::kLfu);
}

}  // namespace

void InitSparseRow(uint64_t seed, const std::string& table_name, int64_t id, float scale,
                   int64_t dim, float* out) {
  InitRow(seed, Fnv1a64(table_name), id, scale, dim, out);
}

// Aligned to a cache line so that stripes' locks do not share one.
struct alignas(64) SparseTable::Stripe {
  absl::Mutex mu;
  StripeRows rows ABSL_GUARDED_BY(mu);
};

struct SparseTable::Grouping {
  std::vector<uint64_t> hashes;  // IdHash(ids[i]).
  std::vector<uint32_t> order;   // Indices into ids, stripe by stripe.
  std::vector<uint32_t> begin;   // Stripe s: order[begin[s] .. begin[s + 1]).
};

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(
    const SparseTableOptions& options) {
  const std::string& table = options.name;
  if (options.dim <= 0 || options.dim > kMaxDim) {
    return absl::InvalidArgumentError(
        TableError(table, absl::StrCat("dim must be in [1, ", kMaxDim, "], got ", options.dim)));
  }
  if (!(options.init_scale > 0.f) || !std::isfinite(options.init_scale)) {
    return absl::InvalidArgumentError(TableError(
        table, absl::StrCat("init_scale must be a finite number > 0, got ", options.init_scale)));
  }
  if (options.max_rows < 0) {
    return absl::InvalidArgumentError(TableError(
        table, absl::StrCat("max_rows must be >= 0 (0: no bound), got ", options.max_rows)));
  }
  int stripe_bits = kMaxStripeBits;
  if (options.max_rows > 0) {
    stripe_bits = 0;
    while (stripe_bits < kMaxStripeBits &&
           (options.max_rows >> (stripe_bits + 1)) >= kMinRowsPerStripe) {
      ++stripe_bits;
    }
    const int64_t most = int64_t{kMaxStripeSlots} << stripe_bits;
    if (options.max_rows > most) {
      return absl::InvalidArgumentError(TableError(
          table, absl::StrCat("max_rows must be at most ", most, ", got ", options.max_rows)));
    }
  }
  std::unique_ptr<SparseTable> sparse_table(new SparseTable(options, stripe_bits));
  if (sparse_table->budget_ != nullptr &&
      !sparse_table->budget_->TryReserve(sparse_table->fixed_bytes_)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shard memory limit of ", options.budget->limit(), " bytes reached: table ",
                     table, " cannot be created (it needs ", sparse_table->fixed_bytes_,
                     " bytes before its first row); raise --memory_limit or add shards"));
  }
  sparse_table->bytes_.store(sparse_table->fixed_bytes_, std::memory_order_relaxed);
  return sparse_table;
}

SparseTable::SparseTable(const SparseTableOptions& options, int stripe_bits)
    : name_(options.name),
      name_hash_(Fnv1a64(options.name)),
      dim_(options.dim),
      optimizer_(options.optimizer),
      hyper_(options.hyper),
      adam_bias_(options.optimizer == OptimizerKind::kAdam
                     ? AdamBiasTable::Shared(options.hyper.beta1, options.hyper.beta2)
                     : nullptr),
      init_scale_(options.init_scale),
      seed_(options.seed),
      max_rows_(options.max_rows),
      eviction_(options.eviction),
      budget_(options.budget),
      stripe_bits_(stripe_bits),
      num_slots_(NumOptimizerSlots(options.optimizer)),
      fixed_bytes_(static_cast<int64_t>(sizeof(SparseTable) + (sizeof(Stripe) << stripe_bits))),
      stripes_(std::make_unique<Stripe[]>(size_t{1} << stripe_bits)) {
  const RowShape shape = ShapeOf(dim_, num_slots_, max_rows_, eviction_);
  const int num_stripes = 1 << stripe_bits_;
  for (int s = 0; s < num_stripes; ++s) {
    uint32_t max_slots = kMaxStripeSlots;
    if (max_rows_ > 0) {
      // Split evenly: the first (max_rows mod stripes) stripes hold one more.
      max_slots = static_cast<uint32_t>((max_rows_ >> stripe_bits_) +
                                        (s < (max_rows_ & (num_stripes - 1)) ? 1 : 0));
    }
    absl::MutexLock lock(&stripes_[s].mu);
    stripes_[s].rows.Configure(shape, max_slots);
  }
}

SparseTable::~SparseTable() {
  if (budget_ != nullptr) budget_->Release(bytes_.load(std::memory_order_relaxed));
}

absl::Status SparseTable::Exhausted(const Shortage& shortage) const {
  const int num_stripes = 1 << stripe_bits_;
  if (shortage.budget_refused) {
    const std::string holds =
        absl::StrCat("shard memory limit of ", budget_->limit(), " bytes reached: table ", name_,
                     " holds ", rows(), " rows (", bytes(), " bytes)");
    if (max_rows_ == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          holds, "; raise --memory_limit, add shards or set max_rows on the table to evict"));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat(holds, ", and of the ", shortage.stripe_rows,
                     " in the stripe that needs a row, none this call does not read to evict; "
                     "raise --memory_limit or add shards"));
  }
  if (max_rows_ > 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sparse table ", name_, ": one call touches more rows than the ",
                     shortage.stripe_rows, " a stripe of it holds (max_rows ", max_rows_, " over ",
                     num_stripes, " stripes); raise max_rows or send fewer distinct ids per call"));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("sparse table ", name_, ": a stripe of it holds the most rows it can (",
                   kMaxStripeSlots, "); add shards or set max_rows on the table"));
}

void SparseTable::GroupByStripe(const int64_t* ids, int64_t n, Grouping* grouping) const {
  const int num_stripes = 1 << stripe_bits_;
  grouping->hashes.resize(n);
  grouping->order.resize(n);
  grouping->begin.assign(num_stripes + 1, 0);
  if (num_stripes == 1) {
    for (int64_t i = 0; i < n; ++i) {
      grouping->hashes[i] = IdHash(ids[i]);
      grouping->order[i] = static_cast<uint32_t>(i);
    }
    grouping->begin[1] = static_cast<uint32_t>(n);
    return;
  }
  const int shift = 64 - stripe_bits_;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hash = IdHash(ids[i]);
    grouping->hashes[i] = hash;
    ++grouping->begin[(hash >> shift) + 1];
  }
  for (int s = 0; s < num_stripes; ++s) grouping->begin[s + 1] += grouping->begin[s];
  uint32_t next[1 << kMaxStripeBits];
  std::copy(grouping->begin.begin(), grouping->begin.end() - 1, next);
  for (int64_t i = 0; i < n; ++i) {
    grouping->order[next[grouping->hashes[i] >> shift]++] = static_cast<uint32_t>(i);
  }
}

uint32_t SparseTable::TakeSlot(Stripe& stripe, Shortage* shortage) {
  StripeRows& rows = stripe.rows;
  uint32_t slot = rows.PopFree();
  if (slot != kNone) return slot;
  bool budget_refused = false;
  if (rows.CanGrow()) {
    const int64_t grow = rows.GrowBytes();
    if (budget_ == nullptr || budget_->TryReserve(grow)) {
      rows.Grow();
      bytes_.fetch_add(grow, std::memory_order_relaxed);
      return rows.PopFree();
    }
    budget_refused = true;
  }
  if (max_rows_ > 0) {
    slot = rows.Victim();
    if (slot != kNone) {
      rows.Remove(slot);
      rows_.fetch_sub(1, std::memory_order_relaxed);
      evictions_.fetch_add(1, std::memory_order_relaxed);
      return slot;
    }
  }
  shortage->budget_refused = budget_refused;
  shortage->stripe_rows = rows.rows();
  return kNone;
}

bool SparseTable::ResolveRows(Stripe& stripe, const int64_t* ids, const Grouping& grouping,
                              uint32_t begin, uint32_t end, uint32_t* slots,
                              std::vector<int64_t>* created, float* out, Shortage* shortage) {
  StripeRows& rows = stripe.rows;
  const size_t row_bytes = sizeof(float) * dim_;
  bool missing = false;
  // Memory latency, not work, bounds a lookup: what the id kAhead on reads
  // is prefetched, in stages (see Prefetch).
  constexpr uint32_t kAhead = 4;
  for (uint32_t k = begin; k < end; ++k) {
    for (int stage = 0; stage < 3; ++stage) {
      const uint32_t ahead = k + kAhead * (3 - stage);
      if (ahead < end) rows.Prefetch(stage, grouping.hashes[grouping.order[ahead]], out == nullptr);
    }
    const uint32_t i = grouping.order[k];
    const uint32_t slot = rows.Find(ids[i], grouping.hashes[i]);
    slots[k - begin] = slot;
    if (slot == kNone) {
      missing = true;
      continue;
    }
    rows.Touch(slot);
    rows.Pin(slot);
    if (out != nullptr) std::memcpy(out + i * dim_, rows.Values(slot), row_bytes);
  }
  if (!missing) return true;

  const size_t first_created = created->size();
  bool ok = true;
  for (uint32_t k = begin; k < end; ++k) {
    if (slots[k - begin] != kNone) continue;
    const uint32_t i = grouping.order[k];
    const int64_t id = ids[i];
    const uint64_t hash = grouping.hashes[i];
    uint32_t slot = rows.Find(id, hash);  // Created above when repeated.
    if (slot != kNone) {
      rows.Touch(slot);
    } else {
      slot = TakeSlot(stripe, shortage);
      if (slot == kNone) {
        ok = false;
        break;
      }
      float* values = rows.Values(slot);
      InitRow(seed_, name_hash_, id, init_scale_, dim_, values);
      std::memset(values + dim_, 0, row_bytes * num_slots_);
      rows.Meta(slot).updates = 0;
      rows.Insert(slot, id, hash, /*touches=*/1);
      rows.Pin(slot);
      rows_.fetch_add(1, std::memory_order_relaxed);
      created->push_back(id);
    }
    slots[k - begin] = slot;
    if (out != nullptr) std::memcpy(out + i * dim_, rows.Values(slot), row_bytes);
  }
  if (ok) return true;
  for (size_t c = first_created; c < created->size(); ++c) {
    const int64_t id = (*created)[c];
    const uint32_t slot = rows.Find(id, IdHash(id));
    rows.Remove(slot);
    rows.PushFree(slot);
    rows_.fetch_sub(1, std::memory_order_relaxed);
  }
  created->resize(first_created);
  for (uint32_t k = begin; k < end; ++k) {
    if (slots[k - begin] != kNone) rows.Unpin(slots[k - begin]);
  }
  return false;
}

void SparseTable::Unpin(Stripe& stripe, const uint32_t* slots, uint32_t count) {
  if (!stripe.rows.ordered()) return;
  for (uint32_t c = 0; c < count; ++c) stripe.rows.Unpin(slots[c]);
}

void SparseTable::RemoveCreatedRows(const std::vector<int64_t>& ids) {
  const int shift = 64 - stripe_bits_;
  size_t c = 0;
  while (c < ids.size()) {
    const int s = stripe_bits_ == 0 ? 0 : static_cast<int>(IdHash(ids[c]) >> shift);
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    // The ids are grouped by stripe: take each stripe's run under one lock.
    for (; c < ids.size() && (stripe_bits_ == 0 || static_cast<int>(IdHash(ids[c]) >> shift) == s);
         ++c) {
      const uint32_t slot = stripe.rows.Find(ids[c], IdHash(ids[c]));
      // Left alone once an Apply has updated it: its update is not undone.
      if (slot == kNone || stripe.rows.Meta(slot).updates != 0) continue;
      stripe.rows.Remove(slot);
      stripe.rows.PushFree(slot);
      rows_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

absl::Status SparseTable::Lookup(const int64_t* ids, int64_t n, float* out) {
  absl::Status status = CheckCount(name_, n);
  if (!status.ok() || n == 0) return status;
  Grouping grouping;
  GroupByStripe(ids, n, &grouping);
  std::vector<uint32_t> slots(n);
  std::vector<int64_t> created;
  const int num_stripes = 1 << stripe_bits_;
  for (int s = 0; s < num_stripes; ++s) {
    const uint32_t begin = grouping.begin[s];
    const uint32_t end = grouping.begin[s + 1];
    if (begin == end) continue;
    Stripe& stripe = stripes_[s];
    Shortage shortage;
    bool ok;
    {
      absl::MutexLock lock(&stripe.mu);
      ok = ResolveRows(stripe, ids, grouping, begin, end, &slots[begin], &created, out, &shortage);
      if (ok) Unpin(stripe, &slots[begin], end - begin);
    }
    if (!ok) {
      RemoveCreatedRows(created);
      return Exhausted(shortage);
    }
  }
  return status;
}

absl::Status SparseTable::Peek(const int64_t* ids, int64_t n, float* out) const {
  absl::Status status = CheckCount(name_, n);
  if (!status.ok() || n == 0) return status;
  Grouping grouping;
  GroupByStripe(ids, n, &grouping);
  const size_t row_bytes = sizeof(float) * dim_;
  const int num_stripes = 1 << stripe_bits_;
  for (int s = 0; s < num_stripes; ++s) {
    const uint32_t begin = grouping.begin[s];
    const uint32_t end = grouping.begin[s + 1];
    if (begin == end) continue;
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    const StripeRows& rows = stripe.rows;
    for (uint32_t k = begin; k < end; ++k) {
      // As ResolveRows: the index entry, then the row, a few ids ahead (an
      // eviction neighbour is never read here).
      for (int stage = 0; stage < 2; ++stage) {
        const uint32_t ahead = k + 4 * (2 - stage);
        if (ahead < end) rows.Prefetch(stage, grouping.hashes[grouping.order[ahead]], false);
      }
      const uint32_t i = grouping.order[k];
      const uint32_t slot = rows.Find(ids[i], grouping.hashes[i]);
      if (slot != kNone) {
        std::memcpy(out + i * dim_, rows.Values(slot), row_bytes);
      } else {
        InitRow(seed_, name_hash_, ids[i], init_scale_, dim_, out + i * dim_);
      }
    }
  }
  return status;
}

absl::Status SparseTable::Apply(const int64_t* ids, int64_t n, const float* grads,
                                float learning_rate, float* before) {
  absl::Status status = CheckCount(name_, n);
  if (!status.ok() || n == 0) return status;
  Grouping grouping;
  GroupByStripe(ids, n, &grouping);
  std::vector<uint32_t> slots(n);
  std::vector<int64_t> created;
  OptimizerHyperparams hyper = hyper_;
  hyper.learning_rate = learning_rate;
  hyper.adam_bias = adam_bias_.get();
  const int num_stripes = 1 << stripe_bits_;
  for (int s = 0; s < num_stripes; ++s) {
    const uint32_t begin = grouping.begin[s];
    const uint32_t end = grouping.begin[s + 1];
    if (begin == end) continue;
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    // Every row first, so a stripe that fails updates none.
    Shortage shortage;
    if (!ResolveRows(stripe, ids, grouping, begin, end, &slots[begin], &created, nullptr,
                     &shortage)) {
      return Exhausted(shortage);
    }
    for (uint32_t k = begin; k < end; ++k) {
      const uint32_t i = grouping.order[k];
      RowMeta& meta = stripe.rows.Meta(slots[k]);
      hyper.step = ++meta.updates;
      float* values = stripe.rows.Values(slots[k]);
      if (before != nullptr) std::memcpy(before + i * dim_, values, dim_ * sizeof(float));
      float* const row_slots[2] = {values + dim_, values + 2 * dim_};
      kernels::cpu::ApplyOptimizer(optimizer_, hyper, grads + i * dim_, dim_, values, row_slots);
    }
    Unpin(stripe, &slots[begin], end - begin);
  }
  return status;
}

SparseTable::Snapshot SparseTable::TakeSnapshot() const {
  Snapshot snapshot;
  snapshot.dim = dim_;
  snapshot.slots = num_slots_;
  const int64_t row_floats = dim_ * (1 + num_slots_);
  // Gathered stripe by stripe, then sorted by id.
  std::vector<int64_t> ids;
  std::vector<float> data;
  std::vector<int64_t> updates;
  std::vector<int64_t> touches;
  const int num_stripes = 1 << stripe_bits_;
  for (int s = 0; s < num_stripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    const StripeRows& rows = stripe.rows;
    ids.reserve(ids.size() + rows.rows());
    data.reserve(data.size() + rows.rows() * row_floats);
    rows.ForEachRow([&](uint32_t slot) {
      const RowMeta& meta = rows.Meta(slot);
      ids.push_back(meta.id);
      updates.push_back(meta.updates);
      touches.push_back(meta.touches);
      const float* values = rows.Values(slot);
      data.insert(data.end(), values, values + row_floats);
    });
  }
  const size_t n = ids.size();
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
  snapshot.ids.resize(n);
  snapshot.values.resize(n * dim_);
  snapshot.slot_values.resize(n * dim_ * num_slots_);
  snapshot.updates.resize(n);
  snapshot.touches.resize(n);
  const size_t row_bytes = sizeof(float) * dim_;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t from = order[k];
    snapshot.ids[k] = ids[from];
    snapshot.updates[k] = updates[from];
    snapshot.touches[k] = touches[from];
    const float* row = &data[from * row_floats];
    std::memcpy(&snapshot.values[k * dim_], row, row_bytes);
    for (int j = 0; j < num_slots_; ++j) {
      std::memcpy(&snapshot.slot_values[(j * n + k) * dim_], row + (j + 1) * dim_, row_bytes);
    }
  }
  return snapshot;
}

absl::Status SparseTable::Restore(const Snapshot& snapshot) {
  if (snapshot.dim != dim_) {
    return absl::InvalidArgumentError(TableError(
        name_,
        absl::StrCat("the snapshot's rows have dim ", snapshot.dim, ", the table's ", dim_)));
  }
  if (snapshot.slots != num_slots_) {
    return absl::InvalidArgumentError(TableError(
        name_, absl::StrCat("the snapshot keeps ", snapshot.slots,
                            " optimizer slots per row, the table's optimizer ", num_slots_)));
  }
  const size_t n = snapshot.ids.size();
  if (snapshot.values.size() != n * dim_ || snapshot.slot_values.size() != n * dim_ * num_slots_ ||
      snapshot.updates.size() != n || snapshot.touches.size() != n) {
    return absl::InvalidArgumentError(TableError(
        name_,
        absl::StrCat("the snapshot of ", n, " rows holds ", snapshot.values.size(), " values, ",
                     snapshot.slot_values.size(), " slot values, ", snapshot.updates.size(),
                     " update counts and ", snapshot.touches.size(), " touch counts")));
  }
  for (size_t k = 0; k < n; ++k) {
    if ((k > 0 && snapshot.ids[k] <= snapshot.ids[k - 1]) || snapshot.updates[k] < 0 ||
        snapshot.touches[k] < 0) {
      return absl::InvalidArgumentError(
          TableError(name_, absl::StrCat("the snapshot's row ", k, " (id ", snapshot.ids[k],
                                         ") is out of order or has a negative count")));
    }
  }

  // Each stripe's rows in the order they are inserted: by touch count, ties
  // by id; past its max_rows share, the least touched are dropped.
  const int num_stripes = 1 << stripe_bits_;
  const int shift = 64 - stripe_bits_;
  std::vector<std::vector<uint32_t>> members(num_stripes);
  for (size_t k = 0; k < n; ++k) {
    const int s = stripe_bits_ == 0 ? 0 : static_cast<int>(IdHash(snapshot.ids[k]) >> shift);
    members[s].push_back(static_cast<uint32_t>(k));
  }
  int64_t dropped = 0;
  int64_t new_bytes = fixed_bytes_;
  std::vector<size_t> first(num_stripes, 0);
  for (int s = 0; s < num_stripes; ++s) {
    std::vector<uint32_t>& rows = members[s];
    std::stable_sort(rows.begin(), rows.end(), [&](uint32_t a, uint32_t b) {
      return snapshot.touches[a] < snapshot.touches[b];
    });
    const uint32_t max_slots = stripes_[s].rows.max_slots();
    if (rows.size() > max_slots) first[s] = rows.size() - max_slots;
    dropped += static_cast<int64_t>(first[s]);
    const RowShape shape = ShapeOf(dim_, num_slots_, max_rows_, eviction_);
    new_bytes +=
        StripeRows::BytesFor(shape, max_slots, static_cast<uint32_t>(rows.size() - first[s]));
  }

  for (int s = 0; s < num_stripes; ++s) stripes_[s].mu.Lock();
  const int64_t old_bytes = bytes_.load(std::memory_order_relaxed);
  if (budget_ != nullptr && new_bytes > old_bytes && !budget_->TryReserve(new_bytes - old_bytes)) {
    for (int s = num_stripes; s-- > 0;) stripes_[s].mu.Unlock();
    return absl::ResourceExhaustedError(
        absl::StrCat("shard memory limit of ", budget_->limit(), " bytes reached: table ", name_,
                     " holds ", rows(), " rows (", old_bytes, " bytes) and its snapshot of ",
                     n - dropped, " rows needs ", new_bytes,
                     " bytes; raise --memory_limit, add shards or set max_rows on the table to "
                     "evict"));
  }
  if (budget_ != nullptr && new_bytes < old_bytes) budget_->Release(old_bytes - new_bytes);

  const size_t row_bytes = sizeof(float) * dim_;
  for (int s = 0; s < num_stripes; ++s) {
    StripeRows& rows = stripes_[s].rows;
    rows.Reset();
    const std::vector<uint32_t>& order = members[s];
    uint32_t last_bucket = kNone;
    for (size_t m = first[s]; m < order.size(); ++m) {
      const uint32_t k = order[m];
      const int64_t id = snapshot.ids[k];
      uint32_t slot = rows.PopFree();
      if (slot == kNone) {
        rows.Grow();
        slot = rows.PopFree();
      }
      RowMeta& meta = rows.Meta(slot);
      meta.updates = snapshot.updates[k];
      float* values = rows.Values(slot);
      std::memcpy(values, &snapshot.values[k * dim_], row_bytes);
      for (int j = 0; j < num_slots_; ++j) {
        std::memcpy(values + (j + 1) * dim_, &snapshot.slot_values[(j * n + k) * dim_], row_bytes);
      }
      const uint32_t touches =
          static_cast<uint32_t>(std::clamp<int64_t>(snapshot.touches[k], 1, int64_t{kMaxTouches}));
      rows.Insert(slot, id, IdHash(id), touches, &last_bucket);
    }
  }
  rows_.store(static_cast<int64_t>(n) - dropped, std::memory_order_relaxed);
  evictions_.fetch_add(dropped, std::memory_order_relaxed);
  bytes_.store(new_bytes, std::memory_order_relaxed);
  for (int s = num_stripes; s-- > 0;) stripes_[s].mu.Unlock();
  return absl::OkStatus();
}

}  // namespace downpour
