// CoordinatorState's checkpoints and restarts: gathering and committing
// checkpoints, their cadence and timeouts, resume, export, and what a lost
// node does to a job with checkpoints (restart from the newest, or a spare
// shard for ASYNC/SSP).
#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "control/coordinator_state_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/checkpoint_files.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;

// ------------------------------------------------------------ checkpoints

class CheckpointingTest : public CoordinatorStateTest {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    checkpoint_root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/coordinator_checkpoints";
    ASSERT_TRUE(RemoveAll(checkpoint_root_).ok());
    ASSERT_TRUE(MakeDirs(checkpoint_root_).ok());
    Restart();
    Register("s0", SHARD, 1, /*checkpoints=*/true);
    Register("s1", SHARD, 1, /*checkpoints=*/true);
    Register("w", WORKER);
  }

  // Starts job "j" (1 worker, 2 shards, 10 steps) with `keep`.
  JobStatus Start(int keep = 2) {
    JobSpec spec = SmallSpec(1, 2);
    spec.mutable_checkpoint()->set_keep(keep);
    EXPECT_TRUE(state_->SubmitJob(spec, "j").ok());
    return *state_->GetJob("j");
  }

  // Shard `shard` wrote its (real) file of the checkpoint at `step`.
  void ShardWrote(int shard, int64_t step, const std::string& error = "") {
    ShardSnapshot snapshot;
    snapshot.job_id = "j";
    snapshot.shard = shard;
    snapshot.step = step;
    snapshot.worker_steps = {step};
    const std::string dir = checkpoint_root_ + "/" + CheckpointDir("j", step);
    ASSERT_TRUE(MakeDirs(dir).ok());
    auto written = WriteShardSnapshot(dir + "/" + ShardFileName(shard), snapshot);
    ASSERT_TRUE(written.ok());
    HeartbeatRequest beat;
    beat.set_node_id(absl::StrCat("s", shard));
    beat.set_incarnation(1);
    CheckpointPart* part = beat.add_checkpoints();
    part->set_job_id("j");
    part->set_step(step);
    part->set_attempt(state_->GetJob("j")->attempt());
    part->set_error(error);
    part->mutable_file()->set_name(ShardFileName(shard));
    part->mutable_file()->set_shard(shard);
    part->mutable_file()->set_bytes(written->bytes);
    part->mutable_file()->set_crc32c(written->crc32c);
    ASSERT_TRUE(state_->Heartbeat(beat).ok());
  }

  // Rank 0 took the checkpoint at `step` (its state sent with a report).
  void WorkerTook(int64_t step, bool finished = false) {
    ReportProgressRequest report = Progress("j", "w", 0, step);
    report.mutable_checkpoint()->set_step(step);
    report.mutable_checkpoint()->set_attempt(state_->GetJob("j")->attempt());
    report.mutable_checkpoint()->set_state("worker state bytes");
    if (finished) {
      report.set_finished(true);
      report.set_has_test_accuracy(true);
      report.set_test_accuracy(0.8);
    }
    ASSERT_TRUE(state_->ReportProgress(report).ok());
  }

  // Time passes with every node heartbeating.
  void Pass(absl::Duration d) {
    for (; d > absl::ZeroDuration(); d -= absl::Seconds(2)) {
      Advance(std::min(d, absl::Seconds(2)));
      for (const char* node : {"s0", "s1", "w"}) Beat(node);
    }
  }

  std::vector<int64_t> Steps() {
    std::vector<int64_t> steps;
    const JobStatus job = *state_->GetJob("j");
    for (const CheckpointInfo& c : job.checkpoints()) steps.push_back(c.step());
    return steps;
  }

  std::string Events() {
    std::string out;
    const JobStatus job = *state_->GetJob("j");
    for (const JobEvent& e : job.events()) absl::StrAppend(&out, e.message(), "\n");
    return out;
  }
};

TEST_F(CheckpointingTest, TasksSayTheJobIsSavedAndWhichStartItIs) {
  Start();
  const Task task = Beat("w").tasks(0);
  EXPECT_TRUE(task.checkpoints());
  EXPECT_EQ(task.attempt(), 1);
  EXPECT_FALSE(task.has_restore());
}

