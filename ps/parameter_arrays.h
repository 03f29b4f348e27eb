// ParameterArrays: one partition's parameter values and optimizer slots,
// which a checkpoint borrows instead of copying (ps/shard_capture.h).
//
// Nothing writes arrays while they are lent (Lend). The borrower may copy
// them into the spare arrays and end the loan early (BeginCopy, EndCopy).
// An update asks first where to read and write (PrepareUpdate): in place
// when nothing is lent; otherwise it reads the lent arrays and writes
// others, which become the live ones: the spare arrays that an earlier loan
// left behind (or that ReserveSpare made), so once a job has checkpointed
// the push path neither copies nor allocates for a checkpoint, and an
// out-of-place update reads and writes as many bytes as one in place.
// GiveBack ends a loan; arrays neither live nor lent any more become the
// spare, or are handed back to be freed when there is one already.
//
// Thread-safety: thread-compatible: the owner (a partition, under its mutex)
// serialises every call, GiveBack included. Lent arrays may be read without
// the owner's lock: they do not change until given back. Ownership: owns
// every array, lent or not.
#ifndef DOWNPOUR_PS_PARAMETER_ARRAYS_H_
#define DOWNPOUR_PS_PARAMETER_ARRAYS_H_

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/optimizer.h"

namespace downpour {

class ParameterArrays {
 public:
  static constexpr int kMaxSlots = 2;  // Adam's m and v.

  struct Arrays {
    std::vector<float> values;
    std::vector<std::vector<float>> slots;
  };

  // Where an update reads and writes (see PrepareUpdate).
  class Update {
   public:
    // Applies `kind` with `grad` (elements [start, start + n) of the
    // gradient) to elements [start, start + n).
    void Apply(OptimizerKind kind, const OptimizerHyperparams& hp, const float* grad, int64_t start,
               int64_t n) const;
    // Carries elements [start, start + n) over unchanged: what an update
    // does not apply. A no-op in place.
    void Keep(int64_t start, int64_t n) const;
    bool in_place() const { return from_values_ == values_; }
    float* values() const { return values_; }
    float* slot(int k) const { return slots_[k]; }

   private:
    friend class ParameterArrays;
    int num_slots_ = 0;
    const float* from_values_ = nullptr;
    std::array<const float*, kMaxSlots> from_slots_{};
    float* values_ = nullptr;
    std::array<float*, kMaxSlots> slots_{};
  };

  // What Lend lends: `values` and each of `slots` hold size() floats.
  struct Loan {
    int64_t generation = 0;
    const float* values = nullptr;
    std::vector<const float*> slots;
  };

  ParameterArrays() = default;
  // `n` zeroed values and `num_slots` (<= kMaxSlots) zeroed slots.
  ParameterArrays(int64_t n, int num_slots);
  ParameterArrays(ParameterArrays&&) = default;
  ParameterArrays& operator=(ParameterArrays&&) = default;

  int64_t size() const { return n_; }
  int num_slots() const { return num_slots_; }
  const float* values() const { return live_.values.data(); }
  const float* slot(int k) const { return live_.slots[k].data(); }

  // Lends the live arrays: they stay as they are until GiveBack(generation).
  Loan Lend();
  // Ends a loan. Arrays neither live nor lent any more become the spare or,
  // when there is one, are returned for the caller to free (after it lets go
  // of its lock: freeing large arrays unmaps memory).
  Arrays GiveBack(int64_t generation);

  // Makes the live arrays writable and says where an update reads: in place
  // when they are not lent; otherwise they are retired (still lent), and the
  // spare arrays (or new ones) become live, for the update to write whole
  // (Apply, and Keep for what it does not apply).
  Update PrepareUpdate();

  // Makes spare arrays now, if there are none (zeroed, so their pages are
  // mapped before a push needs them).
  void ReserveSpare();

  // Copying lent arrays, so they are lent no longer than the copy takes: a
  // checkpoint writer copies each partition as soon as it has the capture,
  // and the updates after that go in place, on the arrays the shard has in
  // cache, instead of writing the spare ones. BeginCopy hands the spare
  // arrays out in `*into` (true) when the arrays of `generation` are still
  // live and there are spare ones; the caller copies the lent arrays into
  // them without the owner's lock (CopyLent), then calls EndCopy.
  bool BeginCopy(int64_t generation, Arrays* into);
  // Copies `n` elements of lent arrays into `into`, streamed past the caches
  // (the writer reads the copy once). Needs no lock.
  static void CopyLent(const Loan& lent, int64_t n, Arrays* into);
  // When the arrays of `generation` are still live (no update came since
  // BeginCopy), ends that loan and returns true: the copy is the caller's
  // until ReturnCopy. Otherwise the loan stays (an update wrote other arrays
  // meanwhile) and the copy becomes the spare, or stays in `*copy` for the
  // caller to free when there is one already.
  bool EndCopy(int64_t generation, Arrays* copy);
  // Takes back a copy EndCopy left with the caller: it becomes the spare, or
  // is returned for the caller to free.
  Arrays ReturnCopy(Arrays copy);

  // Bytes of every array held: live, lent and spare.
  int64_t MemoryBytes() const;

  // Lent arrays that are no longer live (tests).
  int retired() const { return static_cast<int>(retired_.size()); }
  bool has_spare() const { return !spare_.values.empty(); }

 private:
  struct Retired {
    int64_t generation;
    int loans;
    Arrays arrays;
  };

  Arrays Fresh() const;

  int64_t n_ = 0;
  int num_slots_ = 0;
  Arrays live_;
  int64_t generation_ = 0;  // Of the live arrays.
  int loans_ = 0;           // Of the live arrays.
  std::vector<Retired> retired_;
  Arrays spare_;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_PARAMETER_ARRAYS_H_
