#include "spec/data_assignment.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

std::vector<std::string> Files(int n) {
  std::vector<std::string> files;
  for (int i = 0; i < n; ++i) files.push_back(absl::StrCat("part-", i, ".tfrecord"));
  return files;
}

// Which rank reads record `r` of each file, for files of `records` records:
// every record must be read by exactly one rank.
void ExpectEveryRecordOnce(const std::vector<std::vector<DataPart>>& shares, int files,
                           int records) {
  std::map<std::pair<std::string, int>, int> readers;
  for (size_t rank = 0; rank < shares.size(); ++rank) {
    for (const DataPart& part : shares[rank]) {
      ASSERT_GE(part.stride(), 1);
      ASSERT_GE(part.offset(), 0);
      ASSERT_LT(part.offset(), part.stride());
      for (int r = part.offset(); r < records; r += part.stride()) {
        ++readers[{part.file(), r}];
      }
    }
  }
  EXPECT_EQ(readers.size(), static_cast<size_t>(files * records));
  for (const auto& [record, count] : readers) {
    EXPECT_EQ(count, 1) << record.first << " record " << record.second;
  }
}

TEST(ShareDataTest, WholeFilesRoundRobinWhenThereAreEnough) {
  const auto shares = ShareData(Files(7), 3);
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_EQ(shares[0].size(), 3u);
  EXPECT_EQ(shares[1].size(), 2u);
  EXPECT_EQ(shares[2].size(), 2u);
  EXPECT_EQ(shares[1][1].file(), "part-4.tfrecord");
  EXPECT_EQ(shares[1][1].stride(), 1);
  ExpectEveryRecordOnce(shares, 7, 10);
}

TEST(ShareDataTest, EveryNthRecordOfEachFileWhenFilesAreFewer) {
  const auto shares = ShareData(Files(2), 4);
  ASSERT_EQ(shares.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_EQ(shares[rank].size(), 2u);
    EXPECT_EQ(shares[rank][0].stride(), 4);
    EXPECT_EQ(shares[rank][0].offset(), rank);
  }
  ExpectEveryRecordOnce(shares, 2, 9);
}

TEST(DealPartsTest, AHandedOnShareKeepsEveryRecordOnce) {
  for (const auto& [files, workers] : std::vector<std::pair<int, int>>{{7, 3}, {2, 4}, {1, 3}}) {
    std::vector<std::vector<DataPart>> shares = ShareData(Files(files), workers);
    // Rank 1 is lost; its parts go to the others.
    const auto dealt = DealParts(shares[1], workers - 1);
    int next = 0;
    for (int rank = 0; rank < workers; ++rank) {
      if (rank == 1) continue;
      shares[rank].insert(shares[rank].end(), dealt[next].begin(), dealt[next].end());
      ++next;
    }
    shares[1].clear();
    ExpectEveryRecordOnce(shares, files, 11);
  }
  EXPECT_EQ(DealParts(ShareData(Files(5), 1)[0], 2)[0].size(), 3u);
  EXPECT_TRUE(DealParts(ShareData(Files(5), 1)[0], 0).empty());
}

}  // namespace
}  // namespace downpour
