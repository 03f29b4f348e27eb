#include "ps/parameter_arrays.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/cpu/optimizer.h"

namespace downpour {

namespace {

// Out of place, an update writes arrays that are in no cache (spare arrays
// were last touched a checkpoint ago): stores through the caches would first
// read each line from memory only to overwrite it. So the update is computed
// a block at a time into buffers that stay in L1 and streamed out with
// non-temporal stores, which also leave the caches to what the shard uses.
constexpr int64_t kBlock = 1024;  // Floats: 4 KiB per array.

// dst[0, n) = src[0, n), non-temporal where the hardware has it.
void StreamStore(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}

// Orders the non-temporal stores before what follows (the partition's
// mutex is released after them).
void StoreFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace

void ParameterArrays::Update::Apply(OptimizerKind kind, const OptimizerHyperparams& hp,
                                    const float* grad, int64_t start, int64_t n) const {
  if (in_place()) {
    float* slots[kMaxSlots] = {nullptr, nullptr};
    for (int k = 0; k < num_slots_; ++k) slots[k] = slots_[k] + start;
    kernels::cpu::ApplyOptimizer(kind, hp, grad, n, values_ + start, slots);
    return;
  }
  alignas(64) float block[1 + kMaxSlots][kBlock];
  float* block_slots[kMaxSlots] = {block[1], block[2]};
  for (int64_t done = 0; done < n; done += kBlock) {
    const int64_t count = std::min(kBlock, n - done);
    const int64_t at = start + done;
    const float* from_slots[kMaxSlots] = {nullptr, nullptr};
    for (int k = 0; k < num_slots_; ++k) from_slots[k] = from_slots_[k] + at;
    kernels::cpu::ApplyOptimizerTo(kind, hp, grad + done, count, from_values_ + at, from_slots,
                                   block[0], block_slots);
    StreamStore(values_ + at, block[0], count);
    for (int k = 0; k < num_slots_; ++k) StreamStore(slots_[k] + at, block[1 + k], count);
  }
  StoreFence();
}

void ParameterArrays::Update::Keep(int64_t start, int64_t n) const {
  if (in_place() || n <= 0) return;
  StreamStore(values_ + start, from_values_ + start, n);
  for (int k = 0; k < num_slots_; ++k) StreamStore(slots_[k] + start, from_slots_[k] + start, n);
  StoreFence();
}

ParameterArrays::ParameterArrays(int64_t n, int num_slots) : n_(n), num_slots_(num_slots) {
  live_ = Fresh();
}

ParameterArrays::Arrays ParameterArrays::Fresh() const {
  Arrays arrays;
  arrays.values.assign(n_, 0.f);
  arrays.slots.assign(num_slots_, std::vector<float>(n_, 0.f));
  return arrays;
}

ParameterArrays::Loan ParameterArrays::Lend() {
  ++loans_;
  Loan loan;
  loan.generation = generation_;
  loan.values = live_.values.data();
  for (const std::vector<float>& slot : live_.slots) loan.slots.push_back(slot.data());
  return loan;
}

ParameterArrays::Arrays ParameterArrays::GiveBack(int64_t generation) {
  if (generation == generation_) {
    --loans_;
    return {};
  }
  auto it = std::find_if(retired_.begin(), retired_.end(),
                         [generation](const Retired& r) { return r.generation == generation; });
  if (it == retired_.end() || --it->loans > 0) return {};
  Arrays arrays = std::move(it->arrays);
  retired_.erase(it);
  if (has_spare()) return arrays;
  spare_ = std::move(arrays);
  return {};
}

ParameterArrays::Update ParameterArrays::PrepareUpdate() {
  const Arrays* from = &live_;
  if (loans_ > 0) {
    retired_.push_back({generation_, loans_, std::move(live_)});
    ++generation_;
    loans_ = 0;
    live_ = has_spare() ? std::move(spare_) : Fresh();
    spare_ = Arrays();
    // Moving a vector leaves its elements where they were: the loans'
    // pointers hold.
    from = &retired_.back().arrays;
  }
  Update update;
  update.num_slots_ = num_slots_;
  update.values_ = live_.values.data();
  update.from_values_ = from->values.data();
  for (int k = 0; k < num_slots_; ++k) {
    update.slots_[k] = live_.slots[k].data();
    update.from_slots_[k] = from->slots[k].data();
  }
  return update;
}

void ParameterArrays::ReserveSpare() {
  if (!has_spare()) spare_ = Fresh();
}

bool ParameterArrays::BeginCopy(int64_t generation, Arrays* into) {
  if (generation != generation_ || !has_spare()) return false;
  *into = std::move(spare_);
  spare_ = Arrays();
  return true;
}

void ParameterArrays::CopyLent(const Loan& lent, int64_t n, Arrays* into) {
  StreamStore(into->values.data(), lent.values, n);
  for (size_t k = 0; k < lent.slots.size(); ++k)
    StreamStore(into->slots[k].data(), lent.slots[k], n);
  StoreFence();
}

bool ParameterArrays::EndCopy(int64_t generation, Arrays* copy) {
  if (generation == generation_) {
    --loans_;
    return true;
  }
  if (!has_spare()) {
    spare_ = std::move(*copy);
    *copy = Arrays();
  }
  return false;
}

ParameterArrays::Arrays ParameterArrays::ReturnCopy(Arrays copy) {
  if (has_spare()) return copy;
  spare_ = std::move(copy);
  return {};
}

int64_t ParameterArrays::MemoryBytes() const {
  auto bytes = [](const Arrays& a) {
    int64_t floats = static_cast<int64_t>(a.values.capacity());
    for (const std::vector<float>& slot : a.slots) floats += slot.capacity();
    return floats * static_cast<int64_t>(sizeof(float));
  };
  int64_t total = bytes(live_) + bytes(spare_);
  for (const Retired& r : retired_) total += bytes(r.arrays);
  return total;
}

}  // namespace downpour
