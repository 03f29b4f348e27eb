// Durable jobs end to end: the real daemons with a checkpoint root, driven
// with downpourctl — checkpoints at the spec's cadence and on demand, the
// final one exported in PyTorch's layout, a stopped job resumed (past a
// corrupt newest checkpoint) to the accuracy of a clean run.
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

std::string CheckpointedSpec(const std::string& mode, int64_t steps, int64_t every_steps) {
  return absl::StrCat(FashionMlpSpec(mode, 2, 2, steps), "checkpoint { every_steps: ", every_steps,
                      " keep: 2 }\n");
}

class CheckpointTest : public ClusterFixture {
 protected:
  void StartCluster(bool checkpoints = true, std::vector<std::string> coordinator_flags = {},
                    int shards = 2, std::vector<std::string> worker_flags = {}) {
    LocalCluster::Options options;
    options.shards = shards;
    options.workers = 2;
    options.coordinator_flags = std::move(coordinator_flags);
    options.worker_flags = std::move(worker_flags);
    if (checkpoints) {
      root_ = MakeTempDir("checkpoints");
      options.checkpoint_root = root_;
    }
    ClusterFixture::StartCluster(options);
  }

  std::string root_;
};

TEST_F(CheckpointTest, CheckpointsAreKeptAtTheCadenceAndTheFinalOneExports) {
  StartCluster();
  CommandResult run = cluster_->Ctl(
      {"submit", WriteSpec(CheckpointedSpec("SYNC", 400, 100)), "--job_id=saved", "--wait"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err << cluster_->Logs();
  const JobStatus job = cluster_->GetJob("saved");
  ASSERT_EQ(job.state(), SUCCEEDED) << job.message();
  EXPECT_GT(job.test_accuracy(), 0.7);
  // keep: 2 — the final checkpoint and the one before; older ones removed
  // from disk once newer ones were complete.
  ASSERT_EQ(job.checkpoints_size(), 2) << Events(job);
  EXPECT_EQ(job.checkpoints(0).step(), 300);
  EXPECT_EQ(job.checkpoints(1).step(), 400);
  EXPECT_EQ(ListDir(root_ + "/saved").value(), (std::vector<std::string>{"step-300", "step-400"}));
  for (const char* file :
       {"manifest.json", "shard-0.safetensors", "shard-1.safetensors", "worker.safetensors"}) {
    EXPECT_FALSE(ReadFile(absl::StrCat(root_, "/saved/step-400/", file)).empty()) << file;
  }
  for (int step : {100, 200, 300, 400}) {
    EXPECT_TRUE(HasEvent(job, absl::StrCat("checkpoint at step ", step, " written")))
        << Events(job);
  }

  const std::string out = cluster_->dir() + "/model.safetensors";
  CommandResult exported = cluster_->Ctl({"export", "saved", "--out=" + out});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  // The final state, with what the job measured of it.
  EXPECT_TRUE(absl::StrContains(
      exported.out, absl::StrFormat("step 400 (test accuracy %g)", job.test_accuracy())))
      << exported.out;
  absl::StatusOr<SafetensorsFile> model = SafetensorsFile::Open(out);
  ASSERT_TRUE(model.ok()) << model.status();
  // PyTorch's names and layouts: Linear weights are [out, in].
  EXPECT_EQ(model->Get("dense1.weight")->shape, (std::vector<int64_t>{128, 784}));
  EXPECT_EQ(model->Get("dense3.weight")->shape, (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(model->Get("dense3.bias")->shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(model->tensors().size(), 4u);
  EXPECT_TRUE(absl::StrContains(ReadFile(cluster_->dir() + "/model.spec.pbtxt"), "dense"));

  CommandResult native =
      cluster_->Ctl({"export", "saved", "--out=" + out, "--layout=native", "--checkpoint=300"});
  ASSERT_EQ(native.exit_code, 0) << native.err;
  model = SafetensorsFile::Open(out);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->Get("dense1/weight")->shape, (std::vector<int64_t>{784, 128}));
  EXPECT_EQ(model->metadata().at("downpour.step"), "300");

  CommandResult missing = cluster_->Ctl({"export", "saved", "--out=" + out, "--checkpoint=100"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(missing.err, "no complete checkpoint at step 100")) << missing.err;
  EXPECT_TRUE(absl::StrContains(missing.err, "steps 300, 400")) << missing.err;
}

TEST_F(CheckpointTest, StoppedJobResumesPastACorruptCheckpointToACleanRunsAccuracy) {
  StartCluster();
  const std::string spec = WriteSpec(CheckpointedSpec("SYNC", 1500, 100));
  ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=interrupted"}).exit_code, 0);
  ASSERT_TRUE(AwaitJob("interrupted", [](const JobStatus& job) {
    return job.checkpoints_size() == 2 && job.checkpoints(0).step() >= 200;
  })) << cluster_->Logs();
  ASSERT_EQ(cluster_->Ctl({"stop", "interrupted"}).exit_code, 0);
  JobStatus stopped = cluster_->GetJob("interrupted");
  ASSERT_EQ(stopped.state(), STOPPED);
  ASSERT_EQ(stopped.checkpoints_size(), 2);
  const int64_t older = stopped.checkpoints(0).step();
  const int64_t newest = stopped.checkpoints(1).step();

  // One flipped byte in the newest checkpoint's shard 0 file.
  const std::string damaged =
      absl::StrCat(root_, "/interrupted/step-", newest, "/shard-0.safetensors");
  std::string bytes = ReadFile(damaged);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes;

  CommandResult refused =
      cluster_->Ctl({"export", "interrupted", "--out=" + cluster_->dir() + "/x.safetensors",
                     absl::StrCat("--checkpoint=", newest)});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(refused.err, damaged)) << refused.err;

  CommandResult resumed = cluster_->Ctl({"resume", "interrupted", "--wait"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err << cluster_->Logs();
  EXPECT_TRUE(absl::StrContains(resumed.err, absl::StrCat("checkpoint at step ", older)))
      << resumed.err;
  const JobStatus job = cluster_->GetJob("interrupted");
  std::cout << "events of the resumed job:" << Events(job) << std::endl;
  ASSERT_EQ(job.state(), SUCCEEDED) << job.message();
  EXPECT_EQ(job.resumed_from_step(), older);
  // Started again once (more only if a starved node missed its heartbeats:
  // the events above say so).
  EXPECT_GE(job.attempt(), 2) << cluster_->Logs();
  EXPECT_TRUE(HasEvent(job, absl::StrCat("refused checkpoint at step ", newest))) << Events(job);
  EXPECT_TRUE(HasEvent(job, damaged)) << Events(job);
  EXPECT_TRUE(HasEvent(job, absl::StrCat("started again from the checkpoint at step ", older)))
      << Events(job);
  EXPECT_EQ(job.checkpoints().rbegin()->step(), 1500);

  // The same job run without interruption.
  CommandResult clean = cluster_->Ctl({"submit", spec, "--job_id=clean", "--wait"});
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  const double clean_accuracy = cluster_->GetJob("clean").test_accuracy();
  std::cout << "resumed from step " << older << ": test accuracy " << job.test_accuracy()
            << "; clean run: " << clean_accuracy << std::endl;
  EXPECT_NEAR(job.test_accuracy(), clean_accuracy, 0.01);
}

TEST_F(CheckpointTest, NewJobsStartFromAnExportOrACheckpoint) {
  StartCluster();
  ASSERT_EQ(cluster_
                ->Ctl({"submit", WriteSpec(CheckpointedSpec("SYNC", 400, 100)), "--job_id=base",
                       "--wait"})
                .exit_code,
            0);
  const double base = cluster_->GetJob("base").test_accuracy();
  const std::string exported = cluster_->dir() + "/base.safetensors";
  ASSERT_EQ(cluster_->Ctl({"export", "base", "--out=" + exported}).exit_code, 0);

  // One more (tiny) step from the trained weights keeps their accuracy; from
  // fresh weights one step is near chance.
  const std::string one_step = WriteSpec(absl::StrReplaceAll(
      CheckpointedSpec("SYNC", 1, 100), {{"learning_rate: 0.002", "learning_rate: 0.000001"}}));
  CommandResult from_file = cluster_->Ctl(
      {"submit", one_step, "--job_id=from-file", "--init_from=" + exported, "--wait"});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err << cluster_->Logs();
  CommandResult from_job =
      cluster_->Ctl({"submit", one_step, "--job_id=from-job", "--init_from=base@300", "--wait"});
  ASSERT_EQ(from_job.exit_code, 0) << from_job.err << cluster_->Logs();
  CommandResult fresh = cluster_->Ctl({"submit", one_step, "--job_id=fresh", "--wait"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  const JobStatus file_job = cluster_->GetJob("from-file");
  EXPECT_NEAR(file_job.test_accuracy(), base, 0.002);
  EXPECT_TRUE(HasEvent(file_job, "initial weights from " + exported)) << Events(file_job);
  const JobStatus job_job = cluster_->GetJob("from-job");
  EXPECT_GT(job_job.test_accuracy(), 0.7);
  EXPECT_TRUE(HasEvent(job_job, "initial weights from job base's checkpoint at step 300"))
      << Events(job_job);
  EXPECT_LT(cluster_->GetJob("fresh").test_accuracy(), 0.6);

  // Weights of another architecture are refused naming the tensor.
  CommandResult wrong =
      cluster_->Ctl({"submit",
                     WriteSpec(absl::StrReplaceAll(CheckpointedSpec("SYNC", 1, 100),
                                                   {{"units: 128", "units: 64"}})),
                     "--init_from=" + exported});
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_TRUE(
      absl::StrContains(wrong.err, "dense1.weight is F32 [128, 784]; the model's is F32 [64, 784]"))
      << wrong.err;
  CommandResult unknown = cluster_->Ctl({"submit", one_step, "--init_from=nosuchjob"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown.err, "no job \"nosuchjob\"")) << unknown.err;
}

TEST_F(CheckpointTest, OnDemandCheckpointIsWrittenWhileTheJobRuns) {
  StartCluster();
  ASSERT_EQ(
      cluster_->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 2, 2, 100000)), "--job_id=long"})
          .exit_code,
      0);
  ASSERT_TRUE(AwaitJob("long", [](const JobStatus& job) { return job.step() > 20; }));
  CommandResult taken = cluster_->Ctl({"checkpoint", "long", "--wait", "--timeout=60s"});
  ASSERT_EQ(taken.exit_code, 0) << taken.err << cluster_->Logs();
  EXPECT_TRUE(absl::StrContains(taken.out, "job long checkpoint at step ")) << taken.out;
  const JobStatus job = cluster_->GetJob("long");
  ASSERT_EQ(job.checkpoints_size(), 1);
  EXPECT_EQ(job.state(), RUNNING);
  CommandResult get = cluster_->Ctl({"get", "long"});
  EXPECT_TRUE(absl::StrContains(
      get.out, absl::StrCat("checkpoint at step ", job.checkpoints(0).step(), " written")))
      << get.out;
  ASSERT_EQ(cluster_->Ctl({"stop", "long"}).exit_code, 0);
  // A running job only: a stopped one cannot checkpoint, but resumes.
  CommandResult late = cluster_->Ctl({"checkpoint", "long"});
  EXPECT_EQ(late.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(late.err, "is STOPPED; only a running job checkpoints"))
      << late.err;
}

TEST_F(CheckpointTest, WithoutACheckpointRootTheCommandsSaySo) {
  StartCluster(/*checkpoints=*/false);
  ASSERT_EQ(
      cluster_
          ->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 2, 2, 100000)), "--job_id=unsaved"})
          .exit_code,
      0);
  ASSERT_TRUE(AwaitJob("unsaved", [](const JobStatus& job) { return job.state() == RUNNING; }));
  CommandResult asked = cluster_->Ctl({"checkpoint", "unsaved"});
  EXPECT_EQ(asked.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(asked.err, "--checkpoint_root")) << asked.err;
  ASSERT_EQ(cluster_->Ctl({"stop", "unsaved"}).exit_code, 0);
  CommandResult resumed = cluster_->Ctl({"resume", "unsaved"});
  EXPECT_EQ(resumed.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(resumed.err, "no --checkpoint_root")) << resumed.err;
  CommandResult exported =
      cluster_->Ctl({"export", "unsaved", "--out=" + cluster_->dir() + "/m.safetensors"});
  EXPECT_EQ(exported.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(exported.err, "has no checkpoint")) << exported.err;
}

