// The coordinator shares a job's record files out to its ranks and hands a
// lost rank on (control/rank_handover.cc): a SYNC rank to one of the job's
// workers, an ASYNC rank's share and steps to the live ranks.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "control/coordinator_state_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> FilesOf(const google::protobuf::RepeatedPtrField<DataPart>& parts) {
  std::vector<std::string> files;
  for (const DataPart& part : parts) {
    EXPECT_EQ(part.stride(), 1);
    files.push_back(part.file());
  }
  return files;
}

class DataAssignmentTest : public CoordinatorStateTest {
 protected:
  // Starts job "j" of three workers a, b, c (ranks 0, 1, 2) on shard s, of
  // 100 steps.
  // `restarts`: the job's max_restarts (SmallSpec's -1: none).
  void StartJob(ConsistencySpec::Mode mode = ConsistencySpec::SYNC, bool sparse = false,
                int restarts = -1) {
    Register("s", SHARD);
    for (const char* worker : {"a", "b", "c"}) Register(worker, WORKER);
    JobSpec spec = SmallSpec(3, 1);
    spec.mutable_restart()->set_max_restarts(restarts);
    if (sparse) *spec.mutable_model() = SmallSparseModel();
    spec.set_steps(100);
    spec.mutable_consistency()->set_mode(mode);
    ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
    ASSERT_EQ(state_->GetJob("j")->placement().worker_nodes(1), "b");
  }

  // Node `node` (rank `rank`) lists `files` files part-0 ... and asks for
  // its share.
  ReportProgressResponse List(const std::string& node, int rank, int files) {
    ReportProgressRequest listing = Progress("j", node, rank, 0);
    for (int i = 0; i < files; ++i) listing.add_data_files(absl::StrCat("part-", i));
    auto answer = state_->ReportProgress(listing);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.value_or(ReportProgressResponse());
  }

  // `ticks` ticks 3 s apart, the shard and the workers but `silent`
  // heartbeating.
  void PassWithout(const std::string& silent, int ticks) {
    for (int i = 0; i < ticks; ++i) {
      Advance(absl::Seconds(3));
      for (const char* node : {"s", "a", "b", "c"}) {
        if (node != silent) Beat(node);
      }
      state_->Tick();
    }
  }
};

TEST_F(DataAssignmentTest, TheFirstListingSharesTheFilesOutAndTasksCarryEachRanksShare) {
  StartJob();
  EXPECT_EQ(Beat("a").tasks(0).data_size(), 0);  // Nobody has listed yet.
  const ReportProgressResponse answer = List("a", 0, 7);
  EXPECT_THAT(FilesOf(answer.data()), ::testing::ElementsAre("part-0", "part-3", "part-6"));
  JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.data_files_size(), 7);
  EXPECT_EQ(job.workers(0).step(), 0);
  EXPECT_THAT(job.events().rbegin()->message(),
              HasSubstr("training data: 7 record files matching"));
  EXPECT_THAT(job.events().rbegin()->message(),
              HasSubstr("(listed by worker a), whole files round-robin shared among 3 ranks"));
  // A later listing gets the recorded share, whatever it saw.
  EXPECT_THAT(FilesOf(List("b", 1, 9).data()), ::testing::ElementsAre("part-1", "part-4"));
  HeartbeatResponse beat = Beat("c");
  ASSERT_EQ(beat.tasks_size(), 1);
  EXPECT_THAT(FilesOf(beat.tasks(0).data()), ::testing::ElementsAre("part-2", "part-5"));
  EXPECT_EQ(beat.tasks(0).data_step(), 0);
  // Not the rank's node: refused.
  ReportProgressRequest stranger = Progress("j", "c", 0, 0);
  stranger.add_data_files("part-0");
  EXPECT_TRUE(absl::IsPermissionDenied(state_->ReportProgress(stranger).status()));
}

