// The coordinator's operator tools: describe, delete, cordon, job logs and
// retention (control/coordinator_operations.cc).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "control/coordinator_state_fixture.h"
#include "control/tensorboard_events.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;

bool Stored(const std::vector<JobStatus>& jobs, const std::string& id) {
  return std::any_of(jobs.begin(), jobs.end(), [&](const JobStatus& j) { return j.id() == id; });
}

class CoordinatorOperationsTest : public CoordinatorStateTest {
 protected:
  // Runs job `id` (1 worker, 1 shard) to success.
  void RunToEnd(const std::string& id) {
    ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), id).ok());
    const JobStatus job = *state_->GetJob(id);
    ASSERT_EQ(job.state(), RUNNING);
    ReportProgressRequest done =
        Progress(id, job.placement().worker_nodes(0), 0, job.spec().steps());
    done.set_finished(true);
    done.set_has_test_accuracy(true);
    done.set_test_accuracy(0.5);
    ASSERT_TRUE(state_->ReportProgress(done).ok());
    ASSERT_EQ(StateOf(id), SUCCEEDED);
  }
};

TEST_F(CoordinatorOperationsTest, DeleteRefusesARunningJobAndRemovesAnEndedOneDurably) {
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "running").ok());
  absl::Status refused = state_->DeleteJob("running", false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("stop it first"));
  ASSERT_TRUE(state_->StopJob("running").ok());
  ASSERT_TRUE(state_->DeleteJob("running", false).ok());
  EXPECT_EQ(state_->GetJob("running").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Stored(stored_.jobs, "running"));
  EXPECT_EQ(state_->DeleteJob("running", false).code(), absl::StatusCode::kNotFound);
  Restart();
  EXPECT_TRUE(state_->ListJobs()->empty());
}

TEST_F(CoordinatorOperationsTest, DeleteWithCheckpointsRemovesTheJobsFolderAndOnlyIt) {
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "ended").ok());
  ASSERT_TRUE(state_->StopJob("ended").ok());
  // Without a checkpoint root there is nothing to remove: said, and kept.
  absl::Status refused = state_->DeleteJob("ended", true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("no --checkpoint_root"));
  EXPECT_TRUE(state_->GetJob("ended").ok());

  const char* tmp = std::getenv("TEST_TMPDIR");
  checkpoint_root_ = absl::StrCat(tmp ? tmp : "/tmp", "/delete-checkpoints");
  ASSERT_TRUE(MakeDirs(checkpoint_root_ + "/ended/step-100").ok());
  ASSERT_TRUE(MakeDirs(checkpoint_root_ + "/other/step-100").ok());
  Restart();
  ASSERT_TRUE(state_->DeleteJob("ended", true).ok());
  EXPECT_EQ(state_->GetJob("ended").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::IsNotFound(ListDir(checkpoint_root_ + "/ended").status()));
  EXPECT_TRUE(ListDir(checkpoint_root_ + "/other/step-100").ok());
}

TEST_F(CoordinatorOperationsTest, JobLogsHoldTheNodesLinesAndTheCoordinatorsEvents) {
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  HeartbeatRequest beat;
  beat.set_node_id("w");
  beat.set_incarnation(1);
  JobLogLine* line = beat.add_logs();
  line->set_job_id("j");
  line->set_text("starting as worker rank 0");
  JobLogLine* other = beat.add_logs();
  other->set_job_id("no-such-job");
  other->set_text("dropped");
  ASSERT_TRUE(state_->Heartbeat(beat).ok());

  JobLogsRequest request;
  request.set_job_id("j");
  JobLogsResponse logs = *state_->JobLogs(request);
  ASSERT_GE(logs.lines_size(), 2);
  EXPECT_EQ(logs.lines(0).source(), "coordinator");
  EXPECT_THAT(logs.lines(0).text(), HasSubstr("started"));
  EXPECT_EQ(logs.lines().rbegin()->source(), "w");
  EXPECT_EQ(logs.lines().rbegin()->text(), "starting as worker rank 0");
  EXPECT_FALSE(logs.job_ended());

  // After the last line: nothing new yet (no wait), then the job's end.
  request.set_after_sequence(logs.lines().rbegin()->sequence());
  request.set_timeout_ms(0);
  EXPECT_EQ(state_->JobLogs(request)->lines_size(), 0);
  ASSERT_TRUE(state_->StopJob("j").ok());
  JobLogsResponse ended = *state_->JobLogs(request);
  EXPECT_TRUE(ended.job_ended());
  ASSERT_EQ(ended.lines_size(), 1);
  EXPECT_THAT(ended.lines(0).text(), HasSubstr("STOPPED"));
}

