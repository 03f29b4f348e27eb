// Under --config=tsan: data handed between threads through each Abseil
// primitive the project uses is not reported (tsan_absl_sync.cc makes the
// uninstrumented library visible), while data touched outside the mutex is.
// Without TSan the handover tests are plain tests and the race tests skip.
#include <atomic>
#include <cstdlib>
#include <deque>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

constexpr int kThreads = 4;

TEST(TsanAbslSyncTest, MutexLockOrdersWritersAndReaders) {
  absl::Mutex mu;
  int count = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        {
          absl::MutexLock lock(&mu);
          ++count;
        }
        absl::ReaderMutexLock lock(&mu);
        EXPECT_GE(count, 1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(count, kThreads * 200);
}

TEST(TsanAbslSyncTest, TryLockOrdersWhatItGuards) {
  absl::Mutex mu;
  int count = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int done = 0; done < 100;) {
        if (mu.TryLock()) {
          ++count;
          ++done;
          mu.Unlock();
        } else if (mu.ReaderTryLock()) {
          EXPECT_GE(count, 0);
          mu.ReaderUnlock();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(count, kThreads * 100);
}

TEST(TsanAbslSyncTest, CondVarHandsOverAQueue) {
  absl::Mutex mu;
  absl::CondVar changed;
  std::deque<std::vector<int>> queue;
  bool done = false;
  std::thread consumer([&] {
    int64_t sum = 0;
    absl::MutexLock lock(&mu);
    while (true) {
      while (queue.empty() && !done) changed.WaitWithTimeout(&mu, absl::Seconds(10));
      if (queue.empty()) break;
      for (int v : queue.front()) sum += v;
      queue.pop_front();
    }
    EXPECT_EQ(sum, 100 * 45);
  });
  for (int i = 0; i < 100; ++i) {
    std::vector<int> item = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    absl::MutexLock lock(&mu);
    queue.push_back(std::move(item));
    changed.Signal();
  }
  {
    absl::MutexLock lock(&mu);
    done = true;
    changed.SignalAll();
  }
  consumer.join();
}

TEST(TsanAbslSyncTest, AwaitAndLockWhenSeeTheWriterInEitherMode) {
  absl::Mutex mu;
  int stage = 0;
  std::vector<int> data;
  std::thread writer([&] {
    for (int s = 1; s <= 3; ++s) {
      absl::MutexLock lock(&mu);
      data.push_back(s);
      stage = s;
    }
  });
  {
    mu.LockWhen(absl::Condition(
        +[](int* stage) { return *stage >= 1; }, &stage));
    EXPECT_GE(data.size(), 1u);
    mu.Unlock();
  }
  {
    // Await with the mutex held in shared mode releases and retakes it
    // shared.
    absl::ReaderMutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* stage) { return *stage >= 2; }, &stage));
    EXPECT_GE(data.size(), 2u);
  }
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* stage) { return *stage == 3; }, &stage),
                                    absl::Seconds(10)));
    EXPECT_EQ(data.size(), 3u);
  }
  writer.join();
}

TEST(TsanAbslSyncTest, NotificationPublishesUnguardedData) {
  std::vector<int> published;
  absl::Notification ready;
  std::thread writer([&] {
    published = {1, 2, 3};
    ready.Notify();
  });
  ASSERT_TRUE(ready.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(published.size(), 3u);
  writer.join();

  // HasBeenNotified() reads the flag inline, without the library.
  std::vector<int> polled;
  absl::Notification set;
  std::thread poller_writer([&] {
    polled = {4, 5};
    set.Notify();
  });
  while (!set.HasBeenNotified()) std::this_thread::yield();
  EXPECT_EQ(polled.size(), 2u);
  poller_writer.join();
}

TEST(TsanAbslSyncTest, BlockingCounterPublishesEachWorkersSlot) {
  std::vector<int> slots(kThreads, 0);
  absl::BlockingCounter remaining(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      slots[t] = t + 1;
      remaining.DecrementCount();
    });
  }
  remaining.Wait();
  int sum = 0;
  for (int v : slots) sum += v;
  EXPECT_EQ(sum, kThreads * (kThreads + 1) / 2);
  for (std::thread& t : threads) t.join();
}

#if defined(__SANITIZE_THREAD__)
// A relaxed flag orders the two threads in time but tells TSan nothing, so
// the only ordering it could see would be through the mutex.
void WriteUnderTheLockThenWithoutIt() {
  absl::Mutex mu;
  int value = 0;
  std::atomic<bool> written{false};
  std::thread writer([&] {
    {
      absl::MutexLock lock(&mu);
      value = 1;
    }
    written.store(true, std::memory_order_relaxed);
  });
  while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
  value = 2;  // The race: mu is not held.
  writer.join();
  std::exit(0);  // TSan turns this into its exit code 66 after a report.
}

// Shared holders do not exclude each other, so their writes race.
void WriteUnderSharedLocks() {
  absl::Mutex mu;
  int value = 0;
  std::atomic<bool> written{false};
  std::thread writer([&] {
    {
      absl::ReaderMutexLock lock(&mu);
      value = 1;
    }
    written.store(true, std::memory_order_relaxed);
  });
  while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
  {
    absl::ReaderMutexLock lock(&mu);
    value = 2;
  }
  writer.join();
  std::exit(0);
}

class TsanAbslSyncDeathTest : public ::testing::Test {
 protected:
  // The child re-executes the test binary rather than forking a process
  // that has TSan's threads.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(TsanAbslSyncDeathTest, ReportsAWriteWithoutTheMutex) {
  EXPECT_EXIT(WriteUnderTheLockThenWithoutIt(), ::testing::ExitedWithCode(66),
              "ThreadSanitizer: data race");
}

TEST_F(TsanAbslSyncDeathTest, ReportsWritesUnderSharedLocks) {
  EXPECT_EXIT(WriteUnderSharedLocks(), ::testing::ExitedWithCode(66), "ThreadSanitizer: data race");
}
#else
TEST(TsanAbslSyncDeathTest, ReportsAWriteWithoutTheMutex) {
  GTEST_SKIP() << "only under --config=tsan";
}
#endif

}  // namespace
}  // namespace downpour