TEST_F(DataAssignmentTest, FewerFilesThanWorkersShareEveryFilesRecordsByRank) {
  StartJob();
  const ReportProgressResponse answer = List("b", 1, 2);
  ASSERT_EQ(answer.data_size(), 2);
  for (const DataPart& part : answer.data()) {
    EXPECT_EQ(part.stride(), 3);
    EXPECT_EQ(part.offset(), 1);
  }
  EXPECT_THAT(state_->GetJob("j")->events().rbegin()->message(),
              HasSubstr("each file's records round-robin"));
}

TEST_F(DataAssignmentTest, ALostSyncRankGoesToAWorkerOfTheJobWhenNoWorkerIsFree) {
  StartJob();
  List("a", 0, 7);
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "a", 0, 40)).ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "b", 1, 30)).ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "c", 2, 35)).ok());
  // b falls silent: lost after the node timeout, its rank held for
  // handover_wait (30 s) in case a free worker comes to take it over.
  PassWithout("b", 10);
  JobStatus job = *state_->GetJob("j");
  ASSERT_TRUE(job.workers(1).lost());
  EXPECT_THAT(job.message(), HasSubstr("then a worker of the job trains it beside its own rank"));
  // The steps wait for it meanwhile.
  EXPECT_TRUE(Beat("s").tasks(0).absent_ranks().empty());
  Advance(absl::Seconds(6));
  Beat("s");
  Beat("a");
  Beat("c");
  state_->Tick();
  job = *state_->GetJob("j");
  // The job's workers each train one rank: the first of them, a, takes it
  // over as a taker would, from the rank's step, with the rank's own data.
  EXPECT_FALSE(job.workers(1).lost());
  EXPECT_FALSE(job.workers(1).absorbed());
  EXPECT_TRUE(job.workers(1).joined());
  EXPECT_EQ(job.placement().worker_nodes(1), "a");
  EXPECT_EQ(job.message(), "");
  EXPECT_THAT(job.events().rbegin()->message(),
              HasSubstr("worker rank 1 not taken over within 30s (no worker free): worker node "
                        "a, which trains rank 0, takes it over from step 30 beside its own"));
  HeartbeatResponse beat = Beat("a");
  ASSERT_EQ(beat.tasks_size(), 2);
  EXPECT_EQ(beat.tasks(0).rank(), 0);
  EXPECT_FALSE(beat.tasks(0).has_join());
  EXPECT_EQ(beat.tasks(1).rank(), 1);
  EXPECT_EQ(beat.tasks(1).join().step(), 30);
  EXPECT_THAT(FilesOf(beat.tasks(1).data()), ::testing::ElementsAre("part-1", "part-4"));
  EXPECT_EQ(beat.tasks(1).steps(), 100);
  EXPECT_TRUE(beat.tasks(0).evaluates());
  EXPECT_FALSE(beat.tasks(1).evaluates());
  EXPECT_TRUE(Beat("s").tasks(0).absent_ranks().empty());

  // A worker that comes now has nothing to take over.
  Register("d", WORKER);
  EXPECT_EQ(Beat("d").tasks_size(), 0);
  // a reports for both its ranks; b no longer may.
  EXPECT_TRUE(absl::IsPermissionDenied(state_->ReportProgress(Progress("j", "b", 1, 50)).status()));
  for (const auto& [node, rank] : {std::pair<std::string, int>{"c", 2}, {"a", 1}, {"a", 0}}) {
    ReportProgressRequest done = Progress("j", node, rank, 100);
    done.set_finished(true);
    if (rank == 0) {
      done.set_has_test_accuracy(true);
      done.set_test_accuracy(0.8);
    }
    ASSERT_TRUE(state_->ReportProgress(done).ok());
  }
  job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_THAT(job.message(), Not(HasSubstr("without the data")));
}

TEST_F(DataAssignmentTest, AWorkerThatDiesWithTwoRanksLosesBoth) {
  StartJob();
  List("a", 0, 7);
  PassWithout("b", 12);  // b lost; rank 1 goes to a.
  ASSERT_EQ(state_->GetJob("j")->placement().worker_nodes(1), "a");
  // a silent past the node timeout (b stays dead).
  for (int i = 0; i < 3; ++i) {
    Advance(absl::Seconds(3));
    Beat("s");
    Beat("c");
    state_->Tick();
  }
  const JobStatus job = *state_->GetJob("j");
  EXPECT_TRUE(job.workers(0).lost());
  EXPECT_TRUE(job.workers(1).lost());
  EXPECT_FALSE(job.workers(2).lost());
}

