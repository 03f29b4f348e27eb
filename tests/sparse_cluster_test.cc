// End-to-end tests of sparse embedding tables: the real daemons as
// processes on loopback train a click model on a generated click log whose
// best possible AUC is known, its tables held across shards whose memory
// limit each is below the tables' size.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/ctr_generator.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

// The click log, made once per test binary.
struct ClickLog {
  std::string data_dir;
  data::CtrDatasetSummary summary;
};

const ClickLog& Log() {
  static const ClickLog* log = [] {
    auto* made = new ClickLog;
    made->data_dir = MakeTempDir("ctr-data");
    data::CtrDatasetOptions options;
    options.generator.seed = 7;
    // Small vocabularies, so a short run sees their rows often enough to
    // learn them: the Bayes AUC is within reach.
    options.generator.min_vocabulary = 20;
    options.generator.max_vocabulary = 2000;
    options.out_dir = made->data_dir + "/ctr";
    options.name = "ctr";
    options.train_examples = 400000;
    options.test_examples = 40000;
    options.num_shards = 4;
    auto summary = data::WriteCtrDataset(options);
    EXPECT_TRUE(summary.ok()) << summary.status();
    if (summary.ok()) made->summary = *summary;
    return made;
  }();
  return *log;
}

// 26 tables of dim 8 (hashed ids; odd features SUM, even MEAN), the 13
// counts, joined into a 64-32 MLP.
std::string CtrSpec(const std::string& mode, int steps) {
  std::string spec = "name: 'ctr' model { num_classes: 2 inputs { name: 'counts' features: [";
  for (int j = 1; j <= 13; ++j) absl::StrAppend(&spec, j > 1 ? ", " : "", "'I", j, "'");
  absl::StrAppend(&spec, "] }");
  for (int f = 1; f <= 26; ++f) {
    absl::StrAppend(&spec, " inputs { name: 'C", f, "' kind: SPARSE max_ids: 8 }");
  }
  for (int f = 1; f <= 26; ++f) {
    absl::StrAppend(&spec, " layer { name: 'e", f, "' inputs: 'C", f,
                    "' embedding { sparse: true hash_ids: true dim: 8",
                    f % 2 == 0 ? " combiner: MEAN" : "", " } }");
  }
  absl::StrAppend(&spec, " layer { name: 'joined' inputs: ['counts'");
  for (int f = 1; f <= 26; ++f) absl::StrAppend(&spec, ", 'e", f, "'");
  absl::StrAppend(&spec,
                  "] concat {} } layer { dense { units: 64 } } layer { relu {} }"
                  " layer { dense { units: 32 } } layer { relu {} }"
                  " layer { dense { units: 2 } } layer { softmax_cross_entropy {} } }"
                  " dataset { train_files: 'ctr/ctr-train-*.tfrecord'"
                  " test_files: 'ctr/ctr-test-*.tfrecord' batch_size: 512 shuffle_buffer: 20000 }"
                  " optimizer { kind: ADAM learning_rate: 0.002 }"
                  " metrics: [AUC, LOG_LOSS] consistency { mode: ",
                  mode, " } num_workers: 2 num_shards: 2 steps: ", steps,
                  " log_every_steps: 50 seed: 3");
  return spec;
}

// The sum over a scrape of every sample of `metric` (any labels).
double SumOf(const std::string& scrape, const std::string& metric) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (!absl::StartsWith(line, metric) || line.size() <= metric.size()) continue;
    const char next = line[metric.size()];
    if (next != '{' && next != ' ') continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) sum += value;
  }
  return sum;
}

class SparseClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (cluster_) {
      std::vector<std::string> unclean = cluster_->StopAll();
      EXPECT_TRUE(unclean.empty()) << absl::StrJoin(unclean, "; ") << cluster_->Logs();
    }
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(SparseClusterTest, ClickModelReachesTheBayesAucWithTablesLargerThanAShardMayHold) {
  const ClickLog& log = Log();
  ASSERT_GT(log.summary.test.bayes_auc, 0.7);
  LocalCluster::Options options;
  options.shards = 2;
  options.workers = 2;
  options.data_dir = log.data_dir;
  constexpr int64_t kShardLimit = 64 << 20;
  options.shard_flags = {absl::StrCat("--memory_limit=", kShardLimit)};
  cluster_ = std::make_unique<LocalCluster>(options);
  ASSERT_TRUE(cluster_->Start().ok()) << cluster_->Logs();
  const std::string spec_path = cluster_->dir() + "/ctr.pbtxt";
  std::ofstream(spec_path) << CtrSpec("SYNC", 600);
  CommandResult result =
      cluster_->Ctl({"submit", spec_path, "--job_id=ctr", "--wait"}, absl::Minutes(8));
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << cluster_->Logs();
  ASSERT_NE(result.out.find("job ctr SUCCEEDED"), std::string::npos) << result.out;
  const JobStatus job = cluster_->GetJob("ctr");
  ASSERT_TRUE(job.has_test_auc()) << job.DebugString();
  ASSERT_TRUE(job.has_test_log_loss());
  const double bayes = log.summary.test.bayes_auc;
  std::printf("test AUC %.4f (Bayes %.4f), log loss %.4f (Bayes %.4f)\n", job.test_auc(), bayes,
              job.test_log_loss(), log.summary.test.bayes_log_loss);
  EXPECT_GE(job.test_auc(), bayes - 0.01) << cluster_->Logs();
  EXPECT_LE(job.test_log_loss(), log.summary.test.bayes_log_loss + 0.02);

  // Both shards hold rows, more in all than one shard's limit allows, and
  // neither evicted or refused any.
  double total_bytes = 0, rows = 0;
  for (const std::string shard : {"ps0", "ps1"}) {
    auto scrape = HttpGet(cluster_->MetricsAddressOf(shard), "/metrics");
    ASSERT_TRUE(scrape.ok()) << scrape.status();
    const double held = SumOf(*scrape, "downpour_shard_memory_used_bytes");
    EXPECT_GT(held, 0) << *scrape;
    EXPECT_LE(held, kShardLimit);
    EXPECT_GT(SumOf(*scrape, "downpour_shard_sparse_rows"), 0) << *scrape;
    EXPECT_EQ(SumOf(*scrape, "downpour_shard_sparse_evictions_total"), 0);
    EXPECT_EQ(SumOf(*scrape, "downpour_shard_memory_refusals_total"), 0);
    total_bytes += held;
    rows += SumOf(*scrape, "downpour_shard_sparse_rows");
  }
  std::printf("rows %.0f, %.0f bytes over 2 shards limited to %lld each\n", rows, total_bytes,
              static_cast<long long>(kShardLimit));
  EXPECT_GT(total_bytes, kShardLimit);
}

}  // namespace
}  // namespace testing
}  // namespace downpour