TEST_F(CheckpointingTest, TheFinalCheckpointComesFromARankThatEvaluatesOnceRankZeroIsLostLate) {
  // Rank 1 finished; then rank 0 is lost before its last step. Rank 1 runs
  // again to evaluate the job and sends the final checkpoint's state with
  // its evaluation, though no rank takes checkpoints (none trains).
  Register("v", WORKER);
  JobSpec spec = SmallSpec(2, 2);
  spec.mutable_checkpoint()->set_keep(2);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  const JobStatus job = *state_->GetJob("j");
  const std::string second = job.placement().worker_nodes(1);
  const int64_t steps = job.spec().steps();
  ReportProgressRequest done = Progress("j", second, 1, steps);
  done.set_finished(true);
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  for (int i = 0; i < 4; ++i) {  // Rank 0's node stops heartbeating.
    Advance(absl::Seconds(2));
    for (const std::string& node : {std::string("s0"), std::string("s1"), second}) Beat(node);
    state_->Tick();
  }
  ASSERT_TRUE(state_->GetJob("j")->workers(0).lost()) << Events();
  EXPECT_TRUE(Beat(second).tasks(0).evaluates());
  ShardWrote(0, steps);
  ShardWrote(1, steps);
  ReportProgressRequest evaluated = Progress("j", second, 1, steps);
  evaluated.set_finished(true);
  evaluated.set_has_test_accuracy(true);
  evaluated.set_test_accuracy(0.8);
  evaluated.mutable_checkpoint()->set_step(steps);
  evaluated.mutable_checkpoint()->set_attempt(job.attempt());
  evaluated.mutable_checkpoint()->set_state("worker state bytes");
  ASSERT_TRUE(state_->ReportProgress(evaluated).ok());
  EXPECT_EQ(StateOf("j"), SUCCEEDED) << Events();
  EXPECT_EQ(Steps(), (std::vector<int64_t>{steps}));
}

TEST_F(CheckpointingTest, ACheckpointIsCommittedOnceEveryFileIsInAndOldOnesArePruned) {
  Start(/*keep=*/2);
  for (int64_t step : {2, 4, 6}) {
    ShardWrote(0, step);
    WorkerTook(step);
    EXPECT_EQ(Steps().size(), static_cast<size_t>(step / 2 - 1)) << "shard 1 not in yet";
    ShardWrote(1, step);
  }
  EXPECT_EQ(Steps(), (std::vector<int64_t>{4, 6}));
  // Step 2's directory went once step 6 was complete; 6's manifest names
  // every file with its CRC.
  EXPECT_EQ(ListDir(checkpoint_root_ + "/j").value(),
            (std::vector<std::string>{"step-4", "step-6"}));
  auto manifest = VerifyCheckpoint(checkpoint_root_, "j/step-6");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->files_size(), 3);  // Two shards and the workers' state.
  EXPECT_EQ(manifest->step(), 6);
  EXPECT_THAT(Events(), HasSubstr("checkpoint at step 6 written"));
  // A part that heartbeats repeat is taken once.
  ShardWrote(1, 6);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{4, 6}));
  // Whatever else is in the job's directory (an incomplete checkpoint, one
  // of an earlier start) went too; the current start's newer ones stay.
  ASSERT_TRUE(MakeDirs(checkpoint_root_ + "/j/step-5.attempt-7").ok());
  ASSERT_TRUE(MakeDirs(checkpoint_root_ + "/j/step-3").ok());
  ASSERT_TRUE(MakeDirs(checkpoint_root_ + "/j/step-9").ok());
  ShardWrote(0, 8);
  WorkerTook(8);
  ShardWrote(1, 8);
  EXPECT_EQ(ListDir(checkpoint_root_ + "/j").value(),
            (std::vector<std::string>{"step-6", "step-8", "step-9"}));
}

