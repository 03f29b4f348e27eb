#include "control/checkpoint_orchestrator.h"

#include <cstdlib>

#include "common/file.h"
#include "control/memory_job_store.h"
#include "gtest/gtest.h"
#include "spec/checkpoint_files.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace control {
namespace {

using Kind = CheckpointOrchestrator::Gathered::Kind;

class CheckpointOrchestratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/orchestrator";
    ASSERT_TRUE(RemoveAll(root_).ok());
    ASSERT_TRUE(MakeDirs(root_).ok());
    job_.set_id("j");
    *job_.mutable_spec() = SmallMlpJob(2, 2);
    job_.mutable_spec()->mutable_checkpoint()->set_keep(1);
    job_.set_state(RUNNING);
    job_.set_attempt(1);
    job_.set_start_time_ms(absl::ToUnixMillis(now_));
    for (const char* shard : {"s0", "s1"}) job_.mutable_placement()->add_shard_nodes(shard);
    for (int rank = 0; rank < 2; ++rank) job_.add_workers()->set_rank(rank);
  }

  CheckpointOrchestrator::Options Options() {
    CheckpointOrchestrator::Options options;
    options.checkpoint_root = root_;
    options.timeout = absl::Minutes(1);
    options.now = [this] { return now_; };
    return options;
  }

  // Shard `shard`'s part at `step`, its file written for real.
  CheckpointPart Part(int shard, int64_t step, int64_t attempt = 1) {
    ShardSnapshot snapshot;
    snapshot.job_id = "j";
    snapshot.shard = shard;
    snapshot.step = step;
    snapshot.worker_steps = {step, step};
    const std::string dir = root_ + "/" + CheckpointDir("j", step);
    EXPECT_TRUE(MakeDirs(dir).ok());
    auto written = WriteShardSnapshot(dir + "/" + ShardFileName(shard), snapshot);
    EXPECT_TRUE(written.ok());
    CheckpointPart part;
    part.set_job_id("j");
    part.set_step(step);
    part.set_attempt(attempt);
    part.mutable_file()->set_name(ShardFileName(shard));
    part.mutable_file()->set_shard(shard);
    part.mutable_file()->set_bytes(written->bytes);
    part.mutable_file()->set_crc32c(written->crc32c);
    return part;
  }

  static CheckpointWorkerState State(int64_t step, int64_t attempt = 1) {
    CheckpointWorkerState state;
    state.set_step(step);
    state.set_attempt(attempt);
    state.set_state("worker state");
    return state;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::string root_;
  JobStatus job_;
  MemoryJobStore::Data data_;
  MemoryJobStore store_{&data_};
  JobHistory history_{{}, &store_};
};

TEST_F(CheckpointOrchestratorTest, ACheckpointIsCompleteWithEveryShardsFileAndTheRanksState) {
  CheckpointOrchestrator checkpoints(Options(), &history_);
  EXPECT_EQ(checkpoints.TakeShardPart(job_, Part(0, 5)).kind, Kind::kWaiting);
  EXPECT_TRUE(checkpoints.Gathering("j", 5));
  EXPECT_EQ(checkpoints.TakeWorkerState(job_, State(5)).kind, Kind::kWaiting);
  now_ += absl::Seconds(2);
  CheckpointOrchestrator::Gathered complete = checkpoints.TakeShardPart(job_, Part(1, 5));
  ASSERT_EQ(complete.kind, Kind::kComplete);
  EXPECT_EQ(complete.parts.shard_files.size(), 2u);
  EXPECT_EQ(complete.parts.worker_state, "worker state");

  job_.set_checkpoint_requested_ms(absl::ToUnixMillis(now_ - absl::Seconds(3)));
  absl::StatusOr<JobStatus> recorded = checkpoints.Commit(job_, complete);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  ASSERT_EQ(recorded->checkpoints_size(), 1);
  EXPECT_EQ(recorded->checkpoints(0).step(), 5);
  EXPECT_EQ(recorded->checkpoint_requested_ms(), 0);  // Asked before it was taken.
  EXPECT_NE(recorded->events(0).message().find("checkpoint at step 5 written"), std::string::npos);
  EXPECT_FALSE(checkpoints.Gathering("j"));
  // A heartbeat repeating a settled step's part changes nothing.
  EXPECT_EQ(checkpoints.TakeShardPart(job_, Part(0, 5)).kind, Kind::kWaiting);
  EXPECT_FALSE(checkpoints.Gathering("j"));
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> newest = checkpoints.NewestCheckpoint(*recorded, &refused);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step(), 5);
}

