#include "coordinator/coordinator_metrics.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

class CoordinatorMetricsTest : public ::testing::Test {
 protected:
  static JobStatus Job(const std::string& id, JobState state, int64_t step) {
    JobStatus job;
    job.set_id(id);
    job.set_state(state);
    job.set_step(step);
    job.set_test_accuracy(-1);
    job.set_submit_time_ms(1000);
    job.set_start_time_ms(2000);
    return job;
  }
  bool Has(const std::string& line) {
    return registry_.Exposition().find(line + "\n") != std::string::npos;
  }
  bool Mentions(const std::string& text) {
    return registry_.Exposition().find(text) != std::string::npos;
  }
  absl::Time At(int64_t seconds) { return absl::FromUnixSeconds(seconds); }

  MetricsRegistry registry_;
  CoordinatorMetrics metrics_{&registry_};
};

TEST_F(CoordinatorMetricsTest, NodesAndJobCountsByStateAndRole) {
  NodeInfo shard, worker, dead;
  shard.set_role(SHARD);
  shard.set_alive(true);
  worker.set_role(WORKER);
  worker.set_alive(true);
  dead.set_role(WORKER);
  metrics_.Update({shard, worker, dead},
                  {Job("a", RUNNING, 3), Job("b", RUNNING, 0), Job("c", FAILED, 0)}, At(10));
  EXPECT_TRUE(Has("downpour_nodes_alive{role=\"shard\"} 1"));
  EXPECT_TRUE(Has("downpour_nodes_alive{role=\"worker\"} 1"));
  EXPECT_TRUE(Has("downpour_jobs{state=\"RUNNING\"} 2"));
  EXPECT_TRUE(Has("downpour_jobs{state=\"FAILED\"} 1"));
  EXPECT_TRUE(Has("downpour_jobs{state=\"PENDING\"} 0"));
}

TEST_F(CoordinatorMetricsTest, AJobsSeriesFollowItsProgress) {
  JobStatus job = Job("j", RUNNING, 0);
  metrics_.Update({}, {job}, At(100));
  EXPECT_TRUE(Has("downpour_job_state{job=\"j\",state=\"RUNNING\"} 1"));
  EXPECT_TRUE(Has("downpour_job_state{job=\"j\",state=\"PENDING\"} 0"));
  EXPECT_TRUE(Has("downpour_job_step{job=\"j\"} 0"));
  // Not started training: its start is its last progress.
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"j\"} 2"));
  // No loss or accuracy reported yet: no series rather than a false value.
  EXPECT_FALSE(Mentions("downpour_job_loss{"));
  EXPECT_FALSE(Mentions("downpour_job_test_accuracy{"));

  job.set_step(40);
  job.set_loss(0.5f);
  job.set_examples_per_sec(1234);
  job.add_evaluations()->set_accuracy(0.25);
  job.add_evaluations()->set_accuracy(0.75);
  metrics_.Update({}, {job}, At(130));
  EXPECT_TRUE(Has("downpour_job_step{job=\"j\"} 40"));
  EXPECT_TRUE(Has("downpour_job_loss{job=\"j\"} 0.5"));
  EXPECT_TRUE(Has("downpour_job_examples_per_second{job=\"j\"} 1234"));
  EXPECT_TRUE(Has("downpour_job_test_accuracy{job=\"j\"} 0.75"));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"j\"} 130"));

  // No step since: the timestamp stays where the step last moved.
  metrics_.Update({}, {job}, At(500));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"j\"} 130"));
}

TEST_F(CoordinatorMetricsTest, ARestartedCoordinatorShowsWhenTheStepLastMoved) {
  // The job's record says when its step moved: a coordinator that restarts
  // long after does not make a stalled job look fresh.
  JobStatus job = Job("stalled", RUNNING, 40);
  job.set_step_time_ms(70000);
  metrics_.Update({}, {job}, At(900));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"stalled\"} 70"));
  job.set_step(41);
  job.set_step_time_ms(905000);
  metrics_.Update({}, {job}, At(910));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"stalled\"} 905"));
}

TEST_F(CoordinatorMetricsTest, AFinishedJobKeepsItsLastValuesUntilItLeavesTheStore) {
  JobStatus job = Job("done", RUNNING, 90);
  job.set_loss(0.25f);
  metrics_.Update({}, {job}, At(100));
  job.set_state(SUCCEEDED);
  job.set_step(100);
  job.set_test_accuracy(0.875);
  job.set_end_time_ms(101000);
  metrics_.Update({}, {job, Job("other", RUNNING, 1)}, At(101));
  for (int i = 0; i < 3; ++i) metrics_.Update({}, {job, Job("other", RUNNING, 1)}, At(900));
  EXPECT_TRUE(Has("downpour_job_state{job=\"done\",state=\"SUCCEEDED\"} 1"));
  EXPECT_TRUE(Has("downpour_job_state{job=\"done\",state=\"RUNNING\"} 0"));
  EXPECT_TRUE(Has("downpour_job_step{job=\"done\"} 100"));
  EXPECT_TRUE(Has("downpour_job_loss{job=\"done\"} 0.25"));
  EXPECT_TRUE(Has("downpour_job_test_accuracy{job=\"done\"} 0.875"));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"done\"} 101"));

  metrics_.Update({}, {Job("other", RUNNING, 1)}, At(1000));
  EXPECT_FALSE(Mentions("job=\"done\"")) << registry_.Exposition();
  EXPECT_TRUE(Has("downpour_job_step{job=\"other\"} 1"));
}

TEST_F(CoordinatorMetricsTest, AucAndLogLossArePresentOnlyWhileKnown) {
  JobStatus job = Job("ctr", RUNNING, 10);
  metrics_.Update({}, {job}, At(100));
  EXPECT_FALSE(Mentions("downpour_job_test_auc{"));
  EXPECT_FALSE(Mentions("downpour_job_test_log_loss{"));

  job.set_test_auc(0.75);
  job.set_test_log_loss(0.4375);
  metrics_.Update({}, {job}, At(110));
  EXPECT_TRUE(Has("downpour_job_test_auc{job=\"ctr\"} 0.75"));
  EXPECT_TRUE(Has("downpour_job_test_log_loss{job=\"ctr\"} 0.4375"));

  // A restart clears them; a test set of one class has no AUC.
  job.clear_test_auc();
  job.clear_test_log_loss();
  metrics_.Update({}, {job}, At(120));
  EXPECT_FALSE(Mentions("downpour_job_test_auc{"));
  EXPECT_FALSE(Mentions("downpour_job_test_log_loss{"));
  job.set_test_auc(std::nan(""));
  job.set_test_log_loss(0.5);
  metrics_.Update({}, {job}, At(130));
  EXPECT_FALSE(Mentions("downpour_job_test_auc{"));
  EXPECT_TRUE(Has("downpour_job_test_log_loss{job=\"ctr\"} 0.5"));
}

TEST_F(CoordinatorMetricsTest, AJobFirstSeenAfterARestartDatesItsProgressAsBestItCan) {
  JobStatus ended = Job("ended", FAILED, 7);
  ended.set_end_time_ms(50000);
  JobStatus running = Job("running", RUNNING, 7);
  JobStatus pending = Job("pending", PENDING, 0);
  pending.set_start_time_ms(0);
  metrics_.Update({}, {ended, running, pending}, At(60));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"ended\"} 50"));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"running\"} 60"));
  EXPECT_TRUE(Has("downpour_job_last_progress_timestamp_seconds{job=\"pending\"} 1"));
}

}  // namespace
}  // namespace downpour