TEST_F(DataAssignmentTest, AsyncLiveRanksAlsoTakeOnTheLostRanksRemainingSteps) {
  StartJob(ConsistencySpec::ASYNC);
  List("a", 0, 7);
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "b", 1, 31)).ok());
  PassWithout("b", 12);  // b silent for 36 s: lost, then absorbed.
  const JobStatus job = *state_->GetJob("j");
  ASSERT_TRUE(job.workers(1).absorbed());
  EXPECT_THAT(job.events().rbegin()->message(),
              HasSubstr("its data (2 file parts, 69 steps to go) handed to ranks 2 (1 parts, +35 "
                        "steps), 0 (1 parts, +34 steps)"));
  EXPECT_EQ(Beat("c").tasks(0).steps(), 135);
  EXPECT_EQ(Beat("a").tasks(0).steps(), 134);
}

// A SYNC job started again with no worker free for a rank counts the rank
// at its shards until one of its workers takes it over: a step completed
// before then would leave out the rank's batch, trained by no one.
TEST_F(DataAssignmentTest, ARankStartedAgainWithoutAWorkerCountsAtTheShardsUntilTakenOver) {
  StartJob(ConsistencySpec::SYNC, /*sparse=*/false, /*restarts=*/2);
  List("a", 0, 6);
  PassWithout("b", 2);  // b dead.
  ReportProgressRequest failed = Progress("j", "a", 0, 20);
  failed.set_error("pulling from shard 0: deadline exceeded");
  ASSERT_TRUE(state_->ReportProgress(failed).ok());
  ASSERT_EQ(StateOf("j"), PENDING);
  // Started again short-handed once the hand-over wait is over.
  for (int i = 0; i < 20 && StateOf("j") != RUNNING; ++i) PassWithout("b", 1);
  ASSERT_EQ(StateOf("j"), RUNNING);
  JobStatus job = *state_->GetJob("j");
  // a and c are ranks 0 and 1 now.
  ASSERT_TRUE(job.workers(2).lost());
  EXPECT_THAT(job.events().rbegin()->message(), HasSubstr("no worker was free for rank 2"));
  EXPECT_TRUE(Beat("s").tasks(0).absent_ranks().empty());
  // Taken over at the next tick (as if the hand-over wait had passed) by
  // rank 0's worker, never absent.
  state_->Tick();
  job = *state_->GetJob("j");
  ASSERT_FALSE(job.workers(2).lost());
  EXPECT_EQ(job.placement().worker_nodes(2), job.placement().worker_nodes(0));
  EXPECT_EQ(Beat(job.placement().worker_nodes(0)).tasks_size(), 2);
  EXPECT_TRUE(Beat("s").tasks(0).absent_ranks().empty());
}

