#include "control/coordinator_state.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/file.h"
#include "control/coordinator_state_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/checkpoint_files.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;

TEST_F(CoordinatorStateTest, JobWaitsForNodesThenRunsWithPlacement) {
  auto job = state_->SubmitJob(SmallSpec(2, 2), "j");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), PENDING);
  EXPECT_NE(job->message().find("waiting for 2 free workers"), std::string::npos);
  Register("s1", SHARD);
  Register("s2", SHARD);
  Register("w1", WORKER);
  EXPECT_EQ(state_->GetJob("j")->state(), PENDING);
  Register("w2", WORKER);
  JobStatus running = *state_->GetJob("j");
  EXPECT_EQ(running.state(), RUNNING);
  EXPECT_EQ(running.placement().shard_nodes_size(), 2);
  EXPECT_EQ(running.placement().worker_nodes_size(), 2);
  // 4 tensors (2 weights, 2 biases), each on some shard.
  EXPECT_EQ(running.placement().partitions_size(), 4);

  HeartbeatResponse w2 = Beat("w2");
  ASSERT_EQ(w2.tasks_size(), 1);
  EXPECT_EQ(w2.tasks(0).rank(), 1);
  EXPECT_EQ(w2.tasks(0).shard_addresses_size(), 2);
  EXPECT_EQ(Beat("s2").tasks_size(), 1);
}

TEST_F(CoordinatorStateTest, SucceedsWhenAllWorkersFinishAndAccuracyIsReported) {
  Register("s", SHARD);
  Register("a", WORKER);
  Register("b", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(2, 1), "j").ok());
  const JobStatus job = *state_->GetJob("j");
  const std::string w0 = job.placement().worker_nodes(0), w1 = job.placement().worker_nodes(1);

  ReportProgressRequest p1 = Progress("j", w1, 1, 10);
  p1.set_finished(true);
  ASSERT_TRUE(state_->ReportProgress(p1).ok());
  EXPECT_EQ(state_->GetJob("j")->state(), RUNNING);
  ASSERT_TRUE(state_->ReportProgress(Progress("j", w0, 0, 7)).ok());
  EXPECT_EQ(state_->GetJob("j")->step(), 7);

  ReportProgressRequest p0 = Progress("j", w0, 0, 10);
  p0.set_finished(true);
  p0.set_has_test_accuracy(true);
  p0.set_test_accuracy(0.9);
  auto response = state_->ReportProgress(p0);
  ASSERT_TRUE(response.ok());
  EXPECT_TRUE(response->job_ended());
  JobStatus done = *state_->GetJob("j");
  EXPECT_EQ(done.state(), SUCCEEDED);
  EXPECT_DOUBLE_EQ(done.test_accuracy(), 0.9);
  EXPECT_EQ(Beat(w0).tasks_size(), 0);
}

