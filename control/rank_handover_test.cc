#include "control/rank_handover.h"

#include "control/memory_job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

class RankHandoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.set_id("j");
    job_.set_state(RUNNING);
    job_.set_test_accuracy(-1);
    job_.mutable_spec()->set_steps(100);
    job_.mutable_spec()->mutable_dataset()->set_train_files("train-*");
    for (int rank = 0; rank < 3; ++rank) {
      WorkerProgress* worker = job_.add_workers();
      worker->set_rank(rank);
      worker->set_steps(100);
      worker->set_node_id("w" + std::to_string(rank));
      job_.mutable_placement()->add_worker_nodes(worker->node_id());
    }
  }

  RankHandover Handover() {
    return RankHandover({absl::Seconds(30), [this] { return now_; }}, &history_);
  }

  // The job's newest checkpoint, at step 30 (a call counted in asked_).
  absl::StatusOr<CheckpointRestore> Newest() {
    ++asked_;
    CheckpointRestore restore;
    restore.set_step(30);
    return restore;
  }

  int asked_ = 0;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  JobStatus job_;
  MemoryJobStore::Data data_;
  MemoryJobStore store_{&data_};
  JobHistory history_{{}, &store_};
};

TEST_F(RankHandoverTest, ALostRankWaitsThenGoesToAFreeWorker) {
  const RankHandover handover = Handover();
  job_.mutable_workers(1)->set_step(40);
  ASSERT_TRUE(handover.Lose(&job_, 1, "worker node w1 stopped heartbeating"));
  EXPECT_FALSE(handover.Lose(&job_, 1, "again"));
  EXPECT_TRUE(job_.workers(1).lost());
  EXPECT_EQ(job_.placement().worker_nodes(1), "");
  EXPECT_EQ(job_.message(),
            "worker rank 1 lost; waiting for a free worker to take it over (for 30s, then a "
            "worker of the job trains it beside its own rank)");
  EXPECT_EQ(RankHandover::Untrained(job_),
            "without the data of worker rank 1 from step 40 (lost; no worker was free to take "
            "it over)");

  std::deque<std::string> free = {"spare"};
  auto newest = [this] { return Newest(); };
  ASSERT_TRUE(handover.AssignTakers(&job_, &free, newest));
  EXPECT_TRUE(free.empty());
  EXPECT_EQ(asked_, 1);
  EXPECT_TRUE(job_.workers(1).joined());
  EXPECT_EQ(job_.workers(1).node_id(), "spare");
  EXPECT_EQ(job_.placement().worker_nodes(1), "spare");
  EXPECT_EQ(job_.restore().step(), 30);
  EXPECT_EQ(job_.message(), "");
  EXPECT_FALSE(RankHandover::HasUnclaimed(job_));
}

// A rank lost before it reported in the job's new attempt (started again
// from the checkpoint at step 200) goes on from there, and its events say so,
// not "from step 0".
TEST_F(RankHandoverTest, ARankLostBeforeItReportedGoesOnFromTheResumedStep) {
  job_.mutable_spec()->mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  job_.set_resumed_from_step(200);
  const RankHandover handover = Handover();
  ASSERT_TRUE(handover.Lose(&job_, 1, "worker node w1 stopped heartbeating"));
  EXPECT_THAT(job_.events().rbegin()->message(), ::testing::HasSubstr("lost at step 200"));
  EXPECT_EQ(RankHandover::StepOf(job_, job_.workers(1)), 200);
  job_.mutable_workers(2)->set_step(230);  // Reported since.
  EXPECT_EQ(RankHandover::StepOf(job_, job_.workers(2)), 230);
  EXPECT_THAT(RankHandover::Untrained(job_), ::testing::HasSubstr("rank 1 from step 200"));
  std::deque<std::string> free = {"spare"};
  ASSERT_TRUE(handover.AssignTakers(&job_, &free, [this] { return Newest(); }));
  EXPECT_THAT(job_.events().rbegin()->message(),
              ::testing::HasSubstr("taken over by worker node spare from step 200"));
  // Lost again, with no worker free: one of the job's own takes it.
  ASSERT_TRUE(handover.Lose(&job_, 1, "gone"));
  now_ += absl::Seconds(31);
  ASSERT_TRUE(handover.ShareWorkers(
      &job_, [](const std::string&) { return std::nullopt; }, [this] { return Newest(); }));
  EXPECT_THAT(job_.events().rbegin()->message(),
              ::testing::HasSubstr("takes it over from step 200 beside its own"));
}