// Injects a fault into a running job once it has a checkpoint at step 200
// or later, and expects it to finish with a clean run's accuracy: rolled
// back to a checkpoint (a shard lost) or without a rollback (a worker lost:
// its rank goes on elsewhere; a shard drained: moved after a checkpoint).
class RecoveryTest : public CheckpointTest {
 protected:
  // kExact: a rank taken over with no step going on without it (a SYNC
  // worker drained after a step, or killed between its pushes to two
  // shards): the clean run's accuracy, to the example.
  enum class Expect {
    kRollback,
    kNoRestart,
    kExact,
    kMove,
    kPartialRestore,
    kHandedOut,    // ASYNC: the lost rank's data and steps dealt out.
    kSharedWorker  // SYNC: the live worker takes the lost rank over too.
  };

  // The worker process that holds `rank` of the job "victim".
  Process* WorkerOfRank(int rank) {
    const std::string node = cluster_->GetJob("victim").placement().worker_nodes(rank);
    for (int i = 0; i < 2; ++i) {
      if (node == "worker@" + cluster_->AddressOf(absl::StrCat("worker", i))) {
        return cluster_->worker(i);
      }
    }
    ADD_FAILURE() << "no worker process holds rank " << rank << " (" << node << ")";
    return cluster_->worker(1);
  }

