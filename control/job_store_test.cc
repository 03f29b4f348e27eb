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
