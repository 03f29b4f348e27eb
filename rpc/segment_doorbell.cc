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

void SegmentDoorbell::Post(int size_word, int sequence_word, char* area, absl::string_view header,
                           uint32_t sequence) {
  std::memcpy(area, header.data(), header.size());
  word(size_word).store(static_cast<uint32_t>(header.size()), std::memory_order_relaxed);
  word(sequence_word).store(sequence, std::memory_order_release);
  FutexWake(&word(sequence_word));
}

absl::StatusOr<std::string> SegmentDoorbell::Take(int size_word, const char* area, int64_t capacity,
                                                  absl::StatusCode code,
                                                  absl::string_view what) const {
  const uint32_t size = word(size_word).load(std::memory_order_relaxed);
  if (size > capacity) {
    return absl::Status(code,
                        absl::StrCat(what, " of ", size, " bytes; its area holds ", capacity));
  }
  return std::string(area, size);
}

uint32_t SegmentDoorbell::Ring(absl::string_view header) {
  // Never 0: the sequence nothing has been answered at.
  uint32_t sequence = word(kRequestSequence).load(std::memory_order_relaxed) + 1;
  if (sequence == 0) sequence = 1;
  Post(kRequestSize, kRequestSequence, request_, header, sequence);
  return sequence;
}

bool SegmentDoorbell::AwaitAnswer(uint32_t sequence, absl::Duration timeout) {
  const uint32_t answered = word(kAnswerSequence).load(std::memory_order_acquire);
  if (answered == sequence) return true;
  if (timeout > absl::ZeroDuration()) FutexWait(&word(kAnswerSequence), answered, timeout);
  return word(kAnswerSequence).load(std::memory_order_acquire) == sequence;
}

absl::StatusOr<std::string> SegmentDoorbell::Answer() const {
  return Take(kAnswerSize, answer_, kAnswerBytes, absl::StatusCode::kInternal,
              "the shard answered a header");
}

uint32_t SegmentDoorbell::AwaitRequest(uint32_t seen, absl::Duration timeout) {
  const uint32_t now = word(kRequestSequence).load(std::memory_order_acquire);
  if (now != seen) return now;
  FutexWait(&word(kRequestSequence), seen, timeout);
  return word(kRequestSequence).load(std::memory_order_acquire);
}

absl::StatusOr<std::string> SegmentDoorbell::Request() const {
  return Take(kRequestSize, request_, kRequestBytes, absl::StatusCode::kInvalidArgument,
              "a doorbell request names a header");
}

void SegmentDoorbell::Answer(uint32_t sequence, absl::string_view header) {
  Post(kAnswerSize, kAnswerSequence, answer_, header, sequence);
}

void SegmentDoorbell::WakeRequestWaiter() { FutexWake(&word(kRequestSequence)); }

}  // namespace downpour
