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

namespace downpour {
namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

// Stripes: up to 1 << kMaxStripeBits, each holding at least
// kMinRowsPerStripe rows of max_rows (see the header comment).
constexpr int kMaxStripeBits = 6;
constexpr int64_t kMinRowsPerStripe = 64;

// Block b of a stripe's slab holds 16 << b rows up to 4096, then 4096 each.
constexpr int kFirstBlockBits = 4;
constexpr int kMaxBlockBits = 12;
constexpr int kGeometricBlocks = kMaxBlockBits - kFirstBlockBits + 1;
constexpr uint32_t kGeometricSlots = (1u << (kMaxBlockBits + 1)) - (1u << kFirstBlockBits);

// An index entry is (tag << 24) | (slot + 1), 0 when empty: a stripe holds
// fewer than 2^24 slots.
constexpr int kSlotBits = 24;
constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
constexpr uint32_t kMaxStripeSlots = kSlotMask;
// Bits of the id's hash: the stripe is the top stripe_bits, the tag the 8
// below bit 58, the index position the low bits: independent of each other.
constexpr int kTagShift = 50;

constexpr uint32_t kMaxTouches = std::numeric_limits<uint32_t>::max();
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxIdsPerCall = std::numeric_limits<int32_t>::max();

// Not SplitMix64(id) itself: the caller may shard ids by a hash like it,
// which would leave a shard's ids alike in the low bits the index uses.
inline uint64_t IdHash(int64_t id) {
  return SplitMix64(static_cast<uint64_t>(id) ^ 0x6a09e667f3bcc909ULL);
}

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

// The smallest power of two (at least 8) with `slots` at most 3/4 of it.
uint32_t IndexCapacityFor(uint64_t slots) {
  uint64_t capacity = 8;
  while (capacity * 3 < slots * 4) capacity *= 2;
  return static_cast<uint32_t>(capacity);
}

uint32_t NominalBlockRows(size_t block) {
  return block < kGeometricBlocks ? 1u << (kFirstBlockBits + block) : 1u << kMaxBlockBits;
}

// A row's metadata, at the start of its record.
struct RowMeta {
  int64_t id;
  int64_t updates;  // Optimizer updates applied (Adam's t).
  uint32_t prev;    // Eviction order (LRU list; LFU: within its bucket).
  uint32_t next;    // Likewise; the free list links free slots by it.
  uint32_t touches;
  uint32_t bucket : 31;  // LFU: the bucket of its touch count.
  uint32_t pinned : 1;   // Touched by the call holding the stripe's lock.
};
static_assert(sizeof(RowMeta) == 32, "RowMeta is 32 bytes");

// LFU: the rows touched `count` times, in the order of their last touch.
// Bucket nodes live in the records (node k in slot k's) and are taken from
// a free list: there are never more buckets than rows.
struct Bucket {
  uint32_t count;
  uint32_t head;  // Least recently touched.
  uint32_t tail;
  uint32_t prev;  // Buckets in increasing count.
  uint32_t next;
};

// What a row record holds, the same for every stripe of a table.
struct RowShape {
  int64_t dim = 0;
  int num_slots = 0;
  bool lfu = false;
  size_t values_offset = 0;  // After RowMeta (and the Bucket for LFU).
  size_t stride = 0;         // Record bytes, a multiple of 8.

  RowShape() = default;
  RowShape(int64_t dim, int num_slots, bool lfu)
      : dim(dim),
        num_slots(num_slots),
        lfu(lfu),
        values_offset(sizeof(RowMeta) + (lfu ? sizeof(Bucket) : 0)),
        stride((values_offset + sizeof(float) * dim * (1 + num_slots) + 7) / 8 * 8) {}
};

// One stripe's rows: slab, index and eviction order. Thread-compatible (its
// stripe's lock serialises every call).
class StripeRows {
 public:
  // Before any other call.
  void Configure(const RowShape& shape, uint32_t max_slots) {
    shape_ = shape;
    max_slots_ = max_slots;
  }
  uint32_t max_slots() const { return max_slots_; }

  int64_t bytes() const { return bytes_; }
  uint32_t rows() const { return rows_; }

