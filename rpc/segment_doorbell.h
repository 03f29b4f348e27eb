// SegmentDoorbell: the request/answer signalling of a shared-memory stream
// (rpc/shared_segment.h) inside its segment, so that a worker and a shard on
// one host exchange a push-pull's headers and wake each other through the
// memory they share (a futex each way) instead of through the gRPC
// connection. Under load the connection's path (HTTP/2 framing, gRPC's
// pollers and callback threads, on both ends) costs a millisecond and more a
// round trip; the doorbell costs two wake-ups.
//
// Layout, at the segment's doorbell offset (kBytes in all): a control block
// of four 32-bit words (request sequence, answer sequence, request bytes,
// answer bytes), then the request's header area (kRequestBytes), then the
// answer's (kAnswerBytes). One exchange at a time, in turns: the worker
// writes the header and its size and bumps the request sequence; the shard's
// thread for the stream reads them, handles the exchange, writes its answer
// and sets the answer sequence to the request's. The words are only hints to
// the other end: the shard checks every size it reads (the worker's bytes
// are untrusted, as off the wire) and copies the header out before parsing
// it.
#ifndef DOWNPOUR_RPC_SEGMENT_DOORBELL_H_
#define DOWNPOUR_RPC_SEGMENT_DOORBELL_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace downpour {

class SegmentDoorbell {
 public:
  // A sparse exchange's header lists its rows' ids (8 bytes each; ~85 KB a
  // shard a step for the click model's exact reads). The pages of the
  // areas are touched only as far as headers reach.
  static constexpr int64_t kControlBytes = 64;
  static constexpr int64_t kRequestBytes = (1 << 20) - kControlBytes;
  static constexpr int64_t kAnswerBytes = 1 << 20;
  static constexpr int64_t kBytes = kControlBytes + kRequestBytes + kAnswerBytes;
  // Named in the attach and its answer; a new one for any change to the
  // sizes above or the control words, so that a worker and a shard of
  // different layouts exchange over the stream instead.
  static constexpr int32_t kLayout = 1;

  // Over the kBytes at `at` (4-byte aligned, in a mapping both ends share).
  explicit SegmentDoorbell(char* at);

  // Worker: writes `header` (at most kRequestBytes) and rings; returns the
  // exchange's sequence, which its answer carries.
  uint32_t Ring(absl::string_view header);
  // Worker: whether exchange `sequence` is answered; waits up to `timeout`
  // for it first.
  bool AwaitAnswer(uint32_t sequence, absl::Duration timeout);
  // Worker: the answer's header (of an answered exchange); Internal when
  // the shard wrote a size past the answer area.
  absl::StatusOr<std::string> Answer() const;

  // Shard: waits up to `timeout` for a request after `seen` (the last
  // sequence handled; 0 at first); returns its sequence, or `seen` when
  // none came.
  uint32_t AwaitRequest(uint32_t seen, absl::Duration timeout);
  // Shard: the request's header, copied out; InvalidArgument when the
  // worker named a size past the request area.
  absl::StatusOr<std::string> Request() const;
  // Shard: answers exchange `sequence` with `header` (at most kAnswerBytes;
  // the caller makes sure) and wakes the worker.
  void Answer(uint32_t sequence, absl::string_view header);
  // Shard: wakes a thread waiting in AwaitRequest (to notice it is to stop).
  void WakeRequestWaiter();

 private:
  std::atomic<uint32_t>& word(int i) const { return words_[i]; }
  // Writes `header` into `area`, its size into word `size_word`, then
  // `sequence` into word `sequence_word`, and wakes the other end.
  void Post(int size_word, int sequence_word, char* area, absl::string_view header,
            uint32_t sequence);
  // The header in `area` whose size word `size_word` holds, copied out; an
  // error of `code` ("`what` of N bytes; its area holds C") when that size
  // is past `capacity`.
  absl::StatusOr<std::string> Take(int size_word, const char* area, int64_t capacity,
                                   absl::StatusCode code, absl::string_view what) const;

  std::atomic<uint32_t>* const words_;
  char* const request_;
  char* const answer_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SEGMENT_DOORBELL_H_
