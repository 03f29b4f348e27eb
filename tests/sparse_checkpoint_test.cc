// End to end, sparse embedding tables are durable (issue 13): the real
// daemons as processes on loopback train a click model in SYNC with
// checkpoints at a cadence; a shard is killed after a checkpoint, the job
// recovers from its newest checkpoint on a replacement shard, which
// restores its rows of the tables, and ends with a clean run's AUC and log
// loss; the final checkpoint exports each table as ids and rows.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "data/ctr_generator.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "spec/checkpoint_files.h"
#include "tests/click_log.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

constexpr int kTables = 26;

// The click log, made once per test binary.
const ClickLog& Log() {
  static const ClickLog* log = new ClickLog(MakeClickLog(400000, 40000, 20, 2000));
  return *log;
}

// 26 hashed tables of dim 8 and the 13 counts into a 64-32 MLP, SYNC, a
// checkpoint every 100 steps.
std::string CtrSpec(int steps) {
  std::string spec = "name: 'ctr' model { num_classes: 2 inputs { name: 'counts' features: [";
  for (int j = 1; j <= 13; ++j) absl::StrAppend(&spec, j > 1 ? ", " : "", "'I", j, "'");
  absl::StrAppend(&spec, "] }");
  for (int f = 1; f <= kTables; ++f) {
    absl::StrAppend(&spec, " inputs { name: 'C", f, "' kind: SPARSE max_ids: 8 }");
  }
  for (int f = 1; f <= kTables; ++f) {
    absl::StrAppend(&spec, " layer { name: 'e", f, "' inputs: 'C", f,
                    "' embedding { sparse: true hash_ids: true dim: 8",
                    f % 2 == 0 ? " combiner: MEAN" : "", " } }");
  }
  absl::StrAppend(&spec, " layer { name: 'joined' inputs: ['counts'");
  for (int f = 1; f <= kTables; ++f) absl::StrAppend(&spec, ", 'e", f, "'");
  absl::StrAppend(&spec,
                  "] concat {} } layer { dense { units: 64 } } layer { relu {} }"
                  " layer { dense { units: 32 } } layer { relu {} }"
                  " layer { dense { units: 2 } } layer { softmax_cross_entropy {} } }"
                  " dataset { train_files: 'ctr/ctr-train-*.tfrecord'"
                  " test_files: 'ctr/ctr-test-*.tfrecord' batch_size: 512 shuffle_buffer: 20000 }"
                  " optimizer { kind: ADAM learning_rate: 0.002 }"
                  " metrics: [AUC, LOG_LOSS] consistency { mode: SYNC }"
                  " num_workers: 2 num_shards: 2 steps: ",
                  steps, " log_every_steps: 50 seed: 3 checkpoint { every_steps: 100 keep: 2 }");
  return spec;
}

std::string Events(const JobStatus& job) {
  std::string out;
  for (const JobEvent& e : job.events()) absl::StrAppend(&out, "\n  ", e.message());
  return out;
}

class SparseCheckpointTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (cluster_) {
      std::vector<std::string> unclean = cluster_->StopAll();
      EXPECT_TRUE(unclean.empty()) << absl::StrJoin(unclean, "; ") << cluster_->Logs();
    }
  }

  // 2 shards and 2 workers reading the click log.
  static LocalCluster::Options ClickCluster() {
    LocalCluster::Options options;
    options.shards = 2;
    options.workers = 2;
    options.data_dir = Log().data_dir;
    return options;
  }

  bool AwaitJob(const std::string& id, const std::function<bool(const JobStatus&)>& done,
                absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      if (done(cluster_->GetJob(id))) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(SparseCheckpointTest, AKilledShardsRowsAreRestoredFromTheCheckpoint) {
  const ClickLog& log = Log();
  ASSERT_GT(log.summary.test.bayes_auc, 0.7);
  const std::string root = MakeTempDir("checkpoints");
  LocalCluster::Options options = ClickCluster();
  options.checkpoint_root = root;
  cluster_ = std::make_unique<LocalCluster>(options);
  ASSERT_TRUE(cluster_->Start().ok()) << cluster_->Logs();
  const std::string spec_path = cluster_->dir() + "/ctr.pbtxt";
  std::ofstream(spec_path) << CtrSpec(600);
  ASSERT_EQ(cluster_->Ctl({"submit", spec_path, "--job_id=ctr"}).exit_code, 0) << cluster_->Logs();
  ASSERT_TRUE(AwaitJob(
      "ctr",
      [](const JobStatus& job) {
        return !job.checkpoints().empty() && job.checkpoints().rbegin()->step() >= 200;
      },
      absl::Minutes(6)))
      << Events(cluster_->GetJob("ctr")) << cluster_->Logs();

  // The checkpoint holds each shard's rows of every table, at its step.
  const CheckpointInfo saved = *cluster_->GetJob("ctr").checkpoints().rbegin();
  absl::StatusOr<CheckpointManifest> manifest = VerifyCheckpoint(root, saved.dir());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  int64_t saved_rows = 0;
  for (const CheckpointFile& file : manifest->files()) {
    if (file.shard() < 0) continue;
    absl::StatusOr<ShardSnapshot> shard =
        ReadShardSnapshot(absl::StrCat(root, "/", saved.dir(), "/", file.name()), file);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE(shard->has_sparse) << file.name();
    EXPECT_EQ(shard->sparse_version, saved.step());
    ASSERT_EQ(shard->sparse_tables.size(), static_cast<size_t>(kTables));
    for (const SparseTableSnapshot& table : shard->sparse_tables) {
      EXPECT_FALSE(table.ids.empty()) << table.name;
      EXPECT_EQ(table.slots, 2) << table.name;  // Adam's.
      saved_rows += static_cast<int64_t>(table.ids.size());
    }
  }
  std::printf("checkpoint at step %lld holds %lld rows\n", static_cast<long long>(saved.step()),
              static_cast<long long>(saved_rows));

  cluster_->shard(1)->Signal(SIGKILL);
  ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();
  CommandResult waited = cluster_->Ctl({"wait", "ctr"}, absl::Minutes(8));
  ASSERT_EQ(waited.exit_code, 0) << waited.out << waited.err << cluster_->Logs();
  const JobStatus job = cluster_->GetJob("ctr");
  std::printf("events:%s\n", Events(job).c_str());
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_GE(job.restarts(), 1) << Events(job);
  EXPECT_GE(job.resumed_from_step(), 200) << Events(job);
  // The replacement loaded its rows from the checkpoint.
  const std::string replacement = cluster_->shard(2)->Log();
  EXPECT_TRUE(absl::StrContains(
      replacement, absl::StrCat(" sparse tables at version ", job.resumed_from_step())))
      << replacement;
  EXPECT_FALSE(absl::StrContains(replacement, "start afresh")) << replacement;

  // As good as a run without the fault: in SYNC (rank-ordered sums, the
  // rows and their Adam state restored exactly, the data resumed at the
  // step) the recovered run ends where a clean one does (seen: the same
  // AUC and log loss to 4 digits).
  CommandResult clean =
      cluster_->Ctl({"submit", spec_path, "--job_id=clean", "--wait"}, absl::Minutes(8));
  ASSERT_EQ(clean.exit_code, 0) << clean.out << clean.err << cluster_->Logs();
  const JobStatus clean_job = cluster_->GetJob("clean");
  ASSERT_TRUE(job.has_test_auc()) << job.DebugString();
  ASSERT_TRUE(clean_job.has_test_auc()) << clean_job.DebugString();
  const double bayes = log.summary.test.bayes_auc;
  std::printf(
      "recovered from step %lld: test AUC %.4f, log loss %.4f; clean run %.4f, %.4f; Bayes "
      "%.4f\n",
      static_cast<long long>(job.resumed_from_step()), job.test_auc(), job.test_log_loss(),
      clean_job.test_auc(), clean_job.test_log_loss(), bayes);
  EXPECT_NEAR(job.test_auc(), clean_job.test_auc(), 0.002);
  EXPECT_NEAR(job.test_log_loss(), clean_job.test_log_loss(), 0.002);

  // The final checkpoint exports each table's rows, ids ascending.
  const std::string out = cluster_->dir() + "/ctr.safetensors";
  CommandResult exported = cluster_->Ctl({"export", "ctr", "--out=" + out});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  for (int f = 1; f <= kTables; ++f) {
    absl::StatusOr<SafetensorsFile::Tensor> ids = file->Get(absl::StrCat("e", f, ".ids"));
    absl::StatusOr<SafetensorsFile::Tensor> rows = file->Get(absl::StrCat("e", f, ".weight"));
    ASSERT_TRUE(ids.ok() && rows.ok()) << ids.status() << rows.status();
    ASSERT_EQ(ids->dtype, TensorDtype::kI64);
    const int64_t n = ids->shape[0];
    EXPECT_GT(n, 0);
    EXPECT_EQ(rows->shape, (std::vector<int64_t>{n, 8}));
    std::vector<int64_t> values(n);
    std::memcpy(values.data(), ids->data.data(), n * sizeof(int64_t));
    EXPECT_TRUE(std::adjacent_find(values.begin(), values.end(),
                                   [](int64_t a, int64_t b) { return a >= b; }) == values.end());
  }
}

// A worker killed between its pushes of a SYNC step, its rows applied by
// the tables (they completed the step) and its dense push only at shard 0
// (--testing_stall_mid_push), is taken over by a new worker, which computes
// that step again from every partition and row as the lost worker read
// them (exact pulls: the tables keep the rows the step changed as they were
// before it): the job ends with a clean run's AUC and log loss, exactly.
TEST_F(SparseCheckpointTest, ARankKilledBetweenItsRowsAndItsDensePushEndsWithTheCleanRunsResult) {
  LocalCluster::Options options = ClickCluster();
  options.checkpoint_root = MakeTempDir("checkpoints");
  options.worker_flags = {"--testing_stall_mid_push=victim:1:150"};
  cluster_ = std::make_unique<LocalCluster>(options);
  ASSERT_TRUE(cluster_->Start().ok()) << cluster_->Logs();
  const std::string spec_path = cluster_->dir() + "/ctr.pbtxt";
  std::ofstream(spec_path) << CtrSpec(300);
  ASSERT_EQ(cluster_->Ctl({"submit", spec_path, "--job_id=victim"}).exit_code, 0)
      << cluster_->Logs();
  const std::string stalled = "testing: job victim rank 1 pushed step 150 to shard 0 only";
  Process* victim = nullptr;
  const absl::Time give_up = absl::Now() + absl::Minutes(4);
  while (victim == nullptr && absl::Now() < give_up) {
    for (int i = 0; i < 2; ++i) {
      if (absl::StrContains(cluster_->worker(i)->Log(), stalled)) victim = cluster_->worker(i);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_NE(victim, nullptr) << cluster_->Logs();
  // Its rows of the step go beside the stalled dense push: let them land.
  absl::SleepFor(absl::Seconds(1));
  victim->Signal(SIGKILL);
  ASSERT_TRUE(AwaitJob(
      "victim",
      [](const JobStatus& job) {
        for (const WorkerProgress& w : job.workers()) {
          if (w.lost()) return true;
        }
        return false;
      },
      absl::Minutes(2)))
      << cluster_->Logs();
  ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
  CommandResult waited = cluster_->Ctl({"wait", "victim"}, absl::Minutes(6));
  ASSERT_EQ(waited.exit_code, 0) << waited.out << waited.err << cluster_->Logs();
  const JobStatus job = cluster_->GetJob("victim");
  std::printf("events:%s\n", Events(job).c_str());
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_EQ(job.restarts(), 0) << Events(job);
  const std::string taker = cluster_->worker(2)->Log();
  EXPECT_FALSE(absl::StrContains(taker, "reading the rows as they are")) << taker;
  EXPECT_FALSE(absl::StrContains(taker, "joining at the partitions' step")) << taker;

  CommandResult clean =
      cluster_->Ctl({"submit", spec_path, "--job_id=clean", "--wait"}, absl::Minutes(6));
  ASSERT_EQ(clean.exit_code, 0) << clean.out << clean.err << cluster_->Logs();
  const JobStatus clean_job = cluster_->GetJob("clean");
  ASSERT_TRUE(job.has_test_auc()) << job.DebugString();
  std::printf("taken over at step 150: test AUC %.6f, log loss %.6f; clean run %.6f, %.6f\n",
              job.test_auc(), job.test_log_loss(), clean_job.test_auc(), clean_job.test_log_loss());
  EXPECT_EQ(job.test_auc(), clean_job.test_auc());
  EXPECT_EQ(job.test_log_loss(), clean_job.test_log_loss());
}

// With no spare worker, a SYNC click-model job whose rank 1 is lost goes on
// on rank 0's worker alone: it takes rank 1 over as a free worker would
// (its rows pulled at the step's version exactly) and trains both ranks,
// and the job ends SUCCEEDED having trained every step.
TEST_F(SparseCheckpointTest, ALostRankGoesToTheLiveWorkerWithNoSpareWorker) {
  LocalCluster::Options options = ClickCluster();
  options.coordinator_flags = {"--handover_wait_s=1"};
  cluster_ = std::make_unique<LocalCluster>(options);
  ASSERT_TRUE(cluster_->Start().ok()) << cluster_->Logs();
  const std::string spec_path = cluster_->dir() + "/ctr.pbtxt";
  std::string spec = CtrSpec(400);
  // No checkpoints: nothing to restart from, so the job must go on.
  spec = spec.substr(0, spec.find(" checkpoint {"));
  std::ofstream(spec_path) << spec;
  ASSERT_EQ(cluster_->Ctl({"submit", spec_path, "--job_id=alone"}).exit_code, 0)
      << cluster_->Logs();
  ASSERT_TRUE(AwaitJob(
      "alone", [](const JobStatus& job) { return job.step() >= 100; }, absl::Minutes(4)))
      << cluster_->Logs();
  // Rank 1's worker dies; there is no other.
  const JobStatus running = cluster_->GetJob("alone");
  Process* rank1 = nullptr;
  for (const WorkerProgress& w : running.workers()) {
    if (w.rank() != 1) continue;
    for (int i = 0; i < 2; ++i) {
      if (absl::StrContains(w.node_id(), cluster_->AddressOf(absl::StrCat("worker", i)))) {
        rank1 = cluster_->worker(i);
      }
    }
  }
  ASSERT_NE(rank1, nullptr) << running.DebugString();
  rank1->Signal(SIGKILL);
  CommandResult waited = cluster_->Ctl({"wait", "alone"}, absl::Minutes(6));
  ASSERT_EQ(waited.exit_code, 0) << waited.out << waited.err << cluster_->Logs();
  const JobStatus job = cluster_->GetJob("alone");
  std::printf("events:%s\ntest AUC %.6f, log loss %.6f\n", Events(job).c_str(), job.test_auc(),
              job.test_log_loss());
  EXPECT_EQ(job.state(), SUCCEEDED) << Events(job);
  EXPECT_EQ(job.step(), 400);
  EXPECT_EQ(job.restarts(), 0) << Events(job);
  EXPECT_TRUE(absl::StrContains(Events(job), "which trains rank 0, takes it over from step"))
      << Events(job);
  EXPECT_GT(job.test_auc(), 0.6);
}

}  // namespace
}  // namespace testing
}  // namespace downpour
