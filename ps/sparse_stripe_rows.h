// The rows of one stripe of a SparseTable (ps/sparse_table.h): a slab of
// row records, an open-addressing index over them and their eviction order
// (LRU list or LFU frequency buckets); the layout is the table's header
// comment's. Private to the table's implementation (ps/sparse_table.cc);
// nothing else includes it. Inline, as the table's hot path runs through it.
//
// Thread-safety: thread-compatible (the stripe's lock serialises every call).
// Ownership: a StripeRows owns its blocks and index.
#ifndef DOWNPOUR_PS_SPARSE_STRIPE_ROWS_H_
#define DOWNPOUR_PS_SPARSE_STRIPE_ROWS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "common/splitmix64.h"

namespace downpour {
namespace sparse_internal {

inline constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

// Block b of a stripe's slab holds 16 << b rows up to 4096, then 4096 each.
inline constexpr int kFirstBlockBits = 4;
inline constexpr int kMaxBlockBits = 12;
inline constexpr int kGeometricBlocks = kMaxBlockBits - kFirstBlockBits + 1;
inline constexpr uint32_t kGeometricSlots = (1u << (kMaxBlockBits + 1)) - (1u << kFirstBlockBits);

// An index entry is (tag << 24) | (slot + 1), 0 when empty: a stripe holds
// fewer than 2^24 slots.
inline constexpr int kSlotBits = 24;
inline constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
inline constexpr uint32_t kMaxStripeSlots = kSlotMask;
// Bits of the id's hash: the stripe is the top stripe_bits, the tag the 8
// below bit 58, the index position the low bits: independent of each other.
inline constexpr int kTagShift = 50;

inline constexpr uint32_t kMaxTouches = std::numeric_limits<uint32_t>::max();

// Not SplitMix64(id) itself: the caller may shard ids by a hash like it,
// which would leave a shard's ids alike in the low bits the index uses.
inline uint64_t IdHash(int64_t id) {
  return SplitMix64(static_cast<uint64_t>(id) ^ 0x6a09e667f3bcc909ULL);
}

// The smallest power of two (at least 8) with `slots` at most 3/4 of it.
inline uint32_t IndexCapacityFor(uint64_t slots) {
  uint64_t capacity = 8;
  while (capacity * 3 < slots * 4) capacity *= 2;
  return static_cast<uint32_t>(capacity);
}

inline uint32_t NominalBlockRows(size_t block) {
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
  // Whether rows are kept in an eviction order (a table that evicts: one of
  // max_rows); one that never evicts only counts its rows' touches.
  bool ordered = true;
  bool lfu = false;          // The order is LFU's (else LRU's).
  size_t values_offset = 0;  // After RowMeta (and the Bucket for LFU).
  size_t stride = 0;         // Record bytes, a multiple of 8.

  RowShape() = default;
  RowShape(int64_t dim, int num_slots, bool ordered, bool lfu)
      : dim(dim),
        num_slots(num_slots),
        ordered(ordered),
        lfu(ordered && lfu),
        values_offset(sizeof(RowMeta) + (this->lfu ? sizeof(Bucket) : 0)),
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
    if (!shape_.ordered) return;
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
    if (!shape_.ordered) return;
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
    meta.pinned = 0;
    if (!shape_.ordered) return;
    if (!shape_.lfu) {
      ListRemove(&lru_head_, &lru_tail_, slot);
    } else {
      const uint32_t bucket = meta.bucket;
      Bucket& node = BucketAt(bucket);
      ListRemove(&node.head, &node.tail, slot);
      if (node.head == kNone) FreeBucket(bucket);
    }
  }

  // The row in `slot` may not be evicted until unpinned (by the call that
  // reads it); nothing to mark where nothing is evicted.
  void Pin(uint32_t slot) {
    if (shape_.ordered) Meta(slot).pinned = 1;
  }
  void Unpin(uint32_t slot) {
    if (shape_.ordered) Meta(slot).pinned = 0;
  }
  bool ordered() const { return shape_.ordered; }

  // One more touch of the row in `slot`: it becomes the most recently
  // touched (of its new count, for LFU).
  void Touch(uint32_t slot) {
    RowMeta& meta = Meta(slot);
    const bool saturated = meta.touches == kMaxTouches;
    if (!saturated) ++meta.touches;
    if (!shape_.ordered) return;
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
    if (!shape_.ordered) return kNone;
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

}  // namespace sparse_internal
}  // namespace downpour

#endif  // DOWNPOUR_PS_SPARSE_STRIPE_ROWS_H_
