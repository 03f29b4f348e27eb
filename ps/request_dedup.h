// RequestDedup: exactly-once delivery of retried requests. Every
// state-changing request carries (worker_id, incarnation, sequence); a retry
// (after a timeout or a lost connection) repeats the id, and must not be
// applied twice. Sequences are remembered per worker in a bounded window, so
// requests that arrive reordered are each applied once; a sequence more than
// kWindow older than the newest is taken as applied long ago. A worker that
// restarts comes back with a higher incarnation, which starts its sequences
// over; its older incarnation is refused from then on.
//
// A request goes through Reserve, then the caller applies it and Settles it:
// applied (a retry is now a duplicate) or not (a retry runs it). A retry that
// overtakes its original while that is still being applied is told so
// (kInFlight) and waits for the Settle.
//
// Thread-compatible: the caller serialises calls (the parameter store calls
// it under its job's lock, and waits on its own condition variable for
// kInFlight). Owns its bookkeeping; memory is bounded by kWindow per worker
// plus the requests in flight.
#ifndef DOWNPOUR_PS_REQUEST_DEDUP_H_
#define DOWNPOUR_PS_REQUEST_DEDUP_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spec/checkpoint_files.h"

namespace downpour {

struct RequestKey {
  std::string worker_id;
  int64_t incarnation = 0;
  int64_t sequence = 0;
};

class RequestDedup {
 public:
  // Sequences remembered per worker above the pruning floor.
  static constexpr int kWindow = 4096;

  enum class Verdict {
    kFresh,      // Reserved: apply it, then Settle.
    kDuplicate,  // Applied before: answer it as a duplicate, change nothing.
    kInFlight,   // Being applied by another caller now: wait for its Settle.
  };

  // FailedPrecondition when the worker's incarnation was superseded;
  // InvalidArgument for an empty worker id.
  absl::StatusOr<Verdict> Reserve(const RequestKey& key);

  // Ends a kFresh reservation: remembered as applied, or forgotten so a
  // retry runs it. Does nothing for a key that is not reserved (its worker
  // restarted meanwhile).
  void Settle(const RequestKey& key, bool applied);

  // Sequences remembered, over all workers (applied and in flight).
  int64_t Remembered() const;

  // One worker's window: what a checkpoint saves, so a push retried across
  // a restore is still applied once.
  using WorkerWindow = RequestWindow;
  // Every worker's window, by worker id (requests in flight are not applied
  // and are left out).
  std::vector<WorkerWindow> Export() const;
  // Replaces every window with `windows`.
  void Import(const std::vector<WorkerWindow>& windows);

 private:
  struct Worker {
    int64_t incarnation = 0;
    // Every sequence <= floor counts as applied (pruned from `recent`).
    int64_t floor = std::numeric_limits<int64_t>::min();
    // Sequences above the floor: true once applied, false while in flight.
    std::map<int64_t, bool> recent;
  };

  absl::flat_hash_map<std::string, Worker> workers_;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_REQUEST_DEDUP_H_