  // The first of the cluster's first two workers whose log has `line`, once
  // one has (null after 2 minutes).
  Process* AwaitLog(const std::string& line) {
    const absl::Time give_up = absl::Now() + absl::Minutes(2);
    while (absl::Now() < give_up) {
      for (int i = 0; i < 2; ++i) {
        if (absl::StrContains(cluster_->worker(i)->Log(), line)) return cluster_->worker(i);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return nullptr;
  }

  // The shard process that holds shard `index` of the job "victim", among
  // the cluster's `shards`.
  Process* ShardOfIndex(int index, int shards) {
    const std::string node = cluster_->GetJob("victim").placement().shard_nodes(index);
    for (int i = 0; i < shards; ++i) {
      if (node == "ps@" + cluster_->AddressOf(absl::StrCat("ps", i))) return cluster_->shard(i);
    }
    ADD_FAILURE() << "no shard process holds shard " << index << " (" << node << ")";
    return cluster_->shard(0);
  }

  // Runs `fault` (which injects the fault and starts what replaces the lost
  // process) on a running job of `mode`.
  void SurviveFault(Expect expect, const std::function<void()>& fault,
                    const std::string& mode = "SYNC",
                    std::vector<std::string> coordinator_flags = {},
                    std::vector<std::string> worker_flags = {}) {
    StartCluster(/*checkpoints=*/true, std::move(coordinator_flags), /*shards=*/2,
                 std::move(worker_flags));
    std::string text = CheckpointedSpec(mode, 1200, 100);
    if (mode == "ASYNC") {
      // A replacement continues its rank from where it was, so the rank
      // ends a few hundred steps after the other, alone on its half of the
      // data; with a constant rate that alone costs ~0.01 of accuracy. Real
      // jobs decay the rate, which makes the last steps count for little.
      text = absl::StrReplaceAll(
          text, {{"learning_rate: 0.002 }",
                  "learning_rate: 0.002 schedule { kind: COSINE decay_steps: 1200 } }"}});
    }
    const std::string spec = WriteSpec(text);
    ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=victim"}).exit_code, 0);
    ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) {
      return !job.checkpoints().empty() && job.checkpoints().rbegin()->step() >= 200;
    })) << cluster_->Logs();
    fault();
    CommandResult waited = cluster_->Ctl({"wait", "victim"}, absl::Minutes(3));
    ASSERT_EQ(waited.exit_code, 0) << waited.err << cluster_->Logs();
    const JobStatus job = cluster_->GetJob("victim");
    std::cout << "events:" << Events(job) << std::endl;
    switch (expect) {
      case Expect::kRollback:
        EXPECT_GE(job.restarts(), 1) << Events(job);
        EXPECT_GE(job.resumed_from_step(), 200) << Events(job);
        EXPECT_TRUE(HasEvent(job, "stopped heartbeating")) << Events(job);
        EXPECT_TRUE(HasEvent(job, "restart 1 (1 of 3 in a row)")) << Events(job);
        break;
      case Expect::kNoRestart:
      case Expect::kExact:
        EXPECT_EQ(job.restarts(), 0) << Events(job);
        EXPECT_EQ(job.attempt(), 1) << Events(job);
        EXPECT_TRUE(HasEvent(job, " lost at step ")) << Events(job);
        EXPECT_TRUE(HasEvent(job, " taken over by worker node ")) << Events(job);
        break;
      case Expect::kSharedWorker:
        EXPECT_EQ(job.restarts(), 0) << Events(job);
        EXPECT_EQ(job.attempt(), 1) << Events(job);
        EXPECT_TRUE(HasEvent(job, "worker rank 1 not taken over within ")) << Events(job);
        EXPECT_TRUE(HasEvent(job, "which trains rank 0, takes it over from step ")) << Events(job);
        EXPECT_FALSE(absl::StrContains(job.message(), "without the data")) << job.message();
        break;
      case Expect::kHandedOut:
        EXPECT_EQ(job.restarts(), 0) << Events(job);
        EXPECT_EQ(job.attempt(), 1) << Events(job);
        EXPECT_TRUE(HasEvent(job, "worker rank 1 not taken over within ")) << Events(job);
        EXPECT_TRUE(HasEvent(job, ") handed to rank 0 (")) << Events(job);
        EXPECT_FALSE(absl::StrContains(job.message(), "without the data")) << job.message();
        break;
      case Expect::kPartialRestore:
        EXPECT_EQ(job.restarts(), 0) << Events(job);
        EXPECT_EQ(job.attempt(), 1) << Events(job);
        EXPECT_TRUE(HasEvent(job, "stopped heartbeating")) << Events(job);
        EXPECT_TRUE(HasEvent(job, "the other shards keep theirs (ASYNC)")) << Events(job);
        break;
      case Expect::kMove:
        EXPECT_TRUE(HasEvent(job, "is draining: the job moves off it")) << Events(job);
        EXPECT_TRUE(HasEvent(job, "(a move, not counted)")) << Events(job);
        EXPECT_EQ(job.restarts_in_a_row(), 0) << Events(job);
        EXPECT_GE(job.resumed_from_step(), 200) << Events(job);
        break;
    }

