// The fixture of CoordinatorState's tests: an in-memory job store that
// survives "restarts" (control/memory_job_store.h), an injected clock, and helpers to register
// nodes, heartbeat and report progress. Test-only.
#ifndef DOWNPOUR_CONTROL_COORDINATOR_STATE_FIXTURE_H_
#define DOWNPOUR_CONTROL_COORDINATOR_STATE_FIXTURE_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "control/coordinator_state.h"
#include "control/memory_job_store.h"
#include "gtest/gtest.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace control {

// Fails on the first failure (restarts have tests of their own).
inline JobSpec SmallSpec(int workers, int shards) {
  JobSpec spec = SmallMlpJob(workers, shards);
  spec.mutable_restart()->set_max_restarts(-1);
  return spec;
}

class CoordinatorStateTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(); }

  void Restart() { Restart(CoordinatorState::Options()); }

  // Restarts with `options` (node timeout, checkpoints and the clock are the
  // fixture's).
  void Restart(CoordinatorState::Options options) {
    state_.reset();
    options.node_timeout = absl::Seconds(5);
    options.checkpoint_root = checkpoint_root_;
    options.checkpoint_timeout = absl::Minutes(1);
    options.now = [this] { return Now(); };
    auto created = CoordinatorState::Create(options, std::make_unique<MemoryJobStore>(&stored_));
    ASSERT_TRUE(created.ok()) << created.status();
    state_ = std::move(created).value();
  }

  void Register(const std::string& id, NodeRole role, int64_t incarnation = 1,
                bool checkpoints = false) {
    NodeInfo node;
    node.set_id(id);
    node.set_role(role);
    node.set_checkpoints(checkpoints);
    node.set_address(id + ":1");
    node.set_incarnation(incarnation);
    ASSERT_TRUE(state_->RegisterNode(node).ok());
  }

  HeartbeatResponse Beat(const std::string& id, int64_t incarnation = 1) {
    HeartbeatRequest request;
    request.set_node_id(id);
    request.set_incarnation(incarnation);
    auto response = state_->Heartbeat(request);
    EXPECT_TRUE(response.ok());
    return *response;
  }

  ReportProgressRequest Progress(const std::string& job, const std::string& node, int rank,
                                 int64_t step) {
    ReportProgressRequest r;
    r.set_job_id(job);
    r.set_node_id(node);
    r.set_rank(rank);
    r.set_step(step);
    r.set_loss(1.0);
    return r;
  }

  // The injected clock (read by the state's threads and the test's).
  absl::Time Now() {
    absl::MutexLock lock(&clock_mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&clock_mu_);
    now_ += d;
  }
  JobState StateOf(const std::string& job) { return state_->GetJob(job)->state(); }
  const JobStatus* StoredJob(const std::string& id) {
    for (const JobStatus& job : stored_.jobs) {
      if (job.id() == id) return &job;
    }
    return nullptr;
  }

  absl::Mutex clock_mu_;
  absl::Time now_ ABSL_GUARDED_BY(clock_mu_) = absl::FromUnixSeconds(1000000);
  MemoryJobStore::Data stored_;
  std::string checkpoint_root_;
  std::unique_ptr<CoordinatorState> state_;
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_COORDINATOR_STATE_FIXTURE_H_
