#include "rpc/node_agent.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// An in-process coordinator that answers as told and records what it was
// asked (no sockets: the agent talks to a control::Coordinator).
class FakeCoordinator : public control::Coordinator {
 public:
  absl::StatusOr<RegisterNodeResponse> RegisterNode(const NodeInfo& node) override {
    absl::MutexLock lock(&mu_);
    if (!up_) return absl::UnavailableError("coordinator down");
    registered_.push_back(node);
    registered_incarnation_ = node.incarnation();
    RegisterNodeResponse response;
    response.set_heartbeat_interval_ms(10);
    return response;
  }
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    if (!up_) return absl::UnavailableError("coordinator down");
    HeartbeatResponse response;
    if (forget_node_ || request.incarnation() != registered_incarnation_) {
      forget_node_ = false;
      response.set_reregister(true);
      return response;
    }
    for (const std::string& job : jobs_) response.add_tasks()->set_job_id(job);
    return response;
  }
  absl::StatusOr<ReportProgressResponse> ReportProgress(
      const ReportProgressRequest& request) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(request);
    return ReportProgressResponse();
  }
  absl::StatusOr<std::vector<NodeInfo>> ListNodes() override { return Unused(); }
  absl::StatusOr<JobStatus> SubmitJob(const JobSpec&, const std::string&) override {
    return Unused();
  }
  absl::StatusOr<std::vector<JobStatus>> ListJobs() override { return Unused(); }
  absl::StatusOr<JobStatus> GetJob(const std::string&) override { return Unused(); }
  absl::StatusOr<JobStatus> WatchJob(const std::string&, int64_t, absl::Duration) override {
    return Unused();
  }
  absl::StatusOr<JobStatus> StopJob(const std::string&) override { return Unused(); }

  void set_up(bool up) {
    absl::MutexLock lock(&mu_);
    up_ = up;
  }
  void set_jobs(std::vector<std::string> jobs) {
    absl::MutexLock lock(&mu_);
    jobs_ = std::move(jobs);
  }
  void ForgetNode() {
    absl::MutexLock lock(&mu_);
    forget_node_ = true;
  }
  int registrations() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(registered_.size());
  }
  NodeInfo last_registered() {
    absl::MutexLock lock(&mu_);
    return registered_.back();
  }
  // Waits (boundedly) until `n` more heartbeats arrived.
  bool AwaitHeartbeats(int n) {
    absl::MutexLock lock(&mu_);
    awaited_ = heartbeats_ + n;
    return mu_.AwaitWithTimeout(absl::Condition(this, &FakeCoordinator::Reached),
                                absl::Seconds(20));
  }
  std::vector<ReportProgressRequest> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  static absl::Status Unused() { return absl::UnimplementedError("not used by the agent"); }
  bool Reached() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_ >= awaited_; }

  absl::Mutex mu_;
  bool up_ ABSL_GUARDED_BY(mu_) = true;
  bool forget_node_ ABSL_GUARDED_BY(mu_) = false;
  int64_t registered_incarnation_ ABSL_GUARDED_BY(mu_) = -1;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<NodeInfo> registered_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportProgressRequest> reports_ ABSL_GUARDED_BY(mu_);
  int awaited_ ABSL_GUARDED_BY(mu_) = 0;
};

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
  coordinator.set_jobs({"j1", "j2"});
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
  coordinator.set_jobs({});
  ASSERT_TRUE(coordinator.AwaitHeartbeats(3));
  EXPECT_TRUE(tasks.last().empty());
}

TEST(NodeAgentTest, StartFailsNamingTheCoordinatorWhenItNeverAnswers) {
  FakeCoordinator coordinator;
  coordinator.set_up(false);
  auto agent = NodeAgent::Start(AgentOptions(), &coordinator, [](const std::vector<Task>&) {});
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(agent.status().message(), HasSubstr("cannot register with coordinator at fake:1"));
  EXPECT_THAT(agent.status().message(), HasSubstr("coordinator down"));
}

TEST(NodeAgentTest, OutageKeepsTheTasksAndReregistersWhenAsked) {
  FakeCoordinator coordinator;
  coordinator.set_jobs({"j"});
  TaskLog tasks;
  auto agent = NodeAgent::Start(AgentOptions(), &coordinator,
                                [&](const std::vector<Task>& t) { tasks.Record(t); });
  ASSERT_TRUE(agent.ok()) << agent.status();
  ASSERT_TRUE(coordinator.AwaitHeartbeats(2));
  const int handed = tasks.calls();
  coordinator.set_up(false);
  ASSERT_TRUE(coordinator.AwaitHeartbeats(3));
  // No answer: nothing handed over, so the node keeps running its job.
  EXPECT_LE(tasks.calls(), handed + 1);
  EXPECT_THAT(tasks.last(), ::testing::ElementsAre("j"));
  coordinator.set_up(true);
  coordinator.ForgetNode();  // As a restarted coordinator that lost it would.
  ASSERT_TRUE(coordinator.AwaitHeartbeats(3));
  EXPECT_EQ(coordinator.registrations(), 2);
  EXPECT_THAT(tasks.last(), ::testing::ElementsAre("j"));
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
