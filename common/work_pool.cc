#include "common/work_pool.h"

#include <string>
#include <utility>

#include "common/thread_name.h"

namespace downpour {

bool WorkPool::Batch::RunOne() {
  int i;
  {
    absl::MutexLock lock(&mu_);
    if (next_ == n_) return false;
    i = next_++;
  }
  fn_(i);
  absl::MutexLock lock(&mu_);
  ++done_;
  return true;
}

void WorkPool::Batch::Wait() {
  // Calls no pool thread has taken yet run here (all of them, without
  // threads), then the ones running elsewhere are waited for.
  while (RunOne()) {
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](Batch* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) { return b->done_ == b->n_; }, this));
}

WorkPool::WorkPool(int threads, absl::string_view name) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, name = std::string(name)] {
      NameThisThread(name);
      Loop();
    });
  }
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<WorkPool::Batch> WorkPool::Start(int n, std::function<void(int)> fn) {
  std::shared_ptr<Batch> batch(new Batch(n, std::move(fn)));
  if (n > 0 && !threads_.empty()) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(batch);
  }
  return batch;
}

void WorkPool::ParallelFor(int n, std::function<void(int)> fn) { Start(n, std::move(fn))->Wait(); }

void WorkPool::ForEach(WorkPool* pool, int n, const std::function<void(int)>& fn) {
  if (pool == nullptr || n < 2) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->ParallelFor(n, fn);
}

void WorkPool::Loop() {
  for (;;) {
    std::shared_ptr<Batch> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // Stopping, and nothing is left.
      batch = queue_.front();
    }
    if (!batch->RunOne()) {
      // Every call of the front batch is taken: it leaves the queue.
      absl::MutexLock lock(&mu_);
      if (!queue_.empty() && queue_.front() == batch) queue_.pop_front();
    }
  }
}

}  // namespace downpour
