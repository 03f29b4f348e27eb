// SparseTable: a parameter shard's rows of one sparse embedding table
// (proto/job.proto, EmbeddingLayer with sparse: true). The caller shards a
// table's ids over the shards by id hash; this is one shard's share. Rows are
// created on first touch (InitSparseRow: the same values wherever and
// whenever they are created), read by Lookup, updated row-wise by SGD,
// Adagrad or Adam with each row's own optimizer state (Apply), and evicted
// past max_rows or when the shard's MemoryBudget refuses more memory. A touch
// is a row's every appearance in a Lookup or an Apply.
//
// Layout: the table is split into stripes by a hash of the id (64, or fewer
// for a small max_rows so that a stripe holds at least 64 rows: one stripe
// below max_rows 128). Each stripe has its own lock, its own index, its own
// slab of rows and its own eviction order, and max_rows is split evenly over
// the stripes: eviction is per stripe, so the evicted row is the least
// recently (LRU) or least often (LFU) touched of its stripe, approximately
// that of the table; exactly so below max_rows 128.
// - Slab: a stripe's rows live in blocks of 16, 32, ... doubling up to 4096
//   rows (so a small table stays small), never moved; a row is a record of
//   32 bytes of metadata (id, update count, touches, eviction links), for LFU
//   a 20-byte frequency-bucket node, then its values and optimizer slots
//   (Adagrad's accumulator; Adam's m and v), dim floats each, contiguous.
//   Freed slots are reused through a free list; a new block's slots are
//   taken in order, not written before.
// - Index: open addressing with linear probing over 4-byte entries (the
//   slot, and 8 bits of the id's hash so most probes of other ids end without
//   reading their row), at most 3/4 full, deleted by backward shift (no
//   tombstones). It grows with the slab, so a row's creation never rehashes.
// - LRU: an intrusive doubly linked list of the stripe's rows. LFU: the O(1)
//   frequency buckets of Shah, Mitra and Matani: one node per distinct touch
//   count in increasing order, each with the list of its rows in the order of
//   their last touch, so the evicted row is the exact minimum of
//   (touches, last touch) of its stripe, found without a scan. A table
//   without max_rows never evicts and keeps neither (a touch then only counts:
//   relinking a row's neighbours was a tenth of a shard's CPU per row).
//
// Per row, with Adam: dim 16: 224 bytes of record (LFU with max_rows 248),
// dim 64: 800 (824), plus 5.3 to 10.7 bytes of index (4 bytes per entry at
// 3/8 to 3/4 full); the values alone are 64 and 256 bytes. A stripe's last
// block may hold up to 4096 free slots, reserved but unused.
//
// Memory: the table reserves from the budget what it allocates, a block and
// any index growth at a time, and releases it all when destroyed; bytes() is
// what it holds, all reserved: the fixed part, blocks (free slots included)
// and indexes. Blocks and indexes grow but are not shrunk until destruction
// or Restore: an evicted row's slot is reused by the next row created.
// Not counted: an Adam table's bias corrections by step count, shared by
// the process's tables of the same betas (AdamBiasTable, at most 1 MiB).
//
// A call that cannot get a slot (max_rows == 0, so the table does not evict,
// and the budget refuses; or every row its stripe could evict is one this
// call touches) fails with ResourceExhausted and removes the rows it created
// again; the rows it touched are touched, the rows it evicted stay evicted,
// and a block it grew stays as free slots. Apply creates a stripe's missing
// rows before updating any of its rows, but stripes are taken in turn: when
// a later stripe fails, the earlier ones' gradients have been applied (a
// non-evicting table's Apply creates only rows not looked up before, or
// dropped by a failed Lookup or a Restore; an evicting one fails only
// without a row to evict).
//
// Speed: a call is bound by memory latency, so it prefetches each id's index
// entry, row and eviction neighbours a few ids ahead. sparse_table_test's
// ThroughputOfLookupAndApply prints the rows per second of Lookup and Apply
// (dim 16, Adam, Zipf-distributed ids).
//
// Thread-safety: thread-safe. A call groups its ids by stripe and takes each
// stripe's lock once (Peek's too), one stripe at a time, so calls on different stripes run
// in parallel, and a call's update of one row is atomic against others'
// reads. TakeSnapshot reads the stripes in turn: consistent per stripe, and
// for the table when no Apply runs meanwhile; Restore takes every stripe's
// lock. Ownership: the table owns its rows and state; the budget is borrowed
// and must outlive the table.
#ifndef DOWNPOUR_PS_SPARSE_TABLE_H_
#define DOWNPOUR_PS_SPARSE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer.h"
#include "ps/memory_budget.h"

