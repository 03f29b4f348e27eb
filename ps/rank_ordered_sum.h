// RankOrderedSum: a SYNC step's sum of the workers' gradients for one
// partition, always added in increasing rank order, ((g0 + g1) + g2) + ...
// over the ranks that bring one, whatever order they arrive in. Float
// addition is not associative, so summing as they arrive would make a SYNC
// job's result depend on network timing (issue 10).
//
// The gradients of the consecutive ranks arrived from rank 0 up go straight
// into a running sum. One that arrives while a lower rank is still missing
// is copied aside, and added as soon as the ranks below it have arrived, or
// when the step ends without them (Finish: backup workers, absent ranks).
// A rank that arrives without a gradient (a skipped step) is no term of the
// sum. Memory: the sum (num_elements floats) plus the buffers for gradients
// held aside, at most num_ranks - 1 of num_elements floats; buffers are kept
// for later steps, so a step allocates nothing once as many gradients as
// ever before were held at once.
//
// Thread-compatible: the owner serialises calls (the partition's mutex).
#ifndef DOWNPOUR_PS_RANK_ORDERED_SUM_H_
#define DOWNPOUR_PS_RANK_ORDERED_SUM_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace downpour {

class RankOrderedSum {
 public:
  RankOrderedSum() = default;
  RankOrderedSum(int num_ranks, int64_t num_elements);

  // Whether `rank` arrived this step, with a gradient or without.
  bool arrived(int rank) const { return arrived_[rank]; }
  int num_arrived() const { return num_arrived_; }
  // The ranks that brought a gradient this step.
  int num_contributors() const { return num_contributors_; }
  // Buffers made so far for gradients held aside (kept across steps).
  int num_buffers() const { return static_cast<int>(buffers_.size()); }
  // Bytes of the sum and the buffers held aside.
  int64_t MemoryBytes() const {
    int64_t floats = static_cast<int64_t>(sum_.capacity());
    for (const std::vector<float>& b : buffers_) floats += static_cast<int64_t>(b.capacity());
    return floats * static_cast<int64_t>(sizeof(float));
  }

  // Takes `rank`'s gradient: for_each_run(write) calls write(grad, start,
  // count) with runs of it that together cover [0, num_elements) once (a
  // gradient read from a payload of several pieces comes in several).
  // REQUIRES: !arrived(rank); not finished since the last Reset.
  template <typename ForEachRun>
  void Add(int rank, ForEachRun for_each_run);

  // `rank` arrived without a gradient.
  // REQUIRES: !arrived(rank); not finished since the last Reset.
  void Skip(int rank);

  // The sum of every gradient taken this step, in rank order:
  // num_elements floats, which the caller may change in place until Reset.
  // REQUIRES: num_contributors() > 0.
  float* Finish();

  // Starts the next step: no rank has arrived.
  void Reset();

 private:
  // Where `rank`'s gradient goes: added to the sum (`*add`), or copied to
  // the sum (its first term) or to a buffer held aside for `rank`.
  float* Destination(int rank, bool* add);
  // Records the arrival, then adds the held gradients that are now next.
  void Arrived(int rank, bool brought);
  // Adds the gradient held for `rank` to the sum, and frees its buffer.
  void AddHeld(int rank);

  int num_ranks_ = 0;
  int64_t num_elements_ = 0;
  // The gradients of the ranks below `next_`, all of which have arrived,
  // and how many ranks brought them (0: `sum_` holds nothing).
  std::vector<float> sum_;
  int summed_ = 0;
  int next_ = 0;
  std::vector<bool> arrived_;
  int num_arrived_ = 0;
  int num_contributors_ = 0;
  // Per rank: the index in `buffers_` of its gradient held aside, or -1.
  std::vector<int> held_;
  std::vector<std::vector<float>> buffers_;
  std::vector<int> free_buffers_;
};

template <typename ForEachRun>
void RankOrderedSum::Add(int rank, ForEachRun for_each_run) {
  bool add = false;
  float* to = Destination(rank, &add);
  for_each_run([to, add](const float* grad, int64_t start, int64_t count) {
    float* out = to + start;
    if (add) {
      for (int64_t i = 0; i < count; ++i) out[i] += grad[i];
    } else {
      std::memcpy(out, grad, count * sizeof(float));
    }
  });
  Arrived(rank, /*brought=*/true);
}

}  // namespace downpour

#endif  // DOWNPOUR_PS_RANK_ORDERED_SUM_H_