  RowMeta& Meta(uint32_t slot) const { return *reinterpret_cast<RowMeta*>(Record(slot)); }
  float* Values(uint32_t slot) const {
    return reinterpret_cast<float*>(Record(slot) + shape_.values_offset);
  }

  // The slot of row `id` (hash IdHash(id)), or kNone.
  uint32_t Find(int64_t id, uint64_t hash) const {
    if (index_mask_ == 0) return kNone;
    const uint32_t tag = static_cast<uint32_t>(hash >> kTagShift) & 0xff;
    for (uint32_t pos = static_cast<uint32_t>(hash) & index_mask_;; pos = (pos + 1) & index_mask_) {
      const uint32_t entry = index_[pos];
      if (entry == 0) return kNone;
      if ((entry >> kSlotBits) == tag) {
        const uint32_t slot = (entry & kSlotMask) - 1;
        if (Meta(slot).id == id) return slot;
      }
    }
  }

  // What a Find of `hash` and a Touch will read, to prefetch in three
  // stages, each once the one before is in cache: the index entry; the
  // first `bytes` of the row it names (most likely the row); the rows next
  // to it in the eviction order (LRU) or its bucket (LFU). `whole`: the
  // optimizer slots too, else up to the values.
  void Prefetch(int stage, uint64_t hash, bool whole) const {
    if (index_mask_ == 0) return;
    const uint32_t* entry = &index_[static_cast<uint32_t>(hash) & index_mask_];
    if (stage == 0 || *entry == 0) {
      __builtin_prefetch(entry);
      return;
    }
    const uint32_t slot = (*entry & kSlotMask) - 1;
    const std::byte* record = Record(slot);
    if (stage == 1) {
      const size_t bytes =
          whole ? shape_.stride : shape_.values_offset + sizeof(float) * shape_.dim;
      for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(record + line);
      return;
    }
    const RowMeta& meta = Meta(slot);
    if (shape_.lfu) {
      __builtin_prefetch(&BucketAt(meta.bucket));
      return;
    }
    if (meta.prev != kNone) __builtin_prefetch(Record(meta.prev));
    if (meta.next != kNone) __builtin_prefetch(Record(meta.next));
  }

  // A free slot: one freed before, else the lowest never used; kNone when
  // every slot holds a row.
  uint32_t PopFree() {
    const uint32_t slot = free_head_;
    if (slot == kNone) return unused_ < slots_ ? unused_++ : kNone;
    free_head_ = Meta(slot).next;
    return slot;
  }
  void PushFree(uint32_t slot) {
    Meta(slot).next = free_head_;
    free_head_ = slot;
  }

  // The slab grows by a block (and the index with it) while below max_slots.
  bool CanGrow() const { return slots_ < max_slots_; }
  int64_t GrowBytes() const {
    const uint32_t rows = NextBlockRows();
    return static_cast<int64_t>(rows) * shape_.stride +
           IndexBytes(IndexCapacityFor(uint64_t{slots_} + rows)) - IndexBytes(index_mask_ + 1);
  }
  // Adds a block of unused slots. Not zeroed, nor written: a slot is
  // written when it is first used (so a block's pages are touched as it
  // fills).
  void Grow() {
    const uint32_t rows = NextBlockRows();
    blocks_.emplace_back(new std::byte[static_cast<size_t>(rows) * shape_.stride]);
    slots_ += rows;
    const uint32_t capacity = IndexCapacityFor(slots_);
    if (capacity != index_mask_ + 1) Rehash(capacity);
    bytes_ += static_cast<int64_t>(rows) * shape_.stride;
  }

  // The bytes a stripe holding `rows` rows from empty would hold.
  static int64_t BytesFor(const RowShape& shape, uint32_t max_slots, uint32_t rows) {
    if (rows == 0) return 0;
    int64_t bytes = 0;
    uint32_t slots = 0;
    for (size_t block = 0; slots < rows; ++block) {
      const uint32_t add = std::min(NominalBlockRows(block), max_slots - slots);
      bytes += static_cast<int64_t>(add) * shape.stride;
      slots += add;
    }
    return bytes + IndexBytes(IndexCapacityFor(slots));
  }