TEST_F(DataAssignmentTest, ALostRankZerosDataAndEvaluationGoToTheLowestLiveRank) {
  StartJob(ConsistencySpec::ASYNC);
  List("b", 1, 7);
  PassWithout("a", 15);  // a silent for 45 s, no worker free.
  const JobStatus job = *state_->GetJob("j");
  ASSERT_TRUE(job.workers(0).lost());
  EXPECT_TRUE(job.workers(0).absorbed());
  EXPECT_EQ(job.message(), "");
  // Rank 1 evaluates (and takes the checkpoints) from now on.
  EXPECT_TRUE(Beat("b").tasks(0).evaluates());
  EXPECT_FALSE(Beat("c").tasks(0).evaluates());
  // ASYNC: rank 0's steps went with its data.
  EXPECT_EQ(job.workers(1).steps() + job.workers(2).steps(), 300);
  ReportProgressRequest from_two = Progress("j", "c", 2, job.workers(2).steps());
  from_two.set_finished(true);
  from_two.set_has_test_accuracy(true);
  from_two.set_test_accuracy(0.99);
  EXPECT_EQ(state_->ReportProgress(from_two).status().code(), absl::StatusCode::kPermissionDenied);
  from_two.clear_has_test_accuracy();
  from_two.clear_test_accuracy();
  ASSERT_TRUE(state_->ReportProgress(from_two).ok());
  ReportProgressRequest from_one = Progress("j", "b", 1, job.workers(1).steps());
  from_one.set_finished(true);
  from_one.set_has_test_accuracy(true);
  from_one.set_test_accuracy(0.8);
  ASSERT_TRUE(state_->ReportProgress(from_one).ok());
  EXPECT_EQ(StateOf("j"), SUCCEEDED);
  EXPECT_DOUBLE_EQ(state_->GetJob("j")->test_accuracy(), 0.8);
}

TEST_F(DataAssignmentTest, ASyncRankZeroLostAfterTheOthersFinishedIsEvaluatedOnAnotherWorker) {
  StartJob();
  List("b", 1, 7);
  for (const auto& [node, rank] : {std::pair<std::string, int>{"b", 1}, {"c", 2}}) {
    ReportProgressRequest done = Progress("j", node, rank, 100);
    done.set_finished(true);
    ASSERT_TRUE(state_->ReportProgress(done).ok());
  }
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "a", 0, 100)).ok());
  PassWithout("a", 15);  // a dies before its final evaluation.
  const JobStatus job = *state_->GetJob("j");
  ASSERT_EQ(job.state(), RUNNING);
  // Rank 0 itself goes to b, which runs it from its last step to evaluate.
  const HeartbeatResponse beat = Beat("b");
  ASSERT_EQ(beat.tasks_size(), 2);
  EXPECT_EQ(beat.tasks(0).rank(), 0);
  EXPECT_TRUE(beat.tasks(0).evaluates());
  EXPECT_EQ(beat.tasks(0).join().step(), 100);
  ReportProgressRequest evaluated = Progress("j", "b", 0, 100);
  evaluated.set_finished(true);
  evaluated.set_has_test_accuracy(true);
  evaluated.set_test_accuracy(0.75);
  ASSERT_TRUE(state_->ReportProgress(evaluated).ok());
  EXPECT_EQ(StateOf("j"), SUCCEEDED);
}

TEST_F(DataAssignmentTest, RankZeroLostAfterTheOthersFinishedIsEvaluatedByARankRunAgain) {
  StartJob(ConsistencySpec::ASYNC);
  List("b", 1, 7);
  for (const auto& [node, rank] : {std::pair<std::string, int>{"b", 1}, {"c", 2}}) {
    ReportProgressRequest done = Progress("j", node, rank, 100);
    done.set_finished(true);
    ASSERT_TRUE(state_->ReportProgress(done).ok());
  }
  PassWithout("a", 15);  // a dies before its final evaluation.
  JobStatus job = *state_->GetJob("j");
  ASSERT_EQ(job.state(), RUNNING);
  EXPECT_FALSE(job.workers(1).finished());
  const Task task = Beat("b").tasks(0);
  EXPECT_TRUE(task.evaluates());
  EXPECT_TRUE(task.has_join());
  EXPECT_EQ(task.join().step(), 100);
  // ASYNC: it trains rank 0's steps too.
  ReportProgressRequest evaluated = Progress("j", "b", 1, job.workers(1).steps());
  evaluated.set_finished(true);
  evaluated.set_has_test_accuracy(true);
  evaluated.set_test_accuracy(0.75);
  ASSERT_TRUE(state_->ReportProgress(evaluated).ok());
  job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), SUCCEEDED);
  EXPECT_TRUE(std::any_of(job.events().begin(), job.events().end(), [](const JobEvent& e) {
    return absl::StrContains(e.message(), "worker rank 1 evaluates the job");
  }));
}

}  // namespace
}  // namespace control
}  // namespace downpour