// A rank's word that it finished is checked against what the shards know
// of its steps once they report them: a worker that says it finished far
// ahead of its pushes does not end the job, and one past its steps is
// refused.
TEST_F(CoordinatorStateTest, AFinishedClaimEndsTheJobOnlyOnceTheShardsKnowTheSteps) {
  Register("s", SHARD);
  Register("a", WORKER);
  Register("b", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(2, 1), "j").ok());
  const JobStatus job = *state_->GetJob("j");
  const std::string w0 = job.placement().worker_nodes(0), w1 = job.placement().worker_nodes(1);
  auto shard_knows = [&](int64_t rank0, int64_t rank1, int64_t attempt) {
    HeartbeatRequest beat;
    beat.set_node_id("s");
    beat.set_incarnation(1);
    ShardJobSteps* steps = beat.add_job_steps();
    steps->set_job_id("j");
    steps->set_attempt(attempt);
    steps->add_worker_steps(rank0);
    steps->add_worker_steps(rank1);
    ASSERT_TRUE(state_->Heartbeat(beat).ok());
  };
  shard_knows(3, 3, job.attempt());

  ReportProgressRequest past = Progress("j", w0, 0, 5000);
  past.set_finished(true);
  EXPECT_EQ(state_->ReportProgress(past).status().code(), absl::StatusCode::kInvalidArgument);
  ReportProgressRequest p1 = Progress("j", w1, 1, 10);
  p1.set_finished(true);
  ASSERT_TRUE(state_->ReportProgress(p1).ok());
  ReportProgressRequest p0 = Progress("j", w0, 0, 10);
  p0.set_finished(true);
  p0.set_has_test_accuracy(true);
  p0.set_test_accuracy(0.99);
  ASSERT_TRUE(state_->ReportProgress(p0).ok());
  JobStatus waiting = *state_->GetJob("j");
  EXPECT_EQ(waiting.state(), RUNNING);
  EXPECT_THAT(waiting.message(), HasSubstr("waiting for the shards to confirm the steps of rank "
                                           "0's 10, rank 1's 10"));
  // Another start's figures count for nothing; rank 1's part is known.
  shard_knows(10, 10, job.attempt() + 1);
  shard_knows(3, 10, job.attempt());
  waiting = *state_->GetJob("j");
  EXPECT_EQ(waiting.state(), RUNNING);
  EXPECT_THAT(waiting.message(), HasSubstr("the steps of rank 0's 10 (they know of 3)"));
  // Their next heartbeat knows every step: the job ends.
  shard_knows(10, 10, job.attempt());
  const JobStatus done = *state_->GetJob("j");
  EXPECT_EQ(done.state(), SUCCEEDED);
  EXPECT_DOUBLE_EQ(done.test_accuracy(), 0.99);
  EXPECT_EQ(done.workers(0).shard_step(), 10);
}

// Shards that never confirm the workers' word do not hold the job forever:
// it restarts (here, with no restart allowed, fails) after the checkpoint
// timeout, saying why.
TEST_F(CoordinatorStateTest, AFinishedClaimTheShardsNeverConfirmEndsTheWait) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  const JobStatus job = *state_->GetJob("j");
  HeartbeatRequest beat;
  beat.set_node_id("s");
  beat.set_incarnation(1);
  ShardJobSteps* steps = beat.add_job_steps();
  steps->set_job_id("j");
  steps->set_attempt(job.attempt());
  steps->add_worker_steps(3);
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  ReportProgressRequest done = Progress("j", job.placement().worker_nodes(0), 0, 10);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(0.99);
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  state_->Tick();
  EXPECT_EQ(StateOf("j"), RUNNING);
  Advance(absl::Minutes(2));
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  state_->Tick();
  const JobStatus ended = *state_->GetJob("j");
  EXPECT_EQ(ended.state(), FAILED);
  EXPECT_THAT(ended.message(), HasSubstr("the shards did not confirm the workers' last steps"));
}

// A rank that says it finished short of its steps (they grew as it
// finished) is not finished: it runs again for the rest.
TEST_F(CoordinatorStateTest, AFinishedClaimShortOfTheRanksStepsIsNotTaken) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  const std::string w0 = state_->GetJob("j")->placement().worker_nodes(0);
  ReportProgressRequest early = Progress("j", w0, 0, 7);
  early.set_finished(true);
  early.set_has_test_accuracy(true);
  early.set_test_accuracy(0.5);
  ASSERT_TRUE(state_->ReportProgress(early).ok());
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_FALSE(job.workers(0).finished());
  EXPECT_EQ(job.workers(0).step(), 7);
}

