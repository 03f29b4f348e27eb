#include "spec/shard_map.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace downpour {
namespace {

ParamInfo Param(int id, int64_t n) {
  ParamInfo p;
  p.id = id;
  p.num_elements = n;
  p.shape = {n};
  return p;
}

TEST(PlacePartitionsTest, SplitsLargeTensorsIntoBoundedChunks) {
  auto placed = PlacePartitions({Param(0, 2500), Param(1, 10)}, 1, 1000 * sizeof(float));
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_EQ(placed->size(), 4u);
  EXPECT_EQ((*placed)[0].num_elements(), 1000);
  EXPECT_EQ((*placed)[2].offset(), 2000);
  EXPECT_EQ((*placed)[2].num_elements(), 500);
  EXPECT_EQ((*placed)[3].tensor_id(), 1);
  EXPECT_EQ((*placed)[3].partition(), 0);
}

TEST(PlacePartitionsTest, BalancesBytesAcrossShards) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < 12; ++i) params.push_back(Param(i, 100 + 37 * i));
  auto placed = PlacePartitions(params, 3, kDefaultPartitionBytes);
  ASSERT_TRUE(placed.ok());
  auto bytes = BytesPerShard(*placed, 3);
  const auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
  // Greedy largest-first is within the largest item of the optimum.
  EXPECT_LE(*hi - *lo, (100 + 37 * 11) * 4);
}

TEST(PlacePartitionsTest, RejectsMoreShardsThanPartitions) {
  auto placed = PlacePartitions({Param(0, 10)}, 2, kDefaultPartitionBytes);
  ASSERT_FALSE(placed.ok());
  EXPECT_NE(placed.status().message().find("num_shards (2)"), std::string::npos);
}

}  // namespace
}  // namespace downpour