TEST_F(CheckpointingTest, PartsOfAnotherStartOfTheJobAreIgnored) {
  Start();
  WorkerTook(2);
  ShardWrote(0, 2);
  HeartbeatRequest stale;
  stale.set_node_id("s1");
  stale.set_incarnation(1);
  CheckpointPart* part = stale.add_checkpoints();
  part->set_job_id("j");
  part->set_step(2);
  part->set_attempt(7);
  part->mutable_file()->set_shard(1);
  part->mutable_file()->set_name(ShardFileName(1));
  ASSERT_TRUE(state_->Heartbeat(stale).ok());
  EXPECT_TRUE(Steps().empty());
  ShardWrote(1, 2);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{2}));
}

TEST_F(CheckpointingTest, AShardThatCannotWriteItsPartFailsTheCheckpointNotTheJob) {
  Start();
  WorkerTook(2);
  ShardWrote(1, 2, "disk full");
  EXPECT_TRUE(Steps().empty());
  EXPECT_THAT(Events(), HasSubstr("checkpoint at step 2 not written: shard 1: disk full"));
  EXPECT_EQ(StateOf("j"), RUNNING);
}

TEST_F(CheckpointingTest, AFailedCheckpointLeavesNoFilesAndIsCounted) {
  JobSpec spec = SmallSpec(1, 2);
  spec.mutable_restart()->set_max_restarts(2);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  WorkerTook(2);
  ShardWrote(0, 2);                             // Shard 0's file is written ...
  ShardWrote(1, 2, "No space left on device");  // ... shard 1's is not.
  EXPECT_FALSE(ListDir(checkpoint_root_ + "/j/step-2").ok()) << "the given-up step stays";
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.checkpoint_failures(), 1);
  EXPECT_EQ(job.last_checkpoint_error(), "shard 1: No space left on device");
  // A restart with no checkpoint says why there is none.
  for (int i = 0; i < 4; ++i) {  // Shard 1 falls silent.
    Advance(absl::Seconds(2));
    Beat("s0");
    Beat("w");
  }
  state_->Tick();
  EXPECT_THAT(Events(), HasSubstr("from the start (no checkpoint was written: 1 failed, the "
                                  "last: shard 1: No space left on device)"));
}

TEST_F(CheckpointingTest, ExportGivesTheFinalStateOrSaysWhyNot) {
  Start();
  for (int64_t step : {2, 4}) {
    WorkerTook(step);
    ShardWrote(0, step);
    ShardWrote(1, step);
  }
  // The final checkpoint never completes: the job succeeds, but its final
  // state was not saved, and a plain export refuses to give step 4 instead.
  WorkerTook(10, /*finished=*/true);
  Pass(absl::Seconds(61));
  state_->Tick();
  const JobStatus done = *state_->GetJob("j");
  ASSERT_EQ(done.state(), SUCCEEDED);
  EXPECT_THAT(done.final_checkpoint_missing(),
              HasSubstr("its final checkpoint (step 10) was not written: not complete after 1m"));
  absl::StatusOr<std::string> plain = state_->ExportJob("j", 0, false);
  ASSERT_FALSE(plain.ok());
  EXPECT_THAT(plain.status().message(),
              HasSubstr("job j's final state was not saved: its final checkpoint (step 10) was "
                        "not written"));
  EXPECT_THAT(plain.status().message(),
              HasSubstr("it has checkpoints at steps 2, 4: export one with --checkpoint=STEP"));
  // --checkpoint=4 reads step 4 (whose test files hold no values).
  absl::StatusOr<std::string> older = state_->ExportJob("j", 4, true);
  EXPECT_THAT(older.status().message(), HasSubstr("checkpoint j/step-4 holds 0 of"));
}

TEST_F(CheckpointingTest, ExportNeverFallsBackPastADamagedNewestCheckpoint) {
  Start();
  for (int64_t step : {2, 4}) {
    WorkerTook(step);
    ShardWrote(0, step);
    ShardWrote(1, step);
  }
  WorkerTook(10, /*finished=*/true);
  ShardWrote(0, 10);
  ShardWrote(1, 10);
  ASSERT_EQ(StateOf("j"), SUCCEEDED);
  // A plain export reads the final checkpoint (whose test files hold no
  // values; tests/checkpoint_test exports real ones).
  EXPECT_THAT(state_->ExportJob("j", 0, true).status().message(),
              HasSubstr("checkpoint j/step-10 holds 0 of"));

  const std::string damaged = checkpoint_root_ + "/j/step-10/" + ShardFileName(0);
  const std::string bytes = ReadFileToString(damaged).value();
  auto file = AtomicFile::Create(damaged, "test file");
  ASSERT_TRUE((*file)->Append(bytes.substr(0, bytes.size() - 1)).ok());
  ASSERT_TRUE((*file)->Commit().ok());
  absl::StatusOr<std::string> refused = state_->ExportJob("j", 0, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("its newest checkpoint cannot be read"));
  EXPECT_THAT(refused.status().message(), HasSubstr(damaged));
  EXPECT_THAT(refused.status().message(), HasSubstr("--checkpoint=STEP"));
}

