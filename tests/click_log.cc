#include "tests/click_log.h"

#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {

ClickLog MakeClickLog(int64_t train, int64_t test, int64_t min_vocabulary, int64_t max_vocabulary) {
  ClickLog log;
  log.data_dir = MakeTempDir("ctr-data");
  data::CtrDatasetOptions options;
  options.generator.seed = 7;
  options.generator.min_vocabulary = min_vocabulary;
  options.generator.max_vocabulary = max_vocabulary;
  options.out_dir = log.data_dir + "/ctr";
  options.name = "ctr";
  options.train_examples = train;
  options.test_examples = test;
  options.num_shards = 4;
  auto summary = data::WriteCtrDataset(options);
  EXPECT_TRUE(summary.ok()) << summary.status();
  if (summary.ok()) log.summary = *summary;
  return log;
}

}  // namespace testing
}  // namespace downpour