    // The clean run needs two workers again.
    if (expect == Expect::kHandedOut || expect == Expect::kSharedWorker) {
      ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
    }
    CommandResult clean = cluster_->Ctl({"submit", spec, "--job_id=clean", "--wait"});
    ASSERT_EQ(clean.exit_code, 0) << clean.err;
    const double clean_accuracy = cluster_->GetJob("clean").test_accuracy();
    std::cout << "recovered (restarts " << job.restarts() << ", from step "
              << job.resumed_from_step() << "): test accuracy " << job.test_accuracy()
              << "; clean run: " << clean_accuracy << std::endl;
    // A rank handed out leaves the steps between its loss and the hand-over
    // to one batch each, as many as the timing makes (0.0135 seen with
    // another test running beside): more room for those.
    if (expect == Expect::kExact) {
      // The taker computes no step from partitions at two versions: a
      // drained worker pushes the step it began to every shard, and a
      // killed one's taker pulls the step's version exactly.
      EXPECT_EQ(job.test_accuracy(), clean_accuracy);
    } else {
      EXPECT_NEAR(job.test_accuracy(), clean_accuracy, expect == Expect::kHandedOut ? 0.02 : 0.01);
    }
  }
};

// The steps wait for the killed worker's rank (one without it would skip
// its batch) until a replacement takes it over at the step it had reached.
// (Not kExact: a worker killed mid-push may have reached one shard of two,
// whose step then completed, and its taker computes that step on both.)
TEST_F(RecoveryTest, AKilledSyncWorkersRankGoesToAReplacementWithoutARollback) {
  SurviveFault(Expect::kNoRestart, [this] {
    cluster_->worker(1)->Signal(SIGKILL);
    ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return LostRank(job) >= 0; }))
        << cluster_->Logs();
    const int64_t step = cluster_->GetJob("victim").step();
    absl::SleepFor(absl::Seconds(1));
    // Reports come every 5 steps.
    EXPECT_LT(cluster_->GetJob("victim").step(), step + 5) << cluster_->Logs();
    ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
  });
}