TEST_F(CoordinatorStateTest, EvaluationsAreRecordedAndStopAtAccuracyEndsTheJob) {
  Register("s", SHARD);
  Register("a", WORKER);
  JobSpec spec = SmallSpec(1, 1);
  spec.set_steps(1000);
  spec.set_eval_every_steps(100);
  spec.set_stop_at_accuracy(0.9);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  auto evaluate = [&](int64_t step, double accuracy) {
    ReportProgressRequest report = Progress("j", "a", 0, step);
    report.mutable_evaluation()->set_step(step);
    report.mutable_evaluation()->set_accuracy(accuracy);
    return state_->ReportProgress(report).value();
  };
  EXPECT_FALSE(evaluate(100, 0.7).job_ended());
  Advance(absl::Seconds(5));
  EXPECT_FALSE(evaluate(200, 0.85).job_ended());
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  ASSERT_EQ(job.evaluations_size(), 2);
  EXPECT_EQ(job.evaluations(1).step(), 200);
  EXPECT_EQ(job.evaluations(1).time_ms() - job.evaluations(0).time_ms(), 5000);
  EXPECT_EQ(StoredJob("j")->evaluations_size(), 2);  // Durable at once.
  EXPECT_TRUE(evaluate(300, 0.91).job_ended());
  job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_DOUBLE_EQ(job.test_accuracy(), 0.91);
  EXPECT_EQ(job.message(),
            "stopped early: test accuracy 0.91 reached stop_at_accuracy 0.9 at step 300");
  EXPECT_EQ(job.evaluations_size(), 3);
}

TEST_F(CoordinatorStateTest, AucAndLogLossAreTheNewestEvaluationsAndARestartClearsThem) {
  Register("s", SHARD);
  Register("a", WORKER);
  JobSpec spec = SmallSpec(1, 1);
  spec.mutable_model()->set_num_classes(2);
  spec.mutable_model()->mutable_layer(2)->mutable_dense()->set_units(2);
  spec.add_metrics(AUC);
  spec.add_metrics(LOG_LOSS);
  spec.set_steps(100);
  spec.set_eval_every_steps(50);
  spec.mutable_restart()->set_max_restarts(1);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  ReportProgressRequest evaluated = Progress("j", "a", 0, 50);
  evaluated.mutable_evaluation()->set_step(50);
  evaluated.mutable_evaluation()->set_accuracy(0.7);
  evaluated.mutable_evaluation()->set_auc(0.75);
  evaluated.mutable_evaluation()->set_log_loss(0.5);
  ASSERT_TRUE(state_->ReportProgress(evaluated).ok());
  JobStatus job = *state_->GetJob("j");
  EXPECT_DOUBLE_EQ(job.test_auc(), 0.75);
  EXPECT_DOUBLE_EQ(job.test_log_loss(), 0.5);
  EXPECT_LT(job.test_accuracy(), 0);  // Still the final one's alone.
  ASSERT_EQ(job.evaluations_size(), 1);
  EXPECT_DOUBLE_EQ(job.evaluations(0).auc(), 0.75);
  EXPECT_DOUBLE_EQ(StoredJob("j")->test_auc(), 0.75);

  ReportProgressRequest failed = Progress("j", "a", 0, 60);
  failed.set_error("pulling from shard 0: deadline exceeded");
  ASSERT_TRUE(state_->ReportProgress(failed).ok());
  job = *state_->GetJob("j");
  ASSERT_EQ(job.state(), PENDING);
  EXPECT_FALSE(job.has_test_auc());
  EXPECT_FALSE(job.has_test_log_loss());

  Advance(absl::Seconds(2));
  Beat("s");
  Beat("a");
  state_->Tick();
  ASSERT_EQ(StateOf("j"), RUNNING);
  ReportProgressRequest done = Progress("j", "a", 0, 100);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(0.8);
  done.set_test_auc(0.81);
  done.set_test_log_loss(0.42);
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_DOUBLE_EQ(job.test_auc(), 0.81);
  EXPECT_DOUBLE_EQ(job.test_log_loss(), 0.42);
  const Evaluation& final = *job.evaluations().rbegin();
  EXPECT_EQ(final.step(), 100);
  EXPECT_DOUBLE_EQ(final.auc(), 0.81);
  EXPECT_DOUBLE_EQ(final.log_loss(), 0.42);
}

