#include "ps/rank_ordered_sum.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

constexpr int kRanks = 4;

// Per rank, two elements whose sum depends on the order of addition.
const float kGrads[kRanks][2] = {{1e8f, 0.5f}, {1.f, -1e8f}, {-1e8f, 3.f}, {3.14159f, 1e8f}};

// Gives `rank`'s gradient in one run per element, last element first.
void AddByElement(RankOrderedSum& sum, int rank) {
  sum.Add(rank, [rank](auto write) {
    write(&kGrads[rank][1], 1, 1);
    write(&kGrads[rank][0], 0, 1);
  });
}

// The sum of the gradients of `ranks`, added in the order listed.
std::vector<float> SumInOrder(const std::vector<int>& ranks) {
  std::vector<float> sum(kGrads[ranks[0]], kGrads[ranks[0]] + 2);
  for (size_t k = 1; k < ranks.size(); ++k) {
    for (int i = 0; i < 2; ++i) sum[i] += kGrads[ranks[k]][i];
  }
  return sum;
}

void ExpectBits(const float* actual, const std::vector<float>& expected) {
  EXPECT_EQ(std::memcmp(actual, expected.data(), expected.size() * sizeof(float)), 0)
      << actual[0] << ", " << actual[1] << " vs " << expected[0] << ", " << expected[1];
}

TEST(RankOrderedSumTest, AddsInRankOrderWhateverTheArrivalOrder) {
  ASSERT_NE(SumInOrder({0, 1, 2, 3}), SumInOrder({3, 2, 1, 0}));
  std::vector<int> order = {0, 1, 2, 3};
  RankOrderedSum sum(kRanks, 2);
  do {
    for (int rank : order) AddByElement(sum, rank);
    EXPECT_EQ(sum.num_arrived(), kRanks);
    EXPECT_EQ(sum.num_contributors(), kRanks);
    ExpectBits(sum.Finish(), SumInOrder({0, 1, 2, 3}));
    sum.Reset();
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(RankOrderedSumTest, SkippedAndMissingRanksAreNoTerms) {
  RankOrderedSum sum(kRanks, 2);
  AddByElement(sum, 3);
  sum.Skip(0);
  AddByElement(sum, 1);
  EXPECT_TRUE(sum.arrived(0));
  EXPECT_FALSE(sum.arrived(2));
  EXPECT_EQ(sum.num_arrived(), 3);
  EXPECT_EQ(sum.num_contributors(), 2);
  // Rank 2 never comes (a straggler a backup worker replaced).
  ExpectBits(sum.Finish(), SumInOrder({1, 3}));
  sum.Reset();

  // The first term is copied, so a lone -0 stays -0.
  const float negative_zero[2] = {-0.f, -0.f};
  sum.Add(2, [&](auto write) { write(negative_zero, 0, 2); });
  sum.Skip(3);
  ExpectBits(sum.Finish(), {-0.f, -0.f});
}

TEST(RankOrderedSumTest, ReusesItsBuffersAcrossSteps) {
  RankOrderedSum sum(kRanks, 2);
  for (int step = 0; step < 3; ++step) {
    for (int rank = kRanks - 1; rank >= 0; --rank) AddByElement(sum, rank);
    ExpectBits(sum.Finish(), SumInOrder({0, 1, 2, 3}));
    sum.Reset();
    EXPECT_EQ(sum.num_buffers(), kRanks - 1);
  }
  // In order, nothing is held aside.
  RankOrderedSum in_order(kRanks, 2);
  for (int rank = 0; rank < kRanks; ++rank) AddByElement(in_order, rank);
  ExpectBits(in_order.Finish(), SumInOrder({0, 1, 2, 3}));
  EXPECT_EQ(in_order.num_buffers(), 0);

  // A step abandoned with gradients held (a restore) gives their buffers
  // back.
  AddByElement(sum, 3);
  AddByElement(sum, 2);
  sum.Reset();
  for (int rank = kRanks - 1; rank >= 0; --rank) AddByElement(sum, rank);
  ExpectBits(sum.Finish(), SumInOrder({0, 1, 2, 3}));
  EXPECT_EQ(sum.num_buffers(), kRanks - 1);
}

}  // namespace
}  // namespace downpour