// A drained worker hands its rank back after a whole step; its replacement
// continues there, and the job trains exactly what a clean run does.
TEST_F(RecoveryTest, ADrainedSyncWorkersReplacementEndsWithTheCleanRunsAccuracy) {
  SurviveFault(Expect::kExact, [this] {
    WorkerOfRank(1)->Signal(SIGTERM);
    ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return LostRank(job) >= 0; }))
        << cluster_->Logs();
    absl::SleepFor(absl::Seconds(1));
    ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
  });
}

// Rank 1's worker pushes step 400 to shard 0 and is killed before its push
// to shard 1 (the worker's testing hook stalls it there): shard 0 completes
// the step, shard 1 waits for it. The replacement continues at step 400 and
// computes it from both shards' values of step 400 (shard 0 kept its
// previous version), so the job ends as the clean run does.
TEST_F(RecoveryTest, ASyncWorkerKilledBetweenItsPushesToTwoShardsEndsWithTheCleanRunsAccuracy) {
  SurviveFault(
      Expect::kExact,
      [this] {
        Process* victim = AwaitLog("testing: job victim rank 1 pushed step 400 to shard 0 only");
        ASSERT_NE(victim, nullptr) << cluster_->Logs();
        victim->Signal(SIGKILL);
        ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return LostRank(job) >= 0; }))
            << cluster_->Logs();
        ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
      },
      "SYNC", {}, {"--testing_stall_mid_push=victim:1:400"});
}