TEST_F(CoordinatorStateTest, AReportOfAnotherStartOfTheJobIsIgnored) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ReportProgressRequest stale = Progress("j", "a", 0, 5);
  stale.set_attempt(state_->GetJob("j")->attempt() + 1);
  stale.set_error("pulling from shard 0: still at version 279 < 280");
  EXPECT_TRUE(state_->ReportProgress(stale).value().job_ended());
  EXPECT_EQ(StateOf("j"), RUNNING);
  EXPECT_EQ(state_->GetJob("j")->restarts(), 0);
}

TEST_F(CoordinatorStateTest, WrongNodeCannotReportForARank) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  auto response = state_->ReportProgress(Progress("j", "intruder", 0, 1));
  EXPECT_TRUE(absl::IsPermissionDenied(response.status()));
}

TEST_F(CoordinatorStateTest, WorkerErrorFailsJob) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ReportProgressRequest r = Progress("j", "a", 0, 3);
  r.set_error("corrupt record in x at offset 12");
  ASSERT_TRUE(state_->ReportProgress(r).ok());
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), FAILED);
  EXPECT_NE(job.message().find("offset 12"), std::string::npos);
}

TEST_F(CoordinatorStateTest, SilentNodeIsDeclaredDeadAndFailsItsJobs) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  Advance(absl::Seconds(3));
  Beat("a");
  state_->Tick();
  EXPECT_EQ(state_->GetJob("j")->state(), RUNNING);
  Advance(absl::Seconds(3));  // s silent for 6 s > 5 s.
  Beat("a");
  state_->Tick();
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), FAILED);
  EXPECT_NE(job.message().find("shard node s"), std::string::npos) << job.message();
  bool s_alive = true;
  const std::vector<NodeInfo> nodes = state_->ListNodes().value();
  for (const NodeInfo& n : nodes) {
    if (n.id() == "s") s_alive = n.alive();
  }
  EXPECT_FALSE(s_alive);
}

TEST_F(CoordinatorStateTest, RestartedWorkerTakesItsRankBackRestartedShardFailsTheJob) {
  Register("s", SHARD);
  Register("a", WORKER, 1);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "a", 0, 7)).ok());
  Register("a", WORKER, 2);
  // The rank was lost, and the worker back with a new incarnation is free:
  // it takes the rank over where it had got to.
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_FALSE(job.workers(0).lost());
  EXPECT_TRUE(job.workers(0).joined());
  EXPECT_TRUE(Beat("a", 1).reregister());
  HeartbeatResponse beat = Beat("a", 2);
  ASSERT_EQ(beat.tasks_size(), 1);
  EXPECT_TRUE(beat.tasks(0).has_join());
  EXPECT_EQ(beat.tasks(0).join().step(), 7);
  Register("s", SHARD, 2);
  EXPECT_EQ(StateOf("j"), FAILED);
}