namespace downpour {

enum class EvictionPolicy { kLru, kLfu };

struct SparseTableOptions {
  std::string name;  // "<layer>/table", for messages.
  int64_t dim = 0;   // > 0.
  // kSgd, kAdagrad or kAdam: sparse tables offer no MOMENTUM
  // (CheckSparseTableOptimizerKind in spec/model_shape.h, which SparseStore
  // applies).
  OptimizerKind optimizer = OptimizerKind::kSgd;
  // learning_rate is replaced per Apply call, step by the row's update
  // count; beta1/2, epsilon and weight_decay are used.
  OptimizerHyperparams hyper;
  float init_scale = 0;  // Rows init uniform in [-init_scale, init_scale]; must be > 0.
  uint64_t seed = 0;     // The job's seed.
  int64_t max_rows = 0;  // This shard's share of the table's bound; 0: none.
  EvictionPolicy eviction = EvictionPolicy::kLru;
  MemoryBudget* budget = nullptr;  // May be null (no limit); not owned.
};

// The initial value of row `id` of the table named `table_name` for `seed`:
// dim values uniform in [-scale, scale] drawn from SplitMix64 keyed by (seed,
// a 64-bit FNV-1a hash of table_name, id). A pure function: the same
// wherever, whenever and in whatever order rows are created (so a row
// evicted and touched again starts afresh from the same values, and tests
// can compute it).
void InitSparseRow(uint64_t seed, const std::string& table_name, int64_t id, float scale,
                   int64_t dim, float* out);

class SparseTable {
 public:
  // InvalidArgument, naming the table and the field, for options out of
  // range; ResourceExhausted when the budget refuses the table's fixed part.
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(const SparseTableOptions& options);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  // Writes the rows of ids[0..n) to out[n * dim], creating missing ones
  // (InitSparseRow); ids may repeat. Creating a row takes a free slot, or
  // grows the slab (reserving from the budget), or, when the budget refuses
  // or max_rows is reached, evicts a row by the policy (only rows of this
  // table, never a row this same call touches) and reuses its slot. When
  // nothing can be evicted (max_rows == 0: the table does not evict),
  // ResourceExhausted: "shard memory limit of N bytes reached: table T holds
  // R rows (B bytes); raise --memory_limit, add shards or set max_rows on the
  // table to evict", with the rows this call created removed again (see the
  // header comment); `out` is then unspecified.
  absl::Status Lookup(const int64_t* ids, int64_t n, float* out);

  // Writes the rows of ids[0..n) to out[n * dim] without changing the
  // table (an evaluation's read): a row that exists is copied under its
  // stripe's lock and not touched; one that does not is written as it would
  // be created (InitSparseRow), and is not created. Never evicts, never
  // reserves memory. InvalidArgument only for n out of range.
  absl::Status Peek(const int64_t* ids, int64_t n, float* out) const;

  // Applies gradients grads[n * dim] to rows ids[0..n) with the table's
  // optimizer at `learning_rate`, each row with its own optimizer state
  // (Adagrad's accumulator; Adam's m, v and its update count t for the bias
  // correction, 1 at the row's first update), by the reference updates of
  // kernels/cpu/optimizer.h: a row updates to the same bits as a dense array
  // of dim elements would. A row that does not exist (evicted since it was
  // read) is created first, as Lookup would. Ids should be unique in one
  // call; a repeated id is updated once per appearance, in order. With
  // `before` (n * dim floats), each row's values just before its update
  // are written there in the order of ids (a created row's as created: what
  // Peek read before the call).
  absl::Status Apply(const int64_t* ids, int64_t n, const float* grads, float learning_rate,
                     float* before = nullptr);