// A worker whose rank was handed on while it could not hear the coordinator
// (cut off, stopped) pushes the rest of the step it had begun when its link
// to the shards returns (--testing_stall_mid_push=...:stale, after the
// operator drained it; the push goes before a taker comes, so the rank's
// step waits for it). The shards take a rank's pushes only from the node
// the coordinator placed there: the late push is refused, and the job ends
// as the clean run does.
TEST_F(RecoveryTest, AStalePushOfAWorkerWhoseRankWasHandedOnIsRefused) {
  SurviveFault(
      Expect::kExact,
      [this] {
        const std::string stalled = "testing: job victim rank 1 pushed step 400 to shard 0 only";
        ASSERT_NE(AwaitLog(stalled), nullptr) << cluster_->Logs();
        const std::string node = cluster_->GetJob("victim").placement().worker_nodes(1);
        ASSERT_EQ(cluster_->Ctl({"nodes", "drain", node}).exit_code, 0) << cluster_->Logs();
        Process* victim = AwaitLog(
            "testing: job victim rank 1 pushed step 400 to shard 1 after losing the rank: "
            "PERMISSION_DENIED");
        ASSERT_NE(victim, nullptr) << cluster_->Logs();
        EXPECT_TRUE(absl::StrContains(
            victim->Log(), absl::StrCat("node ", node, "#r1 is not worker rank 1 of job victim")))
            << victim->Log();
        ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
      },
      "SYNC", {}, {"--testing_stall_mid_push=victim:1:400:stale"});
}

