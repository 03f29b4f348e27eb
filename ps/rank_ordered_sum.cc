#include "ps/rank_ordered_sum.h"

#include <algorithm>
#include <utility>

namespace downpour {

RankOrderedSum::RankOrderedSum(int num_ranks, int64_t num_elements)
    : num_ranks_(num_ranks),
      num_elements_(num_elements),
      sum_(num_elements, 0.f),
      arrived_(num_ranks, false),
      held_(num_ranks, -1) {}

float* RankOrderedSum::Destination(int rank, bool* add) {
  if (rank == next_) {
    *add = summed_ > 0;
    return sum_.data();
  }
  // A lower rank is still missing: held aside until it comes or the step
  // ends.
  *add = false;
  if (free_buffers_.empty()) {
    free_buffers_.push_back(static_cast<int>(buffers_.size()));
    buffers_.emplace_back(num_elements_);
  }
  held_[rank] = free_buffers_.back();
  free_buffers_.pop_back();
  return buffers_[held_[rank]].data();
}

void RankOrderedSum::Skip(int rank) { Arrived(rank, /*brought=*/false); }

void RankOrderedSum::Arrived(int rank, bool brought) {
  arrived_[rank] = true;
  ++num_arrived_;
  if (brought) ++num_contributors_;
  if (brought && rank == next_) ++summed_;
  while (next_ < num_ranks_ && arrived_[next_]) {
    if (held_[next_] >= 0) AddHeld(next_);
    ++next_;
  }
}

void RankOrderedSum::AddHeld(int rank) {
  const int buffer = held_[rank];
  std::vector<float>& held = buffers_[buffer];
  if (summed_ == 0) {
    // The first term: no copy, the buffers trade places.
    std::swap(sum_, held);
  } else {
    float* sum = sum_.data();
    const float* grad = held.data();
    for (int64_t i = 0; i < num_elements_; ++i) sum[i] += grad[i];
  }
  ++summed_;
  held_[rank] = -1;
  free_buffers_.push_back(buffer);
}

float* RankOrderedSum::Finish() {
  // The ranks still missing bring nothing: the held gradients follow the
  // sum in rank order.
  for (int rank = next_; rank < num_ranks_; ++rank) {
    if (held_[rank] >= 0) AddHeld(rank);
  }
  next_ = num_ranks_;
  return sum_.data();
}

void RankOrderedSum::Reset() {
  for (int rank = 0; rank < num_ranks_; ++rank) {
    if (held_[rank] >= 0) free_buffers_.push_back(held_[rank]);
    held_[rank] = -1;
  }
  std::fill(arrived_.begin(), arrived_.end(), false);
  num_arrived_ = num_contributors_ = summed_ = next_ = 0;
}

}  // namespace downpour