TEST_F(CheckpointingTest, AnIncompleteCheckpointIsGivenUpAfterTheTimeout) {
  Start();
  WorkerTook(2);
  ShardWrote(0, 2);
  Pass(absl::Seconds(61));
  state_->Tick();
  EXPECT_THAT(Events(), HasSubstr("checkpoint at step 2 not written: not complete after 1m"));
  EXPECT_EQ(StateOf("j"), RUNNING);
}

TEST_F(CheckpointingTest, AskingForACheckpointReachesRankZeroUntilOneIsWritten) {
  Start();
  auto asked = state_->CheckpointJob("j");
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_GT(asked->checkpoint_requested_ms(), 0);
  EXPECT_EQ(Beat("w").tasks(0).checkpoint_requested_ms(), asked->checkpoint_requested_ms());
  Advance(absl::Seconds(1));
  WorkerTook(3);
  ShardWrote(0, 3);
  ShardWrote(1, 3);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{3}));
  EXPECT_EQ(state_->GetJob("j")->checkpoint_requested_ms(), 0);
  EXPECT_EQ(Beat("w").tasks(0).checkpoint_requested_ms(), 0);
}

TEST_F(CheckpointingTest, EverySecondsAsksForACheckpointOnTheClock) {
  JobSpec spec = SmallSpec(1, 2);
  spec.mutable_checkpoint()->set_every_seconds(30);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  Pass(absl::Seconds(29));
  state_->Tick();
  EXPECT_EQ(state_->GetJob("j")->checkpoint_requested_ms(), 0);
  Pass(absl::Seconds(2));
  state_->Tick();
  EXPECT_GT(state_->GetJob("j")->checkpoint_requested_ms(), 0);
}

TEST_F(CheckpointingTest, AJobSucceedsOnlyOnceItsFinalCheckpointIsWritten) {
  Start();
  WorkerTook(10, /*finished=*/true);
  EXPECT_EQ(StateOf("j"), RUNNING);
  EXPECT_THAT(state_->GetJob("j")->message(), HasSubstr("writing the final checkpoint"));
  ShardWrote(0, 10);
  ShardWrote(1, 10);
  const JobStatus done = *state_->GetJob("j");
  EXPECT_EQ(done.state(), SUCCEEDED);
  EXPECT_EQ(done.message(), "");
  EXPECT_EQ(Steps(), (std::vector<int64_t>{10}));
}

TEST_F(CheckpointingTest, AJobWithALostRankEndsOnceItsFinalCheckpointIsWritten) {
  Register("w2", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(2, 2), "j").ok());
  const std::string zero = state_->GetJob("j")->placement().worker_nodes(0);
  for (int i = 0; i < 4; ++i) {  // Rank 1's worker silent past the timeout.
    Advance(absl::Seconds(2));
    for (const std::string& node : {std::string("s0"), std::string("s1"), zero}) Beat(node);
    state_->Tick();
  }
  ASSERT_TRUE(state_->GetJob("j")->workers(1).lost());
  ReportProgressRequest report = Progress("j", zero, 0, 10);
  report.mutable_checkpoint()->set_step(10);
  report.mutable_checkpoint()->set_attempt(1);
  report.set_finished(true);
  report.set_has_test_accuracy(true);
  report.set_test_accuracy(0.8);
  ASSERT_TRUE(state_->ReportProgress(report).ok());
  EXPECT_EQ(StateOf("j"), RUNNING);
  ShardWrote(0, 10);
  ShardWrote(1, 10);
  const JobStatus done = *state_->GetJob("j");
  EXPECT_EQ(done.state(), SUCCEEDED);
  EXPECT_THAT(done.message(), HasSubstr("without the data of worker rank 1 from step 0"));
}