TEST_F(RecoveryTest, AKilledAsyncWorkersRankGoesToAReplacementWithoutARollback) {
  SurviveFault(
      Expect::kNoRestart,
      [this] {
        cluster_->worker(1)->Signal(SIGKILL);
        ASSERT_TRUE(cluster_->AddWorker().ok()) << cluster_->Logs();
      },
      "ASYNC");
}

// No worker comes to take rank 1 over: the live worker takes it over (at
// once: a SYNC job stood still while the rank was not yet lost) and trains
// both ranks, each on its own data, as a free worker would have.
TEST_F(RecoveryTest, AKilledSyncWorkersRankGoesToTheLiveWorkerWhenNoneIsFree) {
  SurviveFault(Expect::kSharedWorker, [this] { WorkerOfRank(1)->Signal(SIGKILL); }, "SYNC",
               {"--handover_wait_s=0"});
}

// A drained worker hands its data back (ASYNC runs ahead: the live worker
// would finish before a killed one's loss and the wait were over).
TEST_F(RecoveryTest, ADrainedAsyncWorkersDataGoesToTheLiveWorkerWhenNoneIsFree) {
  SurviveFault(Expect::kHandedOut, [this] { WorkerOfRank(1)->Signal(SIGTERM); }, "ASYNC",
               {"--handover_wait_s=0"});
}

// No job depends on one worker: on 2 workers and 3 shards (one spare),
// rank 0's worker is killed with no spare worker (its data and the
// evaluation go to rank 1), then one of the job's shards is killed (the SYNC
// job rolls back to its checkpoint and starts again on the spare shard and
// the one worker left, after the hand-over wait). It ends as a clean run
// would.
TEST_F(RecoveryTest, AJobLosesRankZeroThenAShardWithNoSpareWorkerAndStillSucceeds) {
  StartCluster(/*checkpoints=*/true, {"--handover_wait_s=2"}, /*shards=*/3);
  const std::string spec = WriteSpec(CheckpointedSpec("SYNC", 2000, 100));
  ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=victim"}).exit_code, 0);
  ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return job.step() >= 550; }))
      << cluster_->Logs();
  WorkerOfRank(0)->Signal(SIGKILL);
  ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) {
    return job.step() >= 1550 && !job.checkpoints().empty() &&
           job.checkpoints().rbegin()->step() >= 1400;
  })) << cluster_->Logs();
  ShardOfIndex(1, /*shards=*/3)->Signal(SIGKILL);
  CommandResult waited = cluster_->Ctl({"wait", "victim"}, absl::Minutes(3));
  const JobStatus job = cluster_->GetJob("victim");
  std::cout << "events:" << Events(job) << std::endl;
  ASSERT_EQ(waited.exit_code, 0) << waited.err << cluster_->Logs();
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_GE(job.test_accuracy(), 0.85) << Events(job);
  EXPECT_GE(job.restarts(), 1) << Events(job);
  EXPECT_GE(job.resumed_from_step(), 1400) << Events(job);
  EXPECT_TRUE(HasEvent(job, "worker rank 0 not taken over within 2s")) << Events(job);
  EXPECT_TRUE(HasEvent(job, "on 1 of 2 workers")) << Events(job);
  EXPECT_FALSE(absl::StrContains(job.message(), "without the data")) << job.message();
}