// A SYNC step that went on without a lost rank would skip its batch: the
// shards wait for the rank, however long that takes, until a free worker
// takes it over or, after the wait, one of the job's own. ASYNC/SSP steps
// are each rank's own.
TEST_F(RankHandoverTest, SyncStepsWaitForALostRankUntilAWorkerOfTheJobTakesItOver) {
  const RankHandover handover = Handover();
  job_.mutable_spec()->mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  job_.add_data_files("part-0");
  job_.mutable_workers(1)->set_step(40);
  ASSERT_TRUE(handover.Lose(&job_, 1, "gone"));
  EXPECT_THAT(job_.events().rbegin()->message(),
              ::testing::HasSubstr("its steps wait until a worker takes it over"));
  EXPECT_FALSE(handover.AbsentAtShards(job_, job_.workers(0)));
  EXPECT_FALSE(handover.AbsentAtShards(job_, job_.workers(1)));
  // Never dealt out.
  now_ += absl::Seconds(31);
  EXPECT_FALSE(handover.Absorb(&job_));
  EXPECT_FALSE(handover.AbsentAtShards(job_, job_.workers(1)));

  auto newest = [this] { return Newest(); };
  // w0 has no room: w2 (rank 2) takes it.
  std::vector<std::string> asked_nodes;
  auto room = [&](const std::string& node) -> std::optional<std::string> {
    asked_nodes.push_back(node);
    if (node == "w0") return "worker w0 may hold 1 GiB";
    return std::nullopt;
  };
  ASSERT_TRUE(handover.ShareWorkers(&job_, room, newest));
  EXPECT_THAT(asked_nodes, ::testing::ElementsAre("w0", "w2"));
  EXPECT_EQ(asked_, 1);
  EXPECT_FALSE(job_.workers(1).lost());
  EXPECT_TRUE(job_.workers(1).joined());
  EXPECT_EQ(job_.workers(1).node_id(), "w2");
  EXPECT_EQ(job_.placement().worker_nodes(1), "w2");
  EXPECT_EQ(job_.restore().step(), 30);
  EXPECT_EQ(job_.message(), "");
  EXPECT_THAT(job_.events().rbegin()->message(),
              ::testing::HasSubstr("worker node w2, which trains rank 2, takes it over from step "
                                   "40 beside its own"));
  EXPECT_FALSE(handover.ShareWorkers(&job_, room, newest));

  // Rank 0 lost too: w2 trains two ranks now, so w0... is lost; nobody but
  // w2 is left, and it has no room: the rank waits, saying why.
  ASSERT_TRUE(handover.Lose(&job_, 0, "gone"));
  now_ += absl::Seconds(31);
  auto no_room = [](const std::string& node) -> std::optional<std::string> {
    return "worker " + node + " may hold 1 GiB";
  };
  ASSERT_TRUE(handover.ShareWorkers(&job_, no_room, newest));
  EXPECT_TRUE(job_.workers(0).lost());
  EXPECT_THAT(job_.message(),
              ::testing::EndsWith("; no worker of the job has room for another rank: worker w2 "
                                  "may hold 1 GiB"));
  EXPECT_FALSE(handover.ShareWorkers(&job_, no_room, newest));  // Nothing new.
  EXPECT_FALSE(handover.AbsentAtShards(job_, job_.workers(0)));

  job_.mutable_spec()->mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  EXPECT_TRUE(handover.AbsentAtShards(job_, job_.workers(0)));
  EXPECT_FALSE(handover.ShareWorkers(&job_, room, newest));
}

