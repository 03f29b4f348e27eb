#include "rpc/remote_coordinator.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "control/coordinator_state.h"
#include "control/job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/coordinator_service.h"
#include "rpc/daemon.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// A loopback port nobody listens on: bound, then closed.
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(ConnectTest, UnusedLoopbackPortFailsNamingTheAddress) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedPort());
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client =
      RemoteCoordinator::Connect(address, absl::Seconds(2));
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("cannot reach coordinator at " + address));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("within 2s"));
}

TEST(ConnectTest, EmptyAddressIsInvalid) {
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = RemoteCoordinator::Connect("");
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
}

JobSpec SmallSpec() { return SmallMlpJob(1, 1); }

// The remote client against the real service over loopback, in front of
// the in-process coordinator: what a caller sees must not depend on which
// of the two it holds.
class RemoteCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("TEST_TMPDIR");
    auto store = control::OpenSqliteJobStore(
        absl::StrCat(dir != nullptr ? dir : "/tmp", "/remote_coordinator_test_",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ASSERT_TRUE(store.ok()) << store.status();
    auto state = control::CoordinatorState::Create({}, std::move(store).value());
    ASSERT_TRUE(state.ok()) << state.status();
    state_ = std::move(state).value();
    service_ = std::make_unique<CoordinatorService>(state_.get(), &metrics_);
    auto server = StartGrpcServer("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    auto remote = RemoteCoordinator::Connect(server_.address);
    ASSERT_TRUE(remote.ok()) << remote.status();
    remote_ = std::move(remote).value();
  }
  void TearDown() override {
    if (server_.server) server_.server->Shutdown(std::chrono::system_clock::now());
  }

  MetricsRegistry metrics_;
  std::unique_ptr<control::CoordinatorState> state_;
  std::unique_ptr<CoordinatorService> service_;
  RunningServer server_;
  std::unique_ptr<RemoteCoordinator> remote_;
};

TEST_F(RemoteCoordinatorTest, JobLifecycleAsTheLocalCoordinatorSeesIt) {
  NodeInfo shard;
  shard.set_id("s");
  shard.set_role(SHARD);
  shard.set_address("s:1");
  ASSERT_TRUE(remote_->RegisterNode(shard).ok());
  NodeInfo worker = shard;
  worker.set_id("w");
  worker.set_role(WORKER);
  worker.set_address("w:1");
  ASSERT_TRUE(remote_->RegisterNode(worker).ok());

  absl::StatusOr<JobStatus> submitted = remote_->SubmitJob(SmallSpec(), "j");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->state(), RUNNING);
  EXPECT_EQ(remote_->GetJob("j")->SerializeAsString(), state_->GetJob("j")->SerializeAsString());
  // The list leaves the partition lists out; GetJob has them.
  absl::StatusOr<std::vector<JobStatus>> jobs = remote_->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].placement().partitions_size(), 0);
  EXPECT_GT(remote_->GetJob("j")->placement().partitions_size(), 0);

  HeartbeatRequest beat;
  beat.set_node_id("w");
  absl::StatusOr<HeartbeatResponse> tasks = remote_->Heartbeat(beat);
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->tasks_size(), 1);
  EXPECT_EQ(tasks->tasks(0).job_id(), "j");

  const int64_t version = submitted->version();
  std::thread stopper([this] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(state_->StopJob("j").ok());
  });
  absl::StatusOr<JobStatus> watched = remote_->WatchJob("j", version, absl::Seconds(30));
  stopper.join();
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->state(), STOPPED);
}

TEST_F(RemoteCoordinatorTest, ErrorsKeepTheirCodeAndMessage) {
  JobSpec bad = SmallSpec();
  bad.set_num_workers(0);
  absl::StatusOr<JobStatus> rejected = remote_->SubmitJob(bad, "");
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("num_workers"));
  EXPECT_EQ(remote_->GetJob("nope").status().code(), absl::StatusCode::kNotFound);
  ReportProgressRequest report;
  report.set_job_id("nope");
  EXPECT_EQ(remote_->ReportProgress(report).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteCoordinatorTest, UnreachableCoordinatorNamesItsAddressAndTheCall) {
  const std::string address = server_.address;
  server_.server->Shutdown(std::chrono::system_clock::now());
  server_.server.reset();
  remote_->set_rpc_timeout(absl::Seconds(2));
  absl::StatusOr<JobStatus> job = remote_->GetJob("j");
  ASSERT_FALSE(job.ok());
  EXPECT_TRUE(absl::IsUnavailable(job.status()) || absl::IsDeadlineExceeded(job.status()))
      << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("coordinator at " + address));
  EXPECT_THAT(job.status().message(), HasSubstr("GetJob"));
}

}  // namespace
}  // namespace downpour