  // Makes the stripe empty, freeing its memory.
  void Reset() {
    blocks_.clear();
    slots_ = unused_ = unused_bucket_ = 0;
    rows_ = 0;
    free_head_ = kNone;
    index_.reset();
    index_mask_ = 0;
    lru_head_ = lru_tail_ = kNone;
    bucket_head_ = free_bucket_ = kNone;
    bytes_ = 0;
  }

  // Makes `slot` (taken from PopFree or a victim) row `id`, touched
  // `touches` times, most recently. For LFU, `last_bucket` (kNone, or the
  // bucket of the row inserted before) says the row goes after every other:
  // Restore inserts rows in increasing touch count.
  void Insert(uint32_t slot, int64_t id, uint64_t hash, uint32_t touches,
              uint32_t* last_bucket = nullptr) {
    RowMeta& meta = Meta(slot);
    meta.id = id;
    meta.touches = touches;
    meta.pinned = 0;
    uint32_t pos = static_cast<uint32_t>(hash) & index_mask_;
    while (index_[pos] != 0) pos = (pos + 1) & index_mask_;
    index_[pos] = ((static_cast<uint32_t>(hash >> kTagShift) & 0xff) << kSlotBits) | (slot + 1);
    ++rows_;
    if (!shape_.lfu) {
      ListPushBack(&lru_head_, &lru_tail_, slot);
    } else {
      // A new row (1 touch, the fewest) joins the first bucket.
      const uint32_t after = last_bucket != nullptr ? *last_bucket : kNone;
      uint32_t bucket = last_bucket != nullptr ? after : bucket_head_;
      if (bucket == kNone || BucketAt(bucket).count != touches) {
        bucket = NewBucketAfter(after, touches);
      }
      AddToBucket(bucket, slot);
      if (last_bucket != nullptr) *last_bucket = bucket;
    }
  }

  // Takes the row in `slot` out of the index and the eviction order; the
  // slot is the caller's to reuse or free.
  void Remove(uint32_t slot) {
    RowMeta& meta = Meta(slot);
    EraseFromIndex(meta.id, slot);
    --rows_;
    if (!shape_.lfu) {
      ListRemove(&lru_head_, &lru_tail_, slot);
    } else {
      const uint32_t bucket = meta.bucket;
      Bucket& node = BucketAt(bucket);
      ListRemove(&node.head, &node.tail, slot);
      if (node.head == kNone) FreeBucket(bucket);
    }
    meta.pinned = 0;
  }

  // One more touch of the row in `slot`: it becomes the most recently
  // touched (of its new count, for LFU).
  void Touch(uint32_t slot) {
    RowMeta& meta = Meta(slot);
    const bool saturated = meta.touches == kMaxTouches;
    if (!saturated) ++meta.touches;
    if (!shape_.lfu) {
      if (lru_tail_ == slot) return;
      ListRemove(&lru_head_, &lru_tail_, slot);
      ListPushBack(&lru_head_, &lru_tail_, slot);
      return;
    }
    const uint32_t from = meta.bucket;
    Bucket& node = BucketAt(from);
    uint32_t to = from;
    if (!saturated) {
      to = node.next;
      if (to == kNone || BucketAt(to).count != meta.touches) {
        if (node.head == slot && node.tail == slot) {
          // Alone in its bucket: the bucket moves up with it. (Also what
          // keeps the buckets no more than the rows.)
          node.count = meta.touches;
          return;
        }
        to = NewBucketAfter(from, meta.touches);
      }
    }
    ListRemove(&node.head, &node.tail, slot);
    AddToBucket(to, slot);
    if (node.head == kNone) FreeBucket(from);
  }

  // The row eviction takes next: the least recently (LRU) or least often,
  // then least recently (LFU), touched that the call in progress has not
  // pinned; kNone when there is none. The call touched every row it pinned,
  // so they are the most recent of their list: a list whose first row is
  // pinned has no other.
  uint32_t Victim() const {
    if (!shape_.lfu) return lru_head_ != kNone && !Meta(lru_head_).pinned ? lru_head_ : kNone;
    for (uint32_t bucket = bucket_head_; bucket != kNone; bucket = BucketAt(bucket).next) {
      const uint32_t slot = BucketAt(bucket).head;
      if (!Meta(slot).pinned) return slot;
    }
    return kNone;
  }