TEST_F(RankHandoverTest, AnEvaluatedJobWaitsForNoTaker) {
  const RankHandover handover = Handover();
  handover.Lose(&job_, 2, "gone");
  job_.set_test_accuracy(0.9);
  std::deque<std::string> free = {"spare"};
  EXPECT_FALSE(handover.AssignTakers(&job_, &free, [] { return CheckpointRestore(); }));
  EXPECT_EQ(free.size(), 1u);
}

TEST_F(RankHandoverTest, AnAsyncRanksDataAndStepsAreDealtToTheLiveRanksAfterTheWait) {
  const RankHandover handover = Handover();
  job_.mutable_spec()->mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  ReportProgressRequest listing;
  listing.set_node_id("w0");
  for (int i = 0; i < 6; ++i) listing.add_data_files("part-" + std::to_string(i));
  ASSERT_TRUE(*handover.TakeListing(&job_, listing));
  EXPECT_FALSE(*handover.TakeListing(&job_, listing));  // Shared once.
  EXPECT_EQ(job_.workers(1).data_size(), 2);
  job_.mutable_workers(1)->set_step(40);
  handover.Lose(&job_, 1, "gone");
  EXPECT_FALSE(handover.Absorb(&job_));  // Not yet: a taker may come.
  now_ += absl::Seconds(31);
  for (WorkerProgress& w : *job_.mutable_workers()) w.set_step(w.rank() == 1 ? 40 : 50);
  ASSERT_TRUE(handover.Absorb(&job_));
  EXPECT_TRUE(job_.workers(1).absorbed());
  EXPECT_EQ(job_.workers(1).data_size(), 0);
  // 60 steps to go, dealt 30 + 30 with a file each.
  EXPECT_EQ(job_.workers(0).steps(), 130);
  EXPECT_EQ(job_.workers(2).steps(), 130);
  EXPECT_EQ(job_.workers(0).data_size() + job_.workers(2).data_size(), 6);
  EXPECT_EQ(job_.workers(0).data_step(), 50);
  EXPECT_FALSE(handover.Absorb(&job_));
}

TEST_F(RankHandoverTest, AnAsyncRankZerosDataAndEvaluationGoToTheLowestLiveRank) {
  const RankHandover handover = Handover();
  job_.mutable_spec()->mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  job_.add_data_files("part-0");
  EXPECT_EQ(RankHandover::EvaluatingRank(job_), 0);
  handover.Lose(&job_, 0, "gone");
  EXPECT_EQ(RankHandover::EvaluatingRank(job_), 1);
  now_ += absl::Seconds(31);
  EXPECT_TRUE(handover.Absorb(&job_));
  EXPECT_TRUE(job_.workers(0).absorbed());
  // The lowest rank still training evaluates; once all finished, the lowest
  // live one (it runs again to do it).
  job_.mutable_workers(1)->set_finished(true);
  EXPECT_EQ(RankHandover::EvaluatingRank(job_), 2);
  job_.mutable_workers(2)->set_finished(true);
  EXPECT_EQ(RankHandover::EvaluatingRank(job_), 1);
}

TEST_F(RankHandoverTest, AListingTooLargeToShareIsRefused) {
  const RankHandover handover = Handover();
  ReportProgressRequest listing;
  listing.add_data_files(std::string(kMaxDataShareBytes, 'x'));
  absl::StatusOr<bool> taken = handover.TakeListing(&job_, listing);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("use at least as many files as workers"),
            std::string::npos);
  EXPECT_EQ(job_.data_files_size(), 0);
}

}  // namespace
}  // namespace control
}  // namespace downpour