TEST_F(CoordinatorOperationsTest, ALogKeepsItsNewestLines) {
  CoordinatorState::Options options;
  options.job_log_lines = 3;
  Restart(options);
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  HeartbeatRequest beat;
  beat.set_node_id("w");
  beat.set_incarnation(1);
  for (int i = 0; i < 5; ++i) {
    JobLogLine* line = beat.add_logs();
    line->set_job_id("j");
    line->set_text(absl::StrCat("line ", i));
  }
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  JobLogsRequest request;
  request.set_job_id("j");
  JobLogsResponse logs = *state_->JobLogs(request);
  ASSERT_EQ(logs.lines_size(), 3);
  EXPECT_TRUE(logs.truncated());
  EXPECT_EQ(logs.lines(2).text(), "line 4");
}

TEST_F(CoordinatorOperationsTest, DescribeHasTheProgressHistoryAndTheStepNeverGoesBack) {
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "w", 0, 5)).ok());
  Advance(absl::Seconds(2));
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "w", 0, 8)).ok());
  Advance(absl::Seconds(2));
  // A report of an earlier step (a rank taken over) does not move it back.
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "w", 0, 6)).ok());
  JobDescription description = *state_->DescribeJob("j");
  EXPECT_EQ(description.job().step(), 8);
  ASSERT_EQ(description.progress_size(), 2);
  EXPECT_EQ(description.progress(0).step(), 5);
  EXPECT_EQ(description.progress(1).step(), 8);
  EXPECT_EQ(state_->DescribeJob("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorOperationsTest, LogsProgressAndTheStepsTimeSurviveARestart) {
  Register("s", SHARD);
  Register("w", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  HeartbeatRequest beat;
  beat.set_node_id("w");
  beat.set_incarnation(1);
  JobLogLine* line = beat.add_logs();
  line->set_job_id("j");
  line->set_text("epoch 1");
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "w", 0, 5)).ok());
  const int64_t moved_ms = absl::ToUnixMillis(Now());
  Advance(absl::Seconds(3));
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "w", 0, 5)).ok());  // No move.
  EXPECT_EQ(state_->GetJob("j")->step_time_ms(), moved_ms);
  state_->Tick();  // Writes the history.
  Restart();

  JobLogsRequest request;
  request.set_job_id("j");
  JobLogsResponse logs = *state_->JobLogs(request);
  std::vector<std::string> texts;
  for (const JobLogLine& l : logs.lines()) texts.push_back(l.text());
  EXPECT_THAT(texts, ::testing::Contains("epoch 1"));
  EXPECT_THAT(texts, ::testing::Contains(::testing::HasSubstr("started on 1 workers")));
  JobDescription description = *state_->DescribeJob("j");
  ASSERT_EQ(description.progress_size(), 1);
  EXPECT_EQ(description.progress(0).step(), 5);
  EXPECT_EQ(description.job().step_time_ms(), moved_ms);
  // New lines follow on from the old ones' sequence.
  beat.mutable_logs(0)->set_text("epoch 2");
  Register("w", WORKER);
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  JobLogsResponse after = *state_->JobLogs(request);
  EXPECT_EQ(after.lines(after.lines_size() - 1).text(), "epoch 2");
  EXPECT_EQ(after.lines(after.lines_size() - 1).sequence(), logs.lines_size() + 1);
}

