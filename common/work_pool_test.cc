#include "common/work_pool.h"

#include <pthread.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(WorkPoolTest, ParallelForRunsEveryIndexOnce) {
  for (int threads : {0, 1, 4}) {
    WorkPool pool(threads);
    std::vector<std::atomic<int>> calls(1000);
    pool.ParallelFor(1000, [&](int i) { calls[i].fetch_add(1); });
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(calls[i].load(), 1) << i << ", " << threads;
  }
}

TEST(WorkPoolTest, StartReturnsAtOnceAndTheCallsRunOnThePoolsThreads) {
  WorkPool pool(3);
  absl::Notification release;
  std::atomic<int> running{0};
  absl::Mutex mu;
  std::set<std::thread::id> ids;
  // Three calls that block until released: Start returns while they wait,
  // so they run on the pool's three threads, not the caller's.
  auto batch = pool.Start(3, [&](int) {
    {
      absl::MutexLock lock(&mu);
      ids.insert(std::this_thread::get_id());
    }
    running.fetch_add(1);
    release.WaitForNotification();
  });
  while (running.load() < 3) std::this_thread::yield();
  release.Notify();
  batch->Wait();
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
}

TEST(WorkPoolTest, ConcurrentCallersEachGetTheirOwnBatchDone) {
  WorkPool pool(2);
  std::atomic<int> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.ParallelFor(10, [&](int i) { sum.fetch_add(i); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 50 * 45);
}

TEST(WorkPoolTest, AnEmptyBatchIsDoneAndTheDestructorFinishesQueuedWork) {
  std::atomic<int> calls{0};
  {
    WorkPool pool(1);
    pool.Start(0, [&](int) { calls.fetch_add(1); })->Wait();
    EXPECT_EQ(calls.load(), 0);
    pool.Start(5, [&](int) { calls.fetch_add(1); });
  }
  EXPECT_EQ(calls.load(), 5);
}

// The pool's threads carry its name (what top -H and perf show), cut to
// Linux's 15 characters; the caller's own name is left alone.
TEST(WorkPoolTest, ItsThreadsCarryItsName) {
  auto name_of_this_thread = [] {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    return std::string(name);
  };
  const std::string caller = name_of_this_thread();
  for (const std::string& given :
       {std::string("unit-pool"), std::string("a-much-longer-pool-name")}) {
    WorkPool pool(2, given);
    absl::Mutex mu;
    std::set<std::string> names;
    // Started, not waited for: only the pool's threads run the calls.
    absl::Notification done;
    std::atomic<int> left{8};
    pool.Start(8, [&](int) {
      {
        absl::MutexLock lock(&mu);
        names.insert(name_of_this_thread());
      }
      if (left.fetch_sub(1) == 1) done.Notify();
    });
    done.WaitForNotification();
    EXPECT_EQ(names, std::set<std::string>{given.substr(0, 15)});
  }
  EXPECT_EQ(name_of_this_thread(), caller);
}

}  // namespace
}  // namespace downpour