TEST_F(CoordinatorStateTest, ALostSyncWorkersRankIsWaitedForThenGoesToAFreeWorker) {
  Register("s", SHARD);
  Register("a", WORKER);
  Register("b", WORKER);
  JobSpec spec = SmallSpec(2, 1);
  spec.set_steps(100);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "a", 0, 10)).ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "b", 1, 8)).ok());
  for (int i = 0; i < 2; ++i) {  // b silent for 6 s > 5 s.
    Advance(absl::Seconds(3));
    Beat("s");
    Beat("a");
    state_->Tick();
  }
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_TRUE(job.workers(1).lost());
  EXPECT_EQ(job.placement().worker_nodes(1), "");
  EXPECT_THAT(job.message(), HasSubstr("worker rank 1 lost; waiting for a free worker"));
  EXPECT_THAT(job.events().rbegin()->message(),
              HasSubstr("worker rank 1 lost at step 8: worker node b"));
  // SYNC: the shards wait for the rank (a step without it would skip its
  // batch), until a worker takes it over or the hand-over wait is over.
  HeartbeatResponse shard = Beat("s");
  ASSERT_EQ(shard.tasks_size(), 1);
  EXPECT_TRUE(shard.tasks(0).absent_ranks().empty());
  // b's late report is refused: the rank is no longer its.
  EXPECT_TRUE(absl::IsPermissionDenied(state_->ReportProgress(Progress("j", "b", 1, 9)).status()));

  Register("c", WORKER);
  job = *state_->GetJob("j");
  EXPECT_EQ(job.placement().worker_nodes(1), "c");
  EXPECT_FALSE(job.workers(1).lost());
  EXPECT_EQ(job.message(), "");
  EXPECT_THAT(job.events().rbegin()->message(),
              HasSubstr("worker rank 1 taken over by worker node c from step 8"));
  HeartbeatResponse beat = Beat("c");
  ASSERT_EQ(beat.tasks_size(), 1);
  EXPECT_EQ(beat.tasks(0).rank(), 1);
  EXPECT_EQ(beat.tasks(0).join().step(), 8);
  EXPECT_TRUE(Beat("s").tasks(0).absent_ranks().empty());
  EXPECT_FALSE(Beat("a").tasks(0).has_join());
}

TEST_F(CoordinatorStateTest, ADrainedWorkersRankEndsUntrainedWhenNoWorkerIsFree) {
  Register("s", SHARD);
  Register("a", WORKER);
  Register("b", WORKER);
  JobSpec spec = SmallSpec(2, 1);
  spec.set_steps(100);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  HeartbeatRequest draining;
  draining.set_node_id("b");
  draining.set_incarnation(1);
  draining.set_draining(true);
  ASSERT_TRUE(state_->Heartbeat(draining).ok());
  ReportProgressRequest drained = Progress("j", "b", 1, 30);
  drained.set_drained(true);
  ASSERT_TRUE(state_->ReportProgress(drained).value().job_ended());
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_TRUE(job.workers(1).lost());
  EXPECT_THAT(job.events().rbegin()->message(), HasSubstr("drained after step 30"));
  // A draining worker gets no work: not the rank it gave back, nor a new job.
  EXPECT_EQ(Beat("b").tasks_size(), 0);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "k").ok());
  EXPECT_EQ(StateOf("k"), PENDING);
  const std::vector<NodeInfo> nodes = state_->ListNodes().value();
  for (const NodeInfo& node : nodes) {
    EXPECT_EQ(node.draining(), node.id() == "b") << node.id();
  }

  ReportProgressRequest done = Progress("j", "a", 0, 100);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(0.8);
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_THAT(job.message(), HasSubstr("without the data of worker rank 1 from step 30"));
}

TEST_F(CoordinatorStateTest, AWorkerCannotComeBackAsAShardAndDropItsRank) {
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ASSERT_EQ(StateOf("j"), RUNNING);
  NodeInfo impostor;
  impostor.set_id("w");
  impostor.set_role(SHARD);
  impostor.set_address("bogus:1");
  impostor.set_incarnation(7);
  EXPECT_EQ(state_->RegisterNode(impostor).status().code(), absl::StatusCode::kPermissionDenied);
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_FALSE(job.workers(0).lost());
  EXPECT_EQ(job.placement().worker_nodes(0), "w");
}

TEST_F(CoordinatorStateTest, WorkersRunOneJobAtATimeShardsAreShared) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "first").ok());
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "second").ok());
  EXPECT_EQ(state_->GetJob("first")->state(), RUNNING);
  EXPECT_EQ(state_->GetJob("second")->state(), PENDING);
  ASSERT_TRUE(state_->StopJob("first").ok());
  EXPECT_EQ(state_->GetJob("first")->state(), STOPPED);
  EXPECT_EQ(state_->GetJob("second")->state(), RUNNING);
}

