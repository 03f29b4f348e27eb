#include "rpc/node_agent.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "control/fake_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using control::FakeCoordinator;
using ::testing::HasSubstr;

Task JobTask(const std::string& job) {
  Task task;
  task.set_job_id(job);
  return task;
}

// What the agent handed the node, most recent last.
class TaskLog {
 public:
  void Record(const std::vector<Task>& tasks) {
    absl::MutexLock lock(&mu_);
    last_.clear();
    for (const Task& task : tasks) last_.push_back(task.job_id());
    ++calls_;
  }
  std::vector<std::string> last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> last_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

NodeAgent::Options AgentOptions() {
  NodeAgent::Options options;
  options.coordinator_name = "fake:1";
  options.self.set_id("worker@a:1");
  options.self.set_role(WORKER);
  options.self.set_address("a:1");
  options.startup_timeout = absl::Seconds(2);
  return options;
}

TEST(NodeAgentTest, RegistersThenHandsOverTheTasksOfEveryHeartbeat) {
  FakeCoordinator coordinator;
  coordinator.SetTasks("worker@a:1", {JobTask("j1"), JobTask("j2")});
  TaskLog tasks;
  auto agent = NodeAgent::Start(AgentOptions(), &coordinator,
                                [&](const std::vector<Task>& t) { tasks.Record(t); });
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ(coordinator.registrations(), 1);
  const NodeInfo self = coordinator.last_registered();
  EXPECT_EQ(self.id(), "worker@a:1");
  EXPECT_GT(self.incarnation(), 0);
  EXPECT_FALSE(self.hostname().empty());
  ASSERT_TRUE(coordinator.AwaitHeartbeats(3));
  EXPECT_THAT(tasks.last(), ::testing::ElementsAre("j1", "j2"));
  coordinator.SetTasks("worker@a:1", {});
  ASSERT_TRUE(coordinator.AwaitHeartbeats(3));
  EXPECT_TRUE(tasks.last().empty());
}

TEST(NodeAgentTest, StartFailsNamingTheCoordinatorWhenItNeverAnswers) {
  FakeCoordinator coordinator;
  coordinator.SetUp(false);
  auto agent = NodeAgent::Start(AgentOptions(), &coordinator, [](const std::vector<Task>&) {});
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(agent.status().message(), HasSubstr("cannot register with coordinator at fake:1"));
  EXPECT_THAT(agent.status().message(), HasSubstr("coordinator down"));
}

TEST(NodeAgentTest, OutageKeepsTheTasksAndReregistersWhenAsked) {
  FakeCoordinator coordinator;
  coordinator.SetTasks("worker@a:1", {JobTask("j")});
  TaskLog tasks;
  auto agent = NodeAgent::Start(AgentOptions(), &coordinator,
                                [&](const std::vector<Task>& t) { tasks.Record(t); });
  ASSERT_TRUE(agent.ok()) << agent.status();
  ASSERT_TRUE(coordinator.AwaitHeartbeats(2));
  const int handed = tasks.calls();
  coordinator.SetUp(false);
  ASSERT_TRUE(coordinator.AwaitHeartbeats(3));
  // No answer: nothing handed over, so the node keeps running its job.
  EXPECT_LE(tasks.calls(), handed + 1);
  EXPECT_THAT(tasks.last(), ::testing::ElementsAre("j"));
  // Back, having lost the node (as a restarted coordinator would), and with
  // another task for it: the agent registers again and hands that over.
  coordinator.SetTasks("worker@a:1", {JobTask("j2")});
  coordinator.ForgetNodes();
  coordinator.SetUp(true);
  ASSERT_TRUE(coordinator.AwaitHeartbeats(4));
  EXPECT_EQ(coordinator.registrations(), 2);
  EXPECT_THAT(tasks.last(), ::testing::ElementsAre("j2"));
}

TEST(NodeAgentTest, ReportsReachTheCoordinator) {
  FakeCoordinator coordinator;
  auto agent = NodeAgent::Start(AgentOptions(), &coordinator, [](const std::vector<Task>&) {});
  ASSERT_TRUE(agent.ok());
  ReportProgressRequest report;
  report.set_job_id("j");
  report.set_step(7);
  ASSERT_TRUE((*agent)->ReportProgress(report).ok());
  ASSERT_EQ(coordinator.reports().size(), 1u);
  EXPECT_EQ(coordinator.reports()[0].step(), 7);
}

}  // namespace
}  // namespace downpour