TEST_F(CheckpointingTest, WhileRankZeroIsLostTheLowestLiveRankTakesTheCheckpoints) {
  Register("w2", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(2, 2), "j").ok());
  const std::string zero = state_->GetJob("j")->placement().worker_nodes(0);
  const std::string one = state_->GetJob("j")->placement().worker_nodes(1);
  EXPECT_TRUE(Beat(zero).tasks(0).takes_checkpoints());
  EXPECT_FALSE(Beat(one).tasks(0).takes_checkpoints());
  for (int i = 0; i < 4; ++i) {  // Rank 0's worker silent past the timeout.
    Advance(absl::Seconds(2));
    for (const std::string& node : {std::string("s0"), std::string("s1"), one}) Beat(node);
    state_->Tick();
  }
  ASSERT_TRUE(state_->GetJob("j")->workers(0).lost());
  EXPECT_TRUE(Beat(one).tasks(0).takes_checkpoints());
  // Its state completes the checkpoint with the shards' files.
  ReportProgressRequest report = Progress("j", one, 1, 5);
  report.mutable_checkpoint()->set_step(5);
  report.mutable_checkpoint()->set_attempt(1);
  report.mutable_checkpoint()->set_state("rank 1's state");
  ASSERT_TRUE(state_->ReportProgress(report).ok());
  ShardWrote(0, 5);
  ShardWrote(1, 5);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{5}));
}

TEST_F(CheckpointingTest, AFinalCheckpointThatNeverCompletesStillEndsTheJob) {
  Start();
  WorkerTook(10, /*finished=*/true);
  Pass(absl::Seconds(61));
  state_->Tick();
  const JobStatus done = *state_->GetJob("j");
  EXPECT_EQ(done.state(), SUCCEEDED);
  EXPECT_THAT(done.message(), HasSubstr("the final checkpoint was not written"));
}

TEST_F(CheckpointingTest, ResumeFallsBackPastACorruptCheckpointAndStartsAgain) {
  Start();
  for (int64_t step : {2, 4}) {
    WorkerTook(step);
    ShardWrote(0, step);
    ShardWrote(1, step);
  }
  ASSERT_TRUE(state_->StopJob("j").ok());
  // Step 4's shard 1 file loses its tail.
  const std::string damaged = checkpoint_root_ + "/j/step-4/" + ShardFileName(1);
  const std::string bytes = ReadFileToString(damaged).value();
  auto file = AtomicFile::Create(damaged, "test file");
  ASSERT_TRUE((*file)->Append(bytes.substr(0, bytes.size() - 1)).ok());
  ASSERT_TRUE((*file)->Commit().ok());

  auto resumed = state_->ResumeJob("j");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state(), RUNNING);  // The nodes are free: it starts at once.
  EXPECT_EQ(resumed->resumed_from_step(), 2);
  EXPECT_EQ(resumed->attempt(), 2);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{2}));
  EXPECT_THAT(Events(), HasSubstr("refused checkpoint at step 4"));
  EXPECT_THAT(Events(), HasSubstr(damaged));
  const Task task = Beat("s1").tasks(0);
  EXPECT_EQ(task.attempt(), 2);
  EXPECT_EQ(task.restore().step(), 2);
  EXPECT_EQ(task.restore().dir(), "j/step-2");
  EXPECT_EQ(task.restore().files_size(), 2);
  // The workers' state goes to workers only (shards restore from the files).
  EXPECT_EQ(task.restore().worker_state(), "");
  EXPECT_EQ(Beat("w").tasks(0).restore().worker_state(), "worker state bytes");

  // Only a FAILED or STOPPED job resumes.
  EXPECT_THAT(state_->ResumeJob("j").status().message(),
              HasSubstr("only a FAILED or STOPPED job resumes"));
}

