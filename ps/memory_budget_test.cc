#include "ps/memory_budget.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(MemoryBudgetTest, ReservesUpToTheLimitAndRefusesPastIt) {
  MemoryBudget budget(100);
  EXPECT_EQ(budget.limit(), 100);
  EXPECT_TRUE(budget.TryReserve(60));
  EXPECT_TRUE(budget.TryReserve(40));
  EXPECT_EQ(budget.used(), 100);
  EXPECT_EQ(budget.refusals(), 0);
  EXPECT_FALSE(budget.TryReserve(1));
  EXPECT_EQ(budget.used(), 100);  // A refusal reserves nothing.
  EXPECT_EQ(budget.refusals(), 1);
  EXPECT_TRUE(budget.TryReserve(0));
}

TEST(MemoryBudgetTest, ARefusalReservesNothingEvenWhenPartOfItWouldFit) {
  MemoryBudget budget(100);
  ASSERT_TRUE(budget.TryReserve(70));
  EXPECT_FALSE(budget.TryReserve(31));
  EXPECT_EQ(budget.used(), 70);
  EXPECT_TRUE(budget.TryReserve(30));
  EXPECT_EQ(budget.used(), 100);
}

TEST(MemoryBudgetTest, ReleaseMakesRoomAgain) {
  MemoryBudget budget(100);
  ASSERT_TRUE(budget.TryReserve(100));
  EXPECT_FALSE(budget.TryReserve(50));
  budget.Release(50);
  EXPECT_EQ(budget.used(), 50);
  EXPECT_TRUE(budget.TryReserve(50));
  budget.Release(100);
  EXPECT_EQ(budget.used(), 0);
  EXPECT_EQ(budget.refusals(), 1);
}

TEST(MemoryBudgetTest, ZeroLimitIsUnlimitedButCounts) {
  MemoryBudget budget(0);
  EXPECT_EQ(budget.limit(), 0);
  EXPECT_TRUE(budget.TryReserve(int64_t{1} << 50));
  EXPECT_TRUE(budget.TryReserve(int64_t{1} << 50));
  EXPECT_EQ(budget.used(), int64_t{1} << 51);
  budget.Release(int64_t{1} << 51);
  EXPECT_EQ(budget.used(), 0);
  EXPECT_EQ(budget.refusals(), 0);
}

TEST(MemoryBudgetTest, NegativeLimitMeansUnlimited) {
  MemoryBudget budget(-5);
  EXPECT_EQ(budget.limit(), 0);
  EXPECT_TRUE(budget.TryReserve(1000));
}

// Threads race to reserve and release: the limit is never passed (each
// thread checks what it holds against the limit), every byte reserved is
// released, and each failed TryReserve is one refusal.
TEST(MemoryBudgetTest, ConcurrentReservationsNeverPassTheLimit) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 20000;
  constexpr int64_t kLimit = 1000;
  MemoryBudget budget(kLimit);
  std::atomic<int64_t> failures{0};
  std::atomic<int64_t> over_limit{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int64_t chunk = 100 + 17 * t;
      for (int r = 0; r < kRounds; ++r) {
        if (budget.TryReserve(chunk)) {
          if (budget.used() > kLimit) over_limit.fetch_add(1);
          budget.Release(chunk);
        } else {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(over_limit.load(), 0);
  EXPECT_EQ(budget.used(), 0);
  EXPECT_EQ(budget.refusals(), failures.load());
}

}  // namespace
}  // namespace downpour