TEST_F(CoordinatorOperationsTest, ACordonedWorkerHandsItsRankToAFreeWorkerAndGetsNoNewWork) {
  Register("s", SHARD);
  Register("a", WORKER);
  JobSpec spec = SmallSpec(1, 1);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  ASSERT_EQ(state_->GetJob("j")->placement().worker_nodes(0), "a");
  ASSERT_TRUE(state_->ReportProgress(Progress("j", "a", 0, 4)).ok());
  Register("b", WORKER);

  absl::StatusOr<NodeInfo> drained = state_->CordonNode("a", true);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->cordoned());
  const JobStatus moved = *state_->GetJob("j");
  EXPECT_EQ(moved.state(), RUNNING);
  EXPECT_EQ(moved.placement().worker_nodes(0), "b");
  EXPECT_EQ(Beat("a").tasks_size(), 0);
  ASSERT_EQ(Beat("b").tasks_size(), 1);

  // No new work while cordoned, even after the node restarts; uncordon
  // gives it work again.
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "next").ok());
  Register("a", WORKER, /*incarnation=*/2);
  EXPECT_EQ(StateOf("next"), PENDING);
  EXPECT_TRUE(state_->CordonNode("a", true)->cordoned());
  Restart();
  // One listing: begin() and end() of two temporaries would be two vectors.
  const std::vector<NodeInfo> nodes = *state_->ListNodes();
  EXPECT_TRUE(std::any_of(nodes.begin(), nodes.end(),
                          [](const NodeInfo& n) { return n.id() == "a" && n.cordoned(); }));
  Register("s", SHARD);
  Register("a", WORKER, 2);
  EXPECT_EQ(StateOf("next"), PENDING);
  EXPECT_FALSE(state_->CordonNode("a", false)->cordoned());
  EXPECT_EQ(StateOf("next"), RUNNING);
  EXPECT_EQ(state_->CordonNode("ghost", true).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorOperationsTest, RetentionRemovesEndedJobsBeyondTheCountAndAge) {
  CoordinatorState::Options options;
  options.job_retention_count = 2;
  options.job_retention_age = absl::Hours(1);
  Restart(options);
  Register("s", SHARD);
  Register("w", WORKER);
  for (const char* id : {"a", "b", "c"}) {
    RunToEnd(id);
    Advance(absl::Seconds(3));
    Beat("s");
    Beat("w");
  }
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "running").ok());
  state_->Tick();
  // The oldest ended job is past the count.
  EXPECT_EQ(state_->GetJob("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Stored(stored_.jobs, "a"));
  EXPECT_TRUE(state_->GetJob("b").ok());
  EXPECT_TRUE(state_->GetJob("c").ok());
  // Past the age, every ended job goes; a running one stays, however old.
  for (int i = 0; i < 40; ++i) {
    Advance(absl::Minutes(3));
    Beat("s");
    Beat("w");
  }
  state_->Tick();
  EXPECT_FALSE(state_->GetJob("b").ok());
  EXPECT_FALSE(state_->GetJob("c").ok());
  EXPECT_EQ(StateOf("running"), RUNNING);
  EXPECT_EQ(stored_.jobs.size(), 1u);
}

TEST_F(CoordinatorOperationsTest, ADeadNodeShowsWhenItWasLastHeardAndLeavesAfterTheGrace) {
  CoordinatorState::Options options;
  options.dead_node_retention = absl::Hours(1);
  Restart(options);
  Register("s", SHARD);
  Register("w", WORKER);
  const int64_t heard = absl::ToUnixMillis(Now());
  Advance(absl::Seconds(10));
  Beat("s");
  state_->Tick();
  std::vector<NodeInfo> nodes = *state_->ListNodes();
  auto w =
      std::find_if(nodes.begin(), nodes.end(), [](const NodeInfo& n) { return n.id() == "w"; });
  ASSERT_NE(w, nodes.end());
  EXPECT_FALSE(w->alive());
  EXPECT_EQ(w->last_heartbeat_ms(), heard);
  // A restarted coordinator still knows when the dead node was last heard.
  Restart(options);
  nodes = *state_->ListNodes();
  w = std::find_if(nodes.begin(), nodes.end(), [](const NodeInfo& n) { return n.id() == "w"; });
  ASSERT_NE(w, nodes.end());
  EXPECT_EQ(w->last_heartbeat_ms(), heard);

  Advance(absl::Hours(2));
  Beat("s");
  state_->Tick();
  nodes = *state_->ListNodes();
  EXPECT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].id(), "s");
  EXPECT_EQ(stored_.nodes.size(), 1u);
}