  // Calls f(slot) for each row.
  template <typename F>
  void ForEachRow(F f) const {
    if (index_mask_ == 0) return;
    for (uint32_t pos = 0; pos <= index_mask_; ++pos) {
      if (index_[pos] != 0) f((index_[pos] & kSlotMask) - 1);
    }
  }

 private:
  static int64_t IndexBytes(uint32_t capacity) {
    return capacity <= 1 ? 0 : static_cast<int64_t>(capacity) * sizeof(uint32_t);
  }

  uint32_t NextBlockRows() const {
    return std::min(NominalBlockRows(blocks_.size()), max_slots_ - slots_);
  }

  std::byte* Record(uint32_t slot) const {
    uint32_t block;
    uint32_t offset;
    if (slot < kGeometricSlots) {
      const uint32_t q = (slot >> kFirstBlockBits) + 1;
      block = 31 - __builtin_clz(q);
      offset = slot - ((1u << (kFirstBlockBits + block)) - (1u << kFirstBlockBits));
    } else {
      const uint32_t rest = slot - kGeometricSlots;
      block = kGeometricBlocks + (rest >> kMaxBlockBits);
      offset = rest & ((1u << kMaxBlockBits) - 1);
    }
    return blocks_[block].get() + static_cast<size_t>(offset) * shape_.stride;
  }

  Bucket& BucketAt(uint32_t node) const {
    return *reinterpret_cast<Bucket*>(Record(node) + sizeof(RowMeta));
  }

  void Rehash(uint32_t capacity) {
    std::unique_ptr<uint32_t[]> old = std::move(index_);
    const uint32_t old_capacity = index_mask_ + 1;
    index_ = std::make_unique<uint32_t[]>(capacity);  // Zeroed: empty.
    const uint32_t old_mask = index_mask_;
    index_mask_ = capacity - 1;
    bytes_ += IndexBytes(capacity) - IndexBytes(old_capacity);
    if (old_mask == 0) return;
    for (uint32_t i = 0; i <= old_mask; ++i) {
      const uint32_t entry = old[i];
      if (entry == 0) continue;
      uint32_t pos = static_cast<uint32_t>(IdHash(Meta((entry & kSlotMask) - 1).id)) & index_mask_;
      while (index_[pos] != 0) pos = (pos + 1) & index_mask_;
      index_[pos] = entry;
    }
  }

  // Linear probing's deletion by backward shift: each entry after the hole,
  // up to the next empty one, moves into the hole unless its home lies
  // cyclically in (hole, entry].
  void EraseFromIndex(int64_t id, uint32_t slot) {
    uint32_t hole = static_cast<uint32_t>(IdHash(id)) & index_mask_;
    while ((index_[hole] & kSlotMask) != slot + 1) hole = (hole + 1) & index_mask_;
    for (uint32_t pos = (hole + 1) & index_mask_;; pos = (pos + 1) & index_mask_) {
      const uint32_t entry = index_[pos];
      if (entry == 0) break;
      const uint32_t home =
          static_cast<uint32_t>(IdHash(Meta((entry & kSlotMask) - 1).id)) & index_mask_;
      const bool stays = hole <= pos ? (hole < home && home <= pos) : (hole < home || home <= pos);
      if (!stays) {
        index_[hole] = entry;
        hole = pos;
      }
    }
    index_[hole] = 0;
  }

  void ListPushBack(uint32_t* head, uint32_t* tail, uint32_t slot) {
    RowMeta& meta = Meta(slot);
    meta.prev = *tail;
    meta.next = kNone;
    (*tail != kNone ? Meta(*tail).next : *head) = slot;
    *tail = slot;
  }

  void ListRemove(uint32_t* head, uint32_t* tail, uint32_t slot) {
    const RowMeta& meta = Meta(slot);
    (meta.prev != kNone ? Meta(meta.prev).next : *head) = meta.next;
    (meta.next != kNone ? Meta(meta.next).prev : *tail) = meta.prev;
  }