TEST_F(CheckpointingTest, AJobWithoutACompleteCheckpointCannotResume) {
  Start();
  ASSERT_TRUE(state_->StopJob("j").ok());
  auto resumed = state_->ResumeJob("j");
  EXPECT_TRUE(absl::IsFailedPrecondition(resumed.status()));
  EXPECT_THAT(resumed.status().message(), HasSubstr("no complete checkpoint"));
  EXPECT_EQ(StateOf("j"), STOPPED);
}

TEST_F(CheckpointingTest, ShardsWithoutARootMeanTheJobIsNotSaved) {
  Register("s0", SHARD, 2, /*checkpoints=*/false);
  Register("s1", SHARD, 2, /*checkpoints=*/false);
  Start();
  EXPECT_FALSE(Beat("w").tasks(0).checkpoints());
  EXPECT_THAT(state_->CheckpointJob("j").status().message(), HasSubstr("--checkpoint_root"));
}

TEST_F(CheckpointingTest, BadCheckpointSpecsAreRejectedNamingTheField) {
  JobSpec spec = SmallSpec(1, 2);
  spec.mutable_checkpoint()->set_every_steps(-1);
  EXPECT_THAT(state_->SubmitJob(spec, "").status().message(),
              HasSubstr("checkpoint.every_steps must not be negative"));
  spec.mutable_checkpoint()->set_every_steps(0);
  spec.mutable_checkpoint()->set_keep(-2);
  EXPECT_THAT(state_->SubmitJob(spec, "").status().message(),
              HasSubstr("checkpoint.keep must be at least 1"));
}

// --------------------------------------------------------------- restarts

TEST_F(CheckpointingTest, ALostNodeRestartsTheJobFromItsNewestCheckpointAfterTheBackoff) {
  JobSpec spec = SmallMlpJob(1, 2);
  spec.mutable_restart()->set_max_restarts(2);
  spec.mutable_restart()->set_backoff_seconds(3);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  WorkerTook(4);
  ShardWrote(0, 4);
  ShardWrote(1, 4);
  Register("spare", SHARD, 1, /*checkpoints=*/true);
  // Shard s1 goes silent.
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Seconds(2));
    for (const char* node : {"s0", "w", "spare"}) Beat(node);
  }
  state_->Tick();
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), PENDING);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.message(), HasSubstr("restarting after: shard node s1"));
  EXPECT_THAT(Events(), HasSubstr("restart 1 (1 of 2 in a row) in 3s after: shard node s1"));
  EXPECT_THAT(Events(), HasSubstr("continues from the checkpoint at step 4"));
  // Not before the back-off.
  Advance(absl::Seconds(2));
  for (const char* node : {"s0", "w", "spare"}) Beat(node);
  state_->Tick();
  EXPECT_EQ(StateOf("j"), PENDING);
  Advance(absl::Seconds(2));
  for (const char* node : {"s0", "w", "spare"}) Beat(node);
  state_->Tick();
  job = *state_->GetJob("j");
  ASSERT_EQ(job.state(), RUNNING);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.resumed_from_step(), 4);
  // The spare took the lost shard's place; every node restores step 4.
  EXPECT_THAT(job.placement().shard_nodes(), ::testing::UnorderedElementsAre("s0", "spare"));
  const Task task = Beat("spare").tasks(0);
  EXPECT_EQ(task.attempt(), 2);
  EXPECT_EQ(task.restore().step(), 4);
}

TEST_F(CheckpointingTest, AnAsyncJobHasOnlyALostShardsPartitionsRestoredOnASpare) {
  JobSpec spec = SmallMlpJob(1, 2);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  WorkerTook(4);
  ShardWrote(0, 4);
  ShardWrote(1, 4);
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "w", 0, 7)).ok());
  Register("spare", SHARD, 1, /*checkpoints=*/true);
  for (int i = 0; i < 4; ++i) {  // s1 goes silent.
    Advance(absl::Seconds(2));
    for (const char* node : {"s0", "w", "spare"}) Beat(node);
  }
  state_->Tick();
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.placement().shard_nodes(), ::testing::ElementsAre("s0", "spare"));
  EXPECT_THAT(Events(), HasSubstr("shard 1's partitions restored from the checkpoint at step 4 on "
                                  "shard node spare; the other shards keep theirs (ASYNC)"));
  // The spare restores its index; the worker continues its rank through the
  // new placement from where it was.
  const Task shard = Beat("spare").tasks(0);
  EXPECT_EQ(shard.rank(), 1);
  EXPECT_EQ(shard.restore().step(), 4);
  const Task worker = Beat("w").tasks(0);
  EXPECT_EQ(worker.join().step(), 7);
  EXPECT_EQ(worker.join().worker_state(), "worker state bytes");
  EXPECT_EQ(worker.shard_addresses(1), "spare:1");
}

