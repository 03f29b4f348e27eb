// End-to-end tests of sparse embedding tables: the real daemons as
// processes on loopback train a click model on a generated click log whose
// best possible AUC is known, its tables held across shards whose memory
// limit each is below the tables' size.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/ctr_generator.h"
#include "gtest/gtest.h"
#include "tests/click_log.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

// Small vocabularies, so a short run sees their rows often enough to
// learn them: the Bayes AUC is within reach. Made once per test binary.
const ClickLog& Log() {
  static const ClickLog* log = new ClickLog(MakeClickLog(1000000, 40000, 10, 200));
  return *log;
}

// 26 tables of dim 8 (hashed ids; C2, C6, ... MEAN, the others SUM, as the
// generator combines them, each with its own Adam), the 13 counts through a
// bottom layer, DLRM's pairwise dot products of all 27, joined into a 128-64
// MLP.
std::string CtrSpec(const std::string& mode, int steps, int staleness = 0) {
  std::string spec = "name: 'ctr' model { num_classes: 2 inputs { name: 'counts' features: [";
  for (int j = 1; j <= 13; ++j) absl::StrAppend(&spec, j > 1 ? ", " : "", "'I", j, "'");
  absl::StrAppend(&spec, "] }");
  for (int f = 1; f <= 26; ++f) {
    absl::StrAppend(&spec, " inputs { name: 'C", f, "' kind: SPARSE max_ids: 8 }");
  }
  for (int f = 1; f <= 26; ++f) {
    absl::StrAppend(&spec, " layer { name: 'e", f, "' inputs: 'C", f,
                    "' embedding { sparse: true hash_ids: true dim: 8 init_scale: 0.05",
                    f % 4 == 2 ? " combiner: MEAN" : "",
                    staleness > 0 ? absl::StrCat(" embedding_staleness: ", staleness) : "",
                    " optimizer { kind: ADAM learning_rate: 0.002 } } }");
  }
  // DLRM: a bottom layer on the counts, every pair of it and the pooled rows
  // dotted, all joined for the top MLP.
  absl::StrAppend(&spec,
                  " layer { name: 'bottom' inputs: 'counts' dense { units: 8 } }"
                  " layer { name: 'bottom_relu' relu {} }"
                  " layer { name: 'dots' inputs: ['bottom_relu'");
  for (int f = 1; f <= 26; ++f) absl::StrAppend(&spec, ", 'e", f, "'");
  absl::StrAppend(&spec, "] dot_interaction {} } layer { name: 'joined' inputs: ['bottom_relu'");
  for (int f = 1; f <= 26; ++f) absl::StrAppend(&spec, ", 'e", f, "'");
  absl::StrAppend(&spec,
                  ", 'dots'] concat {} } layer { dense { units: 128 } } layer { relu {} }"
                  " layer { dense { units: 64 } } layer { relu {} }"
                  " layer { dense { units: 2 } } layer { softmax_cross_entropy {} } }"
                  " dataset { train_files: 'ctr/ctr-train-*.tfrecord'"
                  " test_files: 'ctr/ctr-test-*.tfrecord' batch_size: 512 shuffle_buffer: 20000 }"
                  " optimizer { kind: ADAM learning_rate: 0.002 }"
                  " metrics: [AUC, LOG_LOSS] consistency { mode: ",
                  mode, " } num_workers: 2 num_shards: 2 steps: ", steps,
                  " log_every_steps: 50 eval_every_steps: 250 seed: 3");
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
  // Starts 2 shards and 2 workers on the click log, trains `spec` as job
  // `job_id` to its end, and returns its record (SUCCEEDED, with an AUC).
  JobStatus TrainToTheEnd(const std::string& spec, const std::string& job_id) {
    LocalCluster::Options options;
    options.shards = 2;
    options.workers = 2;
    options.data_dir = Log().data_dir;
    cluster_ = std::make_unique<LocalCluster>(options);
    EXPECT_TRUE(cluster_->Start().ok()) << cluster_->Logs();
    const std::string spec_path = cluster_->dir() + "/ctr.pbtxt";
    std::ofstream(spec_path) << spec;
    CommandResult submitted = cluster_->Ctl({"submit", spec_path, "--job_id=" + job_id, "--wait"});
    EXPECT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err << cluster_->Logs();
    const JobStatus job = cluster_->GetJob(job_id);
    EXPECT_EQ(job.state(), SUCCEEDED) << job.message();
    EXPECT_TRUE(job.has_test_auc());
    return job;
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
  constexpr int64_t kShardLimit = 4 << 20;
  options.shard_flags = {absl::StrCat("--memory_limit=", kShardLimit)};
  cluster_ = std::make_unique<LocalCluster>(options);
  ASSERT_TRUE(cluster_->Start().ok()) << cluster_->Logs();
  const std::string spec_path = cluster_->dir() + "/ctr.pbtxt";
  std::ofstream(spec_path) << CtrSpec("SYNC", 1000);
  CommandResult submitted = cluster_->Ctl({"submit", spec_path, "--job_id=ctr"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  // While it trains, each shard's memory as its /metrics says: the most seen.
  std::vector<double> held(2, 0), rows(2, 0);
  double evictions = 0, refusals = 0;
  const absl::Time give_up = absl::Now() + absl::Minutes(8);
  JobStatus job;
  while (absl::Now() < give_up) {
    job = cluster_->GetJob("ctr");
    if (job.state() != PENDING && job.state() != RUNNING) break;
    for (int s = 0; s < 2; ++s) {
      auto scrape = HttpGet(cluster_->MetricsAddressOf(absl::StrCat("ps", s)), "/metrics");
      if (!scrape.ok()) continue;
      held[s] = std::max(held[s], SumOf(*scrape, "downpour_shard_memory_used_bytes"));
      rows[s] = std::max(rows[s], SumOf(*scrape, "downpour_shard_sparse_rows"));
      evictions += SumOf(*scrape, "downpour_shard_sparse_evictions_total");
      refusals += SumOf(*scrape, "downpour_shard_memory_refusals_total");
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(job.state(), SUCCEEDED) << job.message() << cluster_->Logs();
  ASSERT_TRUE(job.has_test_auc()) << job.DebugString();
  ASSERT_TRUE(job.has_test_log_loss());
  const double bayes = log.summary.test.bayes_auc;
  std::printf("test AUC %.4f (Bayes %.4f), log loss %.4f (Bayes %.4f)\n", job.test_auc(), bayes,
              job.test_log_loss(), log.summary.test.bayes_log_loss);
  EXPECT_GE(job.test_auc(), bayes - 0.01) << cluster_->Logs();
  EXPECT_LE(job.test_log_loss(), log.summary.test.bayes_log_loss + 0.01);

  // Both shards held rows, more in all than one shard's limit allows, and
  // neither evicted nor refused any.
  std::printf("rows %.0f + %.0f, %.0f + %.0f bytes on 2 shards limited to %lld each\n", rows[0],
              rows[1], held[0], held[1], static_cast<long long>(kShardLimit));
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT(rows[s], 0) << "shard " << s;
    EXPECT_GT(held[s], 0) << "shard " << s;
    EXPECT_LE(held[s], kShardLimit) << "shard " << s;
  }
  EXPECT_GT(held[0] + held[1], kShardLimit);
  EXPECT_EQ(evictions, 0);
  EXPECT_EQ(refusals, 0);
}

TEST_F(SparseClusterTest, ClickModelTrainsUnderSspThroughTheDaemons) {
  // SSP with sparse tables: each worker pushes its rows' gradients as it
  // goes (the shards apply them at once, as ASYNC), and a pull waits only
  // while the worker is more than `staleness` steps ahead of the slowest.
  const ClickLog& log = Log();
  const JobStatus job = TrainToTheEnd(CtrSpec("SSP staleness: 2", 400), "ssp");
  std::printf("SSP: test AUC %.4f (Bayes %.4f)\n", job.test_auc(), log.summary.test.bayes_auc);
  EXPECT_GE(job.test_auc(), log.summary.test.bayes_auc - 0.05) << cluster_->Logs();
  for (const WorkerProgress& w : job.workers()) EXPECT_EQ(w.step(), 400) << w.DebugString();
}

TEST_F(SparseClusterTest, ClickModelReadingRowsUpToTwoStepsOldTrainsThroughTheDaemons) {
  // embedding_staleness: 2 on every table: the workers keep the rows they
  // pulled, read them for up to two steps, and pull the rows a step lacks
  // while the step before computes; gradients still go every step.
  const ClickLog& log = Log();
  const JobStatus job = TrainToTheEnd(CtrSpec("SYNC", 400, /*staleness=*/2), "stale");
  std::printf("SYNC, rows up to 2 steps old: test AUC %.4f (Bayes %.4f)\n", job.test_auc(),
              log.summary.test.bayes_auc);
  EXPECT_GE(job.test_auc(), log.summary.test.bayes_auc - 0.05) << cluster_->Logs();
  // The workers read kept rows instead of pulling them every step.
  const std::string logs = cluster_->Logs();
  const std::string kept = "read kept ";
  const size_t at = logs.find(kept);
  ASSERT_NE(at, std::string::npos) << logs;
  EXPECT_GT(std::atof(logs.c_str() + at + kept.size()), 0)
      << logs.substr(at > 300 ? at - 300 : 0, 400);
}

}  // namespace
}  // namespace testing
}  // namespace downpour
