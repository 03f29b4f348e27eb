// WorkPool: a fixed set of threads, started once, that run batches of
// indexed work: Start(n, fn) queues fn(0) ... fn(n - 1) and returns at once;
// the batch's Wait() returns when every call has returned. ParallelFor does
// both and works on its own batch meanwhile, so a pool of zero threads runs
// it on the caller alone. Batches from several callers at once are served in
// the order they were started.
//
// For work repeated every step (a shard completing a sparse step table by
// table, a worker's exchange with each shard): no thread is started per
// step, and the threads' stacks and malloc caches stay warm.
//
// Thread-safe. The pool must outlive its batches; its destructor finishes
// the queued work, then joins the threads.
#ifndef DOWNPOUR_COMMON_WORK_POOL_H_
#define DOWNPOUR_COMMON_WORK_POOL_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

class WorkPool {
 public:
  // A batch of calls Start queued.
  class Batch {
   public:
    // Blocks until every call of the batch has returned.
    void Wait();

   private:
    friend class WorkPool;
    Batch(int n, std::function<void(int)> fn) : n_(n), fn_(std::move(fn)) {}
    // Runs the next call not yet taken; false when none is left.
    bool RunOne();

    const int n_;
    const std::function<void(int)> fn_;
    absl::Mutex mu_;
    int next_ ABSL_GUARDED_BY(mu_) = 0;
    int done_ ABSL_GUARDED_BY(mu_) = 0;
  };

  // `threads` >= 0 threads (0: ParallelFor runs on the caller; Start's
  // calls run in Wait), named `name` (common/thread_name.h) where given.
  explicit WorkPool(int threads, absl::string_view name = "");
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues fn(i) for every i in [0, n); returns at once. `fn` must not
  // Wait on another batch of this pool (a pool thread would wait on itself).
  std::shared_ptr<Batch> Start(int n, std::function<void(int)> fn);
  // fn(i) for every i in [0, n), on the pool's threads and the caller's;
  // returns when all have returned.
  void ParallelFor(int n, std::function<void(int)> fn);

  // ParallelFor on `pool`, or a plain loop on the caller where `pool` is
  // null or n < 2.
  static void ForEach(WorkPool* pool, int n, const std::function<void(int)>& fn);

  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Batch>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_WORK_POOL_H_