// A SYNC worker stopped past the node timeout, with no worker free to take
// its rank, joins at the shards' step when it is back: it replays none of
// the steps the job made without it (each would be a late push the shards
// ignore while the other rank waits), and the job ends as it should.
TEST_F(RecoveryTest, AStoppedSyncWorkerJoinsAtTheShardsStepWhenItIsBack) {
  StartCluster(/*checkpoints=*/false, {"--handover_wait_s=120"});
  const std::string spec = WriteSpec(FashionMlpSpec("SYNC", 2, 2, 5000));
  ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=victim"}).exit_code, 0);
  ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return job.step() >= 300; }))
      << cluster_->Logs();
  Process* stopped = WorkerOfRank(1);
  stopped->Signal(SIGSTOP);
  // Past the node timeout (4 s) rank 1 is lost; the steps wait for it.
  ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) {
    return HasEvent(job, "worker rank 1 lost");
  })) << cluster_->Logs();
  const int64_t left_at = cluster_->GetJob("victim").step();
  absl::SleepFor(absl::Seconds(2));
  stopped->Signal(SIGCONT);
  // The shards export late pushes with their heartbeats.
  absl::SleepFor(absl::Seconds(3));
  double late = 0;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> metrics =
        HttpGet(cluster_->MetricsAddressOf(absl::StrCat("ps", i)), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    late += MetricValue(*metrics, "downpour_ps_late_pushes_total{job=\"victim\",rank=\"1\"}");
  }
  const JobStatus back = cluster_->GetJob("victim");
  std::cout << "rank 1 lost at step " << left_at << ", job at step " << back.step()
            << " 3 s after SIGCONT; rank 1's late pushes on the shards: " << late << std::endl;
  // At most the steps in flight when it stopped and found behind (a push
  // per message of each): 8 seen; replaying every missed step was 1,293.
  EXPECT_LE(late, 20) << Events(back);
  CommandResult waited = cluster_->Ctl({"wait", "victim"}, absl::Minutes(3));
  ASSERT_EQ(waited.exit_code, 0) << waited.err << cluster_->Logs();
  EXPECT_EQ(cluster_->GetJob("victim").state(), SUCCEEDED);
}

TEST_F(RecoveryTest, AKilledShardIsReplacedAndItsPartitionsRestored) {
  SurviveFault(Expect::kRollback, [this] {
    cluster_->shard(1)->Signal(SIGKILL);
    ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();
  });
}

TEST_F(RecoveryTest, AKilledAsyncShardHasOnlyItsPartitionsRestoredOnASpare) {
  SurviveFault(
      Expect::kPartialRestore,
      [this] {
        ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();  // The spare.
        cluster_->shard(1)->Signal(SIGKILL);
      },
      "ASYNC");
}

TEST_F(RecoveryTest, AShardFrozenPastTheNodeTimeoutIsReplaced) {
  SurviveFault(Expect::kRollback, [this] {
    ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();  // The spare.
    cluster_->shard(1)->Signal(SIGSTOP);
    ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return job.restarts() == 1; }));
    // It wakes up to find its job gone: it drops it and writes nothing of it.
    cluster_->shard(1)->Signal(SIGCONT);
  });
}

TEST_F(RecoveryTest, ASigtermedShardHandsItsJobOverAfterAFreshCheckpoint) {
  SurviveFault(Expect::kMove, [this] {
    ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();  // Where the job moves.
    const int64_t step = cluster_->GetJob("victim").step();
    cluster_->shard(1)->Signal(SIGTERM);
    auto code = cluster_->shard(1)->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok()) << "the shard did not exit after draining" << cluster_->Logs();
    EXPECT_EQ(*code, 0) << cluster_->shard(1)->Log();
    EXPECT_NE(cluster_->shard(1)->Log().find("drained: no job needs this shard"), std::string::npos)
        << cluster_->shard(1)->Log();
    // The checkpoint it moved with was taken after the drain began.
    EXPECT_GE(cluster_->GetJob("victim").resumed_from_step(), step);
  });
}

TEST_F(RecoveryTest, TheCoordinatorKilledMidRecoveryLosesNothing) {
  SurviveFault(Expect::kRollback, [this] {
    cluster_->shard(1)->Signal(SIGKILL);
    // The job is waiting to restart (no free shard) when the coordinator
    // dies; it comes back and the replacement shard arrives.
    ASSERT_TRUE(AwaitJob("victim", [](const JobStatus& job) { return job.state() == PENDING; }));
    ASSERT_TRUE(cluster_->RestartCoordinator(absl::Seconds(1), SIGKILL).ok()) << cluster_->Logs();
    ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();
  });
}

}  // namespace
}  // namespace testing
}  // namespace downpour