TEST_F(CoordinatorStateTest, RejectsBadSpecsAndIds) {
  JobSpec bad = SmallSpec(1, 1);
  bad.set_num_workers(0);
  EXPECT_TRUE(absl::IsInvalidArgument(state_->SubmitJob(bad, "").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(state_->SubmitJob(SmallSpec(1, 1), "bad id!").status()));
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "x").ok());
  EXPECT_TRUE(absl::IsAlreadyExists(state_->SubmitJob(SmallSpec(1, 1), "x").status()));
  EXPECT_TRUE(absl::IsNotFound(state_->GetJob("nope").status()));
  EXPECT_EQ(state_->ListJobs()->size(), 1u);
}

TEST_F(CoordinatorStateTest, JobsAndNodesSurviveRestart) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  const JobStatus before = *state_->GetJob("j");
  Restart();
  JobStatus after = *state_->GetJob("j");
  EXPECT_EQ(after.state(), RUNNING);
  EXPECT_EQ(after.placement().SerializeAsString(), before.placement().SerializeAsString());
  // Known nodes keep heartbeating without re-registering and keep their task.
  HeartbeatResponse beat = Beat("a");
  EXPECT_FALSE(beat.reregister());
  EXPECT_EQ(beat.tasks_size(), 1);
}

TEST_F(CoordinatorStateTest, ANodeMissingWhenItsJobIsBackIsJudgedByTheTimeoutNotTheGrace) {
  Register("s", SHARD);
  Register("a", WORKER);
  Register("b", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(2, 1), "j").ok());
  // Worker b dies while the coordinator is down.
  Advance(absl::Seconds(15));
  Restart();
  Advance(absl::Seconds(1));
  Beat("s");
  Beat("a");
  state_->Tick();
  EXPECT_FALSE(state_->GetJob("j")->workers(1).lost());
  // The others are back: b is missing, judged within the node timeout of
  // their return (5 s), not after the 10-minute grace.
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(2));
    Beat("s");
    Beat("a");
    state_->Tick();
  }
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING);
  EXPECT_TRUE(job.workers(1).lost()) << job.DebugString();
  EXPECT_FALSE(job.workers(0).lost());
}

TEST_F(CoordinatorStateTest, NodesGetTheRecoveryGraceAfterARestartAndLateResultsCount) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  // Down for three times the node timeout: nothing is judged meanwhile, and
  // a restarted coordinator waits (the default grace is 10 minutes).
  Advance(absl::Seconds(15));
  Restart();
  Advance(absl::Minutes(9));
  state_->Tick();
  EXPECT_EQ(StateOf("j"), RUNNING);
  // The job finished during the outage; its final report arrives late.
  ReportProgressRequest done = Progress("j", "a", 0, 10);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(0.75);
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  EXPECT_EQ(StateOf("j"), SUCCEEDED);
  // A node heard from since the restart follows the node timeout again; one
  // never heard from is judged when the grace ends.
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "k").ok());
  EXPECT_EQ(StateOf("k"), PENDING);  // Its nodes are not heard from yet.
  Beat("a");
  Advance(absl::Minutes(1) + absl::Seconds(1));
  state_->Tick();
  const std::vector<NodeInfo> nodes = state_->ListNodes().value();
  for (const NodeInfo& node : nodes) EXPECT_FALSE(node.alive()) << node.id();
}

TEST_F(CoordinatorStateTest, WatchReturnsOnChange) {
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  const int64_t version = state_->GetJob("j")->version();
  std::thread stopper([this] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(state_->StopJob("j").ok());
  });
  auto changed = state_->WatchJob("j", version, absl::Hours(1));
  stopper.join();
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(changed->state(), STOPPED);
}