  void AddToBucket(uint32_t bucket, uint32_t slot) {
    Bucket& node = BucketAt(bucket);
    ListPushBack(&node.head, &node.tail, slot);
    Meta(slot).bucket = bucket;
  }

  // A bucket of `count` after `after` (kNone: first). There is always a free
  // node: buckets are never empty, so never more than the rows.
  uint32_t NewBucketAfter(uint32_t after, uint32_t count) {
    uint32_t bucket = free_bucket_;
    if (bucket == kNone) {
      bucket = unused_bucket_++;
    } else {
      free_bucket_ = BucketAt(bucket).next;
    }
    Bucket& node = BucketAt(bucket);
    node.count = count;
    node.head = node.tail = kNone;
    node.prev = after;
    node.next = after == kNone ? bucket_head_ : BucketAt(after).next;
    if (node.next != kNone) BucketAt(node.next).prev = bucket;
    (after != kNone ? BucketAt(after).next : bucket_head_) = bucket;
    return bucket;
  }

  void FreeBucket(uint32_t bucket) {
    Bucket& node = BucketAt(bucket);
    (node.prev != kNone ? BucketAt(node.prev).next : bucket_head_) = node.next;
    if (node.next != kNone) BucketAt(node.next).prev = node.prev;
    node.next = free_bucket_;
    free_bucket_ = bucket;
  }

  RowShape shape_;
  uint32_t max_slots_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  uint32_t slots_ = 0;          // In the blocks, free or not.
  uint32_t unused_ = 0;         // Slots from here on were never used.
  uint32_t unused_bucket_ = 0;  // Likewise for LFU bucket nodes.
  uint32_t rows_ = 0;
  uint32_t free_head_ = kNone;
  std::unique_ptr<uint32_t[]> index_;
  uint32_t index_mask_ = 0;    // Capacity - 1; 0 before the first block.
  uint32_t lru_head_ = kNone;  // Least recently touched.
  uint32_t lru_tail_ = kNone;
  uint32_t bucket_head_ = kNone;  // LFU: the least count.
  uint32_t free_bucket_ = kNone;
  int64_t bytes_ = 0;  // Blocks and index.
};

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
  switch (options.optimizer) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kAdam:
      break;
    case OptimizerKind::kMomentum:
      return absl::InvalidArgumentError(
          TableError(table, "MOMENTUM is not offered for sparse tables; use SGD, ADAGRAD or ADAM"));
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
      init_scale_(options.init_scale),
      seed_(options.seed),
      max_rows_(options.max_rows),
      eviction_(options.eviction),
      budget_(options.budget),
      stripe_bits_(stripe_bits),
      num_slots_(NumOptimizerSlots(options.optimizer)),
      fixed_bytes_(static_cast<int64_t>(sizeof(SparseTable) + (sizeof(Stripe) << stripe_bits))),
      stripes_(std::make_unique<Stripe[]>(size_t{1} << stripe_bits)) {
  const RowShape shape(dim_, num_slots_, eviction_ == EvictionPolicy::kLfu);
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
    rows.Meta(slot).pinned = 1;
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
      rows.Meta(slot).pinned = 1;
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
    if (slots[k - begin] != kNone) rows.Meta(slots[k - begin]).pinned = 0;
  }
  return false;
}

void SparseTable::Unpin(Stripe& stripe, const uint32_t* slots, uint32_t count) {
  for (uint32_t c = 0; c < count; ++c) stripe.rows.Meta(slots[c]).pinned = 0;
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

absl::Status SparseTable::Apply(const int64_t* ids, int64_t n, const float* grads,
                                float learning_rate) {
  absl::Status status = CheckCount(name_, n);
  if (!status.ok() || n == 0) return status;
  Grouping grouping;
  GroupByStripe(ids, n, &grouping);
  std::vector<uint32_t> slots(n);
  std::vector<int64_t> created;
  OptimizerHyperparams hyper = hyper_;
  hyper.learning_rate = learning_rate;
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
    const RowShape shape(dim_, num_slots_, eviction_ == EvictionPolicy::kLfu);
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
