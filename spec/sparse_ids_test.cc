#include "spec/sparse_ids.h"

#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(SparseIdsTest, ExactIdsMustLieInTheVocabulary) {
  SparseTableInfo table;
  table.name = "e/table";
  table.vocab_size = 100;
  EXPECT_EQ(*SparseRowOf(table, 0), 0);
  EXPECT_EQ(*SparseRowOf(table, 99), 99);
  const auto bad = SparseRowOf(table, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(
      bad.status().message(),
      "id 100 is outside table e/table (vocab_size 100; set hash_ids to hash any id into it)");
  EXPECT_FALSE(SparseRowOf(table, -1).ok());
}

TEST(SparseIdsTest, HashedIdsLandInTheVocabularyAndSpread) {
  SparseTableInfo table;
  table.hash_ids = true;
  table.vocab_size = 1000;
  std::vector<int> hits(1000, 0);
  for (int64_t id = 0; id < 100000; ++id) {
    const auto row = SparseRowOf(table, id * 7919 - 50000);
    ASSERT_TRUE(row.ok());
    ASSERT_GE(*row, 0);
    ASSERT_LT(*row, 1000);
    ++hits[*row];
  }
  for (int h : hits) EXPECT_GT(h, 40);  // ~100 each.
  table.vocab_size = INT64_MAX;         // hash_ids with vocab_size 0.
  EXPECT_GE(*SparseRowOf(table, INT64_MIN), 0);
  EXPECT_NE(*SparseRowOf(table, 1), *SparseRowOf(table, 2));
}

TEST(SparseIdsTest, ShardsShareRowsEvenly) {
  std::vector<int> per_shard(4, 0);
  for (int64_t row = 0; row < 40000; ++row) ++per_shard[SparseShardOf(row, 4)];
  for (int n : per_shard) EXPECT_NEAR(n, 10000, 500);
  EXPECT_EQ(SparseShardOf(12345, 1), 0);
}

}  // namespace
}  // namespace downpour
