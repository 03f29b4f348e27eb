// SharedSegment: memory that a worker and a shard on the same host both map,
// so that the tensor bytes of a streamed push-pull cross no socket
// (/PushPullSharedMemoryStream; docs/architecture.md, "The wire").
//
// The worker makes one (Create): a memfd whose first kTokenBytes are a random
// token, sealed against shrinking, growing and further seals, and describes
// it to the shard (attach(): its pid, the fd's number, the token, the size).
// The shard maps the same file (Open) only once it has shown that the file
// is that worker's segment on this host: /proc/<pid>/fd/<fd> is a memfd of a
// process of the shard's own user, sealed so that it can never shrink under
// the mapping (which would kill the shard with SIGBUS on its next touch), of
// the described size, and starting with the token (a worker on another host
// names a process here that holds no such file). Nothing else in the segment
// is trusted: its bytes are gradient values like those off the wire, and
// every offset and length a worker names is checked by Range.
//
// The mapping lives as long as the object: Payload pieces that point into it
// hold a std::shared_ptr to it. Thread-safe (immutable); who writes which
// bytes of the mapping when is for the two ends to agree (the stream's
// exchanges take turns).
#ifndef DOWNPOUR_RPC_SHARED_SEGMENT_H_
#define DOWNPOUR_RPC_SHARED_SEGMENT_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/parameter_server.pb.h"

namespace downpour {

class SharedSegment {
 public:
  static constexpr int64_t kTokenBytes = 32;
  // The first page holds the token; what an exchange names starts after it.
  static constexpr int64_t kHeaderBytes = 4096;

  // Worker side: a new segment of `size` bytes (at least kHeaderBytes), its
  // token written and its seals set.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Create(int64_t size);

  // Shard side: the checks of `attach` that need no file (a pid, an fd, a
  // token of kTokenBytes, a size within [kHeaderBytes, max_size]):
  // InvalidArgument naming the field. Open makes them first; a caller that
  // reserves quota for the segment makes them before it reserves.
  static absl::Status CheckAttach(const SharedSegmentAttach& attach, int64_t max_size);

  // Shard side: maps the segment `attach` describes, if it is one (see
  // above) of at most `max_size` bytes. Otherwise one sentence saying why
  // not: InvalidArgument (a malformed description, a wrong size),
  // PermissionDenied (another user's process, a wrong token),
  // FailedPrecondition (no such process or file here, not a memfd, not
  // sealed).
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Open(const SharedSegmentAttach& attach,
                                                             int64_t max_size);

  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  // Worker side: what the shard needs to Open it.
  const SharedSegmentAttach& attach() const { return attach_; }

  // The bytes [offset, offset + length) when they lie within the segment,
  // past its header; InvalidArgument naming `offset_field` and
  // `length_field` otherwise.
  absl::StatusOr<char*> Range(int64_t offset, int64_t length, absl::string_view offset_field,
                              absl::string_view length_field) const;

 private:
  SharedSegment(int fd, char* data, int64_t size) : fd_(fd), data_(data), size_(size) {}

  const int fd_;  // -1 on the shard side (closed once mapped).
  char* const data_;
  const int64_t size_;
  SharedSegmentAttach attach_;
};

// What a shard lets one worker process (by pid) have it map: at most
// `max_segments` segments of at most `max_bytes` together. Thread-safe.
class SharedSegmentQuota {
 public:
  SharedSegmentQuota(int max_segments, int64_t max_bytes)
      : max_segments_(max_segments), max_bytes_(max_bytes) {}

  // A segment of `bytes` counted against process `pid` until the returned
  // handle is destroyed; ResourceExhausted, saying which bound, when it
  // does not fit. The quota must outlive the handle.
  class Reservation;
  absl::StatusOr<std::unique_ptr<Reservation>> Reserve(int64_t pid, int64_t bytes);

  // Over every process: segments and bytes reserved now.
  int segments() const;
  int64_t bytes() const;
  // Waits until `segments` are reserved (as streams end); false if that has
  // not happened within `timeout`.
  bool AwaitSegments(int segments, absl::Duration timeout) const;

 private:
  struct Use {
    int segments = 0;
    int64_t bytes = 0;
  };
  void Release(int64_t pid, int64_t bytes);

  const int max_segments_;
  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Use> use_ ABSL_GUARDED_BY(mu_);
  Use total_ ABSL_GUARDED_BY(mu_);
};

class SharedSegmentQuota::Reservation {
 public:
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { quota_->Release(pid_, bytes_); }

 private:
  friend class SharedSegmentQuota;
  Reservation(SharedSegmentQuota* quota, int64_t pid, int64_t bytes)
      : quota_(quota), pid_(pid), bytes_(bytes) {}
  SharedSegmentQuota* const quota_;
  const int64_t pid_;
  const int64_t bytes_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SHARED_SEGMENT_H_