TEST_F(CheckpointingTest, RestartsBeyondThePolicyFailTheJobWithItsHistory) {
  JobSpec spec = SmallMlpJob(1, 2);
  spec.mutable_restart()->set_max_restarts(1);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  ReportProgressRequest crash = Progress("j", "w", 0, 3);
  crash.set_error("CUDA error: an illegal memory access was encountered");
  ASSERT_TRUE(state_->ReportProgress(crash).ok());
  EXPECT_EQ(StateOf("j"), PENDING);
  Pass(absl::Seconds(3));
  state_->Tick();
  ASSERT_EQ(StateOf("j"), RUNNING);
  EXPECT_FALSE(Beat("w").tasks(0).has_restore());  // No checkpoint yet: from the start.
  ASSERT_TRUE(state_->ReportProgress(crash).ok());
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), FAILED);
  EXPECT_THAT(
      job.message(),
      HasSubstr(
          "illegal memory access was encountered (after 1 automatic restarts without progress"));
  EXPECT_THAT(Events(), HasSubstr("from the start (no checkpoint yet)"));
}

TEST_F(CheckpointingTest, AJobThatKeepsMakingProgressIsNeverStoppedByTheRestartLimit) {
  JobSpec spec = SmallMlpJob(1, 2);
  spec.mutable_restart()->set_max_restarts(1);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  ReportProgressRequest crash = Progress("j", "w", 0, 3);
  crash.set_error("host lost power");
  for (int64_t step : {2, 4, 6}) {
    // A checkpoint between failures: each restart is the first in a row.
    WorkerTook(step);
    ShardWrote(0, step);
    ShardWrote(1, step);
    ASSERT_TRUE(state_->ReportProgress(crash).ok());
    const JobStatus job = *state_->GetJob("j");
    ASSERT_EQ(job.state(), PENDING) << job.message();
    EXPECT_EQ(job.restarts_in_a_row(), 1);
    Pass(absl::Seconds(3));  // The back-off stays at 1 s.
    state_->Tick();
    ASSERT_EQ(StateOf("j"), RUNNING);
  }
  EXPECT_EQ(state_->GetJob("j")->restarts(), 3);
  ASSERT_TRUE(state_->ReportProgress(crash).ok());  // No progress since: the limit.
  EXPECT_EQ(StateOf("j"), FAILED);
}

TEST_F(CheckpointingTest, PermanentErrorsAndDivergenceFailAtOnceUnlessRollbackIsAsked) {
  JobSpec spec = SmallMlpJob(1, 2);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  ReportProgressRequest bad = Progress("j", "w", 0, 3);
  bad.set_error("corrupt record in train-0 at offset 12");
  bad.set_permanent(true);
  ASSERT_TRUE(state_->ReportProgress(bad).ok());
  EXPECT_EQ(StateOf("j"), FAILED);

  ASSERT_TRUE(state_->SubmitJob(spec, "k").ok());
  ReportProgressRequest nan = Progress("k", "w", 0, 7);
  nan.set_error("training diverged at step 7: the loss is nan");
  nan.set_diverged(true);
  ASSERT_TRUE(state_->ReportProgress(nan).ok());
  EXPECT_EQ(StateOf("k"), FAILED);

  spec.mutable_restart()->set_rollback_on_divergence(true);
  ASSERT_TRUE(state_->SubmitJob(spec, "l").ok());
  nan.set_job_id("l");
  ASSERT_TRUE(state_->ReportProgress(nan).ok());
  EXPECT_EQ(StateOf("l"), PENDING);
  EXPECT_EQ(state_->GetJob("l")->restarts(), 1);
}

}  // namespace
}  // namespace control
}  // namespace downpour
