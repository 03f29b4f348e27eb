#include "rpc/segment_doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

// The control block's words.
enum Word { kRequestSequence, kAnswerSequence, kRequestSize, kAnswerSize };

// Sleeps while *word == expected, up to `timeout` (shared between processes:
// not FUTEX_PRIVATE).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);

SegmentDoorbell::SegmentDoorbell(char* at)
    : words_(reinterpret_cast<std::atomic<uint32_t>*>(at)),
      request_(at + kControlBytes),
      answer_(at + kControlBytes + kRequestBytes) {}

uint32_t SegmentDoorbell::Ring(absl::string_view header) {
  std::memcpy(request_, header.data(), header.size());
  word(kRequestSize).store(static_cast<uint32_t>(header.size()), std::memory_order_relaxed);
  // Never 0: the sequence nothing has been answered at.
  uint32_t sequence = word(kRequestSequence).load(std::memory_order_relaxed) + 1;
  if (sequence == 0) sequence = 1;
  word(kRequestSequence).store(sequence, std::memory_order_release);
  FutexWake(&word(kRequestSequence));
  return sequence;
}

bool SegmentDoorbell::AwaitAnswer(uint32_t sequence, absl::Duration timeout) {
  const uint32_t answered = word(kAnswerSequence).load(std::memory_order_acquire);
  if (answered == sequence) return true;
  if (timeout > absl::ZeroDuration()) FutexWait(&word(kAnswerSequence), answered, timeout);
  return word(kAnswerSequence).load(std::memory_order_acquire) == sequence;
}

absl::StatusOr<std::string> SegmentDoorbell::Answer() const {
  const uint32_t size = word(kAnswerSize).load(std::memory_order_relaxed);
  if (size > kAnswerBytes) {
    return absl::InternalError(absl::StrCat("the shard answered a header of ", size,
                                            " bytes in a doorbell area of ", kAnswerBytes));
  }
  return std::string(answer_, size);
}

uint32_t SegmentDoorbell::AwaitRequest(uint32_t seen, absl::Duration timeout) {
  const uint32_t now = word(kRequestSequence).load(std::memory_order_acquire);
  if (now != seen) return now;
  FutexWait(&word(kRequestSequence), seen, timeout);
  return word(kRequestSequence).load(std::memory_order_acquire);
}

absl::StatusOr<std::string> SegmentDoorbell::Request() const {
  const uint32_t size = word(kRequestSize).load(std::memory_order_relaxed);
  if (size > kRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a doorbell request names a header of ", size,
                                                   " bytes; its area holds ", kRequestBytes));
  }
  return std::string(request_, size);
}

void SegmentDoorbell::Answer(uint32_t sequence, absl::string_view header) {
  std::memcpy(answer_, header.data(), header.size());
  word(kAnswerSize).store(static_cast<uint32_t>(header.size()), std::memory_order_relaxed);
  word(kAnswerSequence).store(sequence, std::memory_order_release);
  FutexWake(&word(kAnswerSequence));
}

void SegmentDoorbell::WakeRequestWaiter() { FutexWake(&word(kRequestSequence)); }

}  // namespace downpour