// The watch's timeout runs on the injected clock, not the machine's.
TEST_F(CoordinatorStateTest, WatchTimesOutOnTheInjectedClock) {
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  const int64_t version = state_->GetJob("j")->version();
  absl::Notification returned;
  absl::StatusOr<JobStatus> watched;
  std::thread watcher([&] {
    watched = state_->WatchJob("j", version, absl::Hours(1));
    returned.Notify();
  });
  // The machine's clock passing does not end it...
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  // ...the injected one does, once a tick lets the watcher look (an hour on
  // the machine's clock would outlast the test).
  Advance(absl::Hours(1) + absl::Seconds(1));
  state_->Tick();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  watcher.join();
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->version(), version);
}

// A change the store cannot record does not happen: the request fails with
// the store's error, and memory and disk keep agreeing.
TEST_F(CoordinatorStateTest, FailedWritesFailTheRequestAndChangeNothing) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ASSERT_EQ(StateOf("j"), RUNNING);
  stored_.failing = true;

  auto submitted = state_->SubmitJob(SmallSpec(1, 1), "k");
  EXPECT_THAT(submitted.status().message(), HasSubstr("disk I/O error"));
  EXPECT_TRUE(absl::IsNotFound(state_->GetJob("k").status()));

  auto stopped = state_->StopJob("j");
  EXPECT_THAT(stopped.status().message(), HasSubstr("disk I/O error"));
  EXPECT_EQ(StateOf("j"), RUNNING);

  ReportProgressRequest done = Progress("j", "a", 0, 10);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(0.9);
  EXPECT_FALSE(state_->ReportProgress(done).ok());  // The worker retries a result.
  EXPECT_EQ(StateOf("j"), RUNNING);
  ReportProgressRequest failed = Progress("j", "a", 0, 3);
  failed.set_error("boom");
  EXPECT_FALSE(state_->ReportProgress(failed).ok());
  EXPECT_EQ(StateOf("j"), RUNNING);
  EXPECT_EQ(StoredJob("j")->state(), RUNNING);

  stored_.failing = false;
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  EXPECT_EQ(StateOf("j"), SUCCEEDED);
  EXPECT_EQ(StoredJob("j")->state(), SUCCEEDED);
}

// Changes the coordinator makes by itself are retried on the next tick.
TEST_F(CoordinatorStateTest, DeadNodeFailsItsJobOnceThatCanBeWritten) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ASSERT_EQ(StateOf("j"), RUNNING);
  stored_.failing = true;
  // The shard goes silent; declaring it dead fails job j, which cannot be
  // written: j stays RUNNING in memory as on disk, until a tick can write.
  Advance(absl::Seconds(6));
  Beat("a");
  state_->Tick();
  EXPECT_EQ(StateOf("j"), RUNNING);
  EXPECT_EQ(StoredJob("j")->state(), RUNNING);
  stored_.failing = false;
  state_->Tick();
  EXPECT_EQ(StateOf("j"), FAILED);
  EXPECT_EQ(StoredJob("j")->state(), FAILED);
  EXPECT_THAT(StateOf("j") == FAILED ? state_->GetJob("j")->message() : "",
              HasSubstr("shard node s"));
}

TEST_F(CoordinatorStateTest, PendingJobStartsOnceItsStartCanBeWritten) {
  Register("s", SHARD);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "k").ok());
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "m").ok());
  ASSERT_EQ(StateOf("k"), RUNNING);
  ASSERT_EQ(StateOf("m"), PENDING);
  stored_.failing_job = "m";
  // k's end is written; m's start, which it makes possible, is not.
  ASSERT_TRUE(state_->StopJob("k").ok());
  EXPECT_EQ(StateOf("m"), PENDING);
  EXPECT_EQ(StoredJob("m")->state(), PENDING);
  state_->Tick();
  EXPECT_EQ(StateOf("m"), PENDING);
  stored_.failing_job.clear();
  state_->Tick();
  EXPECT_EQ(StateOf("m"), RUNNING);
  EXPECT_EQ(StoredJob("m")->state(), RUNNING);
}

}  // namespace
}  // namespace control
}  // namespace downpour