TEST_F(CheckpointOrchestratorTest, PartsOfAnotherStartOrNotAShardsFileAreIgnored) {
  CheckpointOrchestrator checkpoints(Options(), &history_);
  EXPECT_EQ(checkpoints.TakeShardPart(job_, Part(0, 5, /*attempt=*/2)).kind, Kind::kWaiting);
  EXPECT_EQ(checkpoints.TakeWorkerState(job_, State(5, /*attempt=*/0)).kind, Kind::kWaiting);
  CheckpointPart elsewhere = Part(0, 5);
  elsewhere.mutable_file()->set_name("../../etc/passwd");
  EXPECT_EQ(checkpoints.TakeShardPart(job_, elsewhere).kind, Kind::kWaiting);
  CheckpointPart no_such_shard = Part(1, 5);
  no_such_shard.mutable_file()->set_shard(7);
  EXPECT_EQ(checkpoints.TakeShardPart(job_, no_such_shard).kind, Kind::kWaiting);
  EXPECT_FALSE(checkpoints.Gathering("j"));
  // A start from step 8 takes only later steps.
  checkpoints.Started("j", 8);
  EXPECT_EQ(checkpoints.TakeWorkerState(job_, State(8)).kind, Kind::kWaiting);
  EXPECT_FALSE(checkpoints.Gathering("j"));
}

TEST_F(CheckpointOrchestratorTest, AShardsErrorOrTheTimeoutGivesTheCheckpointUp) {
  CheckpointOrchestrator checkpoints(Options(), &history_);
  CheckpointPart failed = Part(1, 3);
  failed.set_error("disk full");
  CheckpointOrchestrator::Gathered gathered = checkpoints.TakeShardPart(job_, failed);
  ASSERT_EQ(gathered.kind, Kind::kFailed);
  EXPECT_EQ(gathered.why, "shard 1: disk full");
  JobStatus abandoned = checkpoints.Abandon(job_, 3, gathered.why);
  EXPECT_EQ(abandoned.events(0).message(), "checkpoint at step 3 not written: shard 1: disk full");
  EXPECT_FALSE(checkpoints.Gathering("j"));

  checkpoints.TakeWorkerState(job_, State(6));
  now_ += absl::Seconds(59);
  EXPECT_TRUE(checkpoints.Overdue("j").empty());
  now_ += absl::Seconds(2);
  EXPECT_EQ(checkpoints.Overdue("j"), (std::vector<int64_t>{6}));
}

TEST_F(CheckpointOrchestratorTest, TheCadenceAsksOnTheClockAndGivesUpUnansweredRequests) {
  CheckpointOrchestrator checkpoints(Options(), &history_);
  EXPECT_FALSE(checkpoints.Cadence(job_).has_value());  // No every_seconds.
  job_.mutable_spec()->mutable_checkpoint()->set_every_seconds(30);
  EXPECT_FALSE(checkpoints.Cadence(job_).has_value());
  now_ += absl::Seconds(30);
  std::optional<JobStatus> asked = checkpoints.Cadence(job_);
  ASSERT_TRUE(asked.has_value());
  EXPECT_EQ(asked->checkpoint_requested_ms(), absl::ToUnixMillis(now_));
  now_ += absl::Seconds(61);
  std::optional<JobStatus> given_up = checkpoints.Cadence(*asked);
  ASSERT_TRUE(given_up.has_value());
  EXPECT_EQ(given_up->checkpoint_requested_ms(), 0);
  EXPECT_EQ(given_up->events(0).message(), "the checkpoint asked for was not taken within 1m");
}

TEST_F(CheckpointOrchestratorTest, TheLowestLiveRankTakesCheckpointsWhileRankZeroIsLost) {
  EXPECT_EQ(CheckpointOrchestrator::CheckpointRank(job_), 0);
  job_.mutable_workers(0)->set_lost(true);
  EXPECT_EQ(CheckpointOrchestrator::CheckpointRank(job_), 1);
  job_.mutable_workers(1)->set_finished(true);
  EXPECT_EQ(CheckpointOrchestrator::CheckpointRank(job_), -1);
}

TEST_F(CheckpointOrchestratorTest, ADrainIsDueOnceACheckpointIsInOrNoneCanCome) {
  CheckpointOrchestrator checkpoints(Options(), &history_);
  checkpoints.BeginDrain("j", "s1", /*step=*/3);
  EXPECT_TRUE(checkpoints.Draining("j"));
  const auto find = [this](const std::string& id) { return id == "j" ? &job_ : nullptr; };
  EXPECT_TRUE(checkpoints.DueDrains(find).empty());
  now_ += absl::Seconds(1);
  // Committed since, but taken before the drain: it does not count.
  CheckpointInfo* info = job_.add_checkpoints();
  info->set_step(2);
  info->set_time_ms(absl::ToUnixMillis(now_));
  EXPECT_TRUE(checkpoints.DueDrains(find).empty());
  info = job_.add_checkpoints();
  info->set_step(4);
  info->set_time_ms(absl::ToUnixMillis(now_));
  std::vector<CheckpointOrchestrator::DrainDue> due = checkpoints.DueDrains(find);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].node_id, "s1");
  EXPECT_TRUE(due[0].saved);
  checkpoints.EndDrain("j");
  EXPECT_FALSE(checkpoints.Draining("j"));

  checkpoints.BeginDrain("j", "s0", /*step=*/4);
  job_.clear_checkpoints();
  now_ += absl::Seconds(61);
  due = checkpoints.DueDrains(find);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_FALSE(due[0].saved);
  job_.set_state(STOPPED);
  EXPECT_TRUE(checkpoints.DueDrains(find).empty());
  EXPECT_FALSE(checkpoints.Draining("j"));
}

}  // namespace
}  // namespace control
}  // namespace downpour
