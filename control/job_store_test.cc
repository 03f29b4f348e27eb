#include "control/job_store.h"

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace downpour {
namespace control {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

TEST(SqliteJobStoreTest, JobsAndNodesSurviveReopen) {
  const std::string dir = TempDir("store_reopen");
  {
    auto store = OpenSqliteJobStore(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    JobStatus job;
    job.set_id("a");
    job.set_state(RUNNING);
    job.set_step(7);
    ASSERT_TRUE((*store)->SaveJob(job).ok());
    job.set_step(9);
    ASSERT_TRUE((*store)->SaveJob(job).ok());
    JobStatus other;
    other.set_id("b");
    ASSERT_TRUE((*store)->SaveJob(other).ok());
    NodeInfo node;
    node.set_id("n1");
    node.set_address("127.0.0.1:5");
    ASSERT_TRUE((*store)->SaveNode(node).ok());
  }
  auto store = OpenSqliteJobStore(dir);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "a");
  EXPECT_EQ((*jobs)[0].step(), 9);
  auto nodes = (*store)->LoadNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].address(), "127.0.0.1:5");
}

TEST(SqliteJobStoreTest, HistoryIsKeptNewestFirstAndGoesWithItsJob) {
  const std::string dir = TempDir("store_history");
  {
    auto store = OpenSqliteJobStore(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    JobHistoryRecords added;
    for (int i = 1; i <= 4; ++i) {
      JobLogLine line;
      line.set_job_id(i == 4 ? "other" : "j");
      line.set_sequence(i);
      line.set_text("line " + std::to_string(i));
      added.lines.push_back(line);
      ProgressPoint point;
      point.set_step(10 * i);
      added.points.push_back({"j", point});
    }
    ASSERT_TRUE((*store)->AppendHistory(added, /*keep_lines=*/2, /*keep_points=*/3).ok());
    JobStatus other;
    other.set_id("other");
    ASSERT_TRUE((*store)->SaveJob(other).ok());
    ASSERT_TRUE((*store)->DeleteJob("other").ok());
  }
  auto store = OpenSqliteJobStore(dir);
  ASSERT_TRUE(store.ok());
  absl::StatusOr<JobHistoryRecords> history = (*store)->LoadHistory();
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->lines.size(), 2u);
  EXPECT_EQ(history->lines[0].text(), "line 2");
  EXPECT_EQ(history->lines[1].text(), "line 3");
  EXPECT_EQ(history->lines[1].job_id(), "j");
  ASSERT_EQ(history->points.size(), 3u);
  EXPECT_EQ(history->points[0].point.step(), 20);
  EXPECT_EQ(history->points[2].point.step(), 40);
}

TEST(SqliteJobStoreTest, UnusableStateDirIsReported) {
  const std::string file = TempDir("not_a_dir");
  std::ofstream(file) << "x";
  auto store = OpenSqliteJobStore(file + "/sub");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find(file), std::string::npos);
}

}  // namespace
}  // namespace control
}  // namespace downpour