  int64_t rows() const { return rows_.load(std::memory_order_relaxed); }
  int64_t evictions() const { return evictions_.load(std::memory_order_relaxed); }
  // Every byte the table holds (values, slots, metadata, free slots, index,
  // the fixed part), all of it reserved from the budget.
  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  int64_t dim() const { return dim_; }
  const std::string& name() const { return name_; }

  // A checkpoint: every row that exists, sorted by id: values [rows * dim],
  // slots [NumOptimizerSlots][rows * dim] (slot-major), per-row update counts
  // and touch counts.
  struct Snapshot {
    int64_t dim = 0;
    int slots = 0;
    std::vector<int64_t> ids;
    std::vector<float> values;
    std::vector<float> slot_values;
    std::vector<int64_t> updates;
    std::vector<int64_t> touches;
  };
  Snapshot TakeSnapshot() const;

  // Replaces the table's contents with `snapshot`. The order of last touches
  // is not in a snapshot: a stripe's restored rows are ordered by touch count
  // (then id), as if the least often touched were the least recently
  // touched. A stripe given more rows than its share of max_rows keeps the
  // most touched (the others count as evictions). InvalidArgument naming the
  // table when dims or slot counts differ or the snapshot is malformed
  // (sizes, ids not strictly increasing, negative counts); ResourceExhausted
  // as Lookup's when the budget cannot hold it. Either way the table is left
  // as it was.
  absl::Status Restore(const Snapshot& snapshot);

 private:
  struct Stripe;
  struct Grouping;

  SparseTable(const SparseTableOptions& options, int stripe_bits);

  // Sorts ids[0..n) by stripe (stable), hashing each once.
  void GroupByStripe(const int64_t* ids, int64_t n, Grouping* grouping) const;
  // Why a row could not be created.
  struct Shortage {
    bool budget_refused = false;  // Else the stripe was at its max_rows share.
    int64_t stripe_rows = 0;
  };
  // The three below: REQUIRES: stripe.mu held.
  // Finds or creates the row of each of the entries [begin, end) of
  // `grouping`, all in `stripe`, touching and pinning it (eviction skips it),
  // into slots[0 .. end - begin), and copies it to `out` unless null. Rows
  // that exist are found and pinned first, so a row the call creates never
  // evicts one it reads. Appends the ids it creates to `created`. False when
  // a row could not be created: those rows are then removed again and
  // nothing is left pinned.
  bool ResolveRows(Stripe& stripe, const int64_t* ids, const Grouping& grouping, uint32_t begin,
                   uint32_t end, uint32_t* slots, std::vector<int64_t>* created, float* out,
                   Shortage* shortage);
  void Unpin(Stripe& stripe, const uint32_t* slots, uint32_t count);
  // A slot for a new row: free, grown, or evicted; none (`shortage` set)
  // when there is none.
  uint32_t TakeSlot(Stripe& stripe, Shortage* shortage);
  // Removes the rows of `ids` (created by a call that failed since) that no
  // Apply has updated.
  void RemoveCreatedRows(const std::vector<int64_t>& ids);
  absl::Status Exhausted(const Shortage& shortage) const;

  const std::string name_;
  const uint64_t name_hash_;  // InitSparseRow's hash of name_.
  const int64_t dim_;
  const OptimizerKind optimizer_;
  const OptimizerHyperparams hyper_;
  // Adam's corrections by a row's update count, shared with the process's
  // other tables of the same betas (null for another optimizer).
  const std::shared_ptr<AdamBiasTable> adam_bias_;
  const float init_scale_;
  const uint64_t seed_;
  const int64_t max_rows_;
  const EvictionPolicy eviction_;
  MemoryBudget* const budget_;
  const int stripe_bits_;  // 1 << stripe_bits_ stripes.
  const int num_slots_;    // NumOptimizerSlots(optimizer_).
  const int64_t fixed_bytes_;
  std::unique_ptr<Stripe[]> stripes_;

  std::atomic<int64_t> rows_{0};
  std::atomic<int64_t> evictions_{0};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_SPARSE_TABLE_H_