TEST_F(CoordinatorOperationsTest, EachJobsScalarsGoToTensorBoardAcrossARestart) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tensorboard_scalars");
  ASSERT_TRUE(RemoveAll(dir).ok());
  CoordinatorState::Options options;
  options.tensorboard_dir = dir;
  Restart(options);
  Register("s", SHARD);
  Register("w", WORKER);
  JobSpec spec = SmallSpec(1, 1);
  spec.set_steps(30);
  ASSERT_TRUE(state_->SubmitJob(spec, "j").ok());
  auto report = [&](int64_t step, double loss) {
    ReportProgressRequest r = Progress("j", "w", 0, step);
    r.set_loss(loss);
    r.set_examples_per_sec(100 * step);
    return r;
  };
  ASSERT_TRUE(state_->ReportProgress(report(5, 2.0)).ok());
  ReportProgressRequest evaluated = report(10, 1.5);
  evaluated.mutable_evaluation()->set_step(10);
  evaluated.mutable_evaluation()->set_accuracy(0.6);
  evaluated.mutable_evaluation()->set_auc(0.65);
  evaluated.mutable_evaluation()->set_log_loss(0.625);
  ASSERT_TRUE(state_->ReportProgress(evaluated).ok());
  // An earlier step (a rank taken over) adds no point: steps only rise.
  ASSERT_TRUE(state_->ReportProgress(report(7, 9.0)).ok());
  Advance(absl::Seconds(2));
  Restart(options);
  ASSERT_TRUE(state_->ReportProgress(report(20, 1.0)).ok());
  ReportProgressRequest done = report(30, 0.5);
  done.set_finished(true);
  done.set_has_test_accuracy(true);
  done.set_test_accuracy(0.8);
  done.set_test_auc(0.75);
  done.set_test_log_loss(0.5);
  ASSERT_TRUE(state_->ReportProgress(done).ok());
  ASSERT_EQ(StateOf("j"), SUCCEEDED);

  absl::StatusOr<std::vector<std::string>> files = ListDir(dir + "/j");
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);  // One per run of the coordinator.
  std::sort(files->begin(), files->end());
  std::map<std::string, std::vector<std::pair<int64_t, float>>> series;
  for (const std::string& name : *files) {
    EXPECT_THAT(name, ::testing::StartsWith("events.out.tfevents."));
    for (const Point& p : Scalars(ReadEvents(absl::StrCat(dir, "/j/", name)))) {
      series[p.tag].emplace_back(p.step, p.value);
    }
  }
  using Series = std::vector<std::pair<int64_t, float>>;
  EXPECT_EQ(series["loss"], (Series{{5, 2.0f}, {10, 1.5f}, {20, 1.0f}, {30, 0.5f}}));
  // The rate of a job whose workers have all finished is no point.
  EXPECT_EQ(series["examples_per_second"], (Series{{5, 500.0f}, {10, 1000.0f}, {20, 2000.0f}}));
  EXPECT_EQ(series["test_accuracy"], (Series{{10, 0.6f}, {30, 0.8f}}));
  EXPECT_EQ(series["test_auc"], (Series{{10, 0.65f}, {30, 0.75f}}));
  EXPECT_EQ(series["test_log_loss"], (Series{{10, 0.625f}, {30, 0.5f}}));
}

}  // namespace
}  // namespace control
}  // namespace downpour
