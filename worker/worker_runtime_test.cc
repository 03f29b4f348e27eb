#include "worker/worker_runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "control/fake_coordinator.h"
#include "data/example.h"
#include "data/record_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kNode[] = "worker@test";
constexpr int kPixels = 16;

// Requests a shard was sent: pushes that carried gradients, and pulls.
struct Traffic {
  std::atomic<int> gradient_pushes{0};
  std::atomic<int> pulls{0};
  std::atomic<int> cancels{0};  // CancelCalls of the shard clients.
};

// A ParameterShard that forwards to an in-process store (the daemon's
// connector returns a RemoteParameterShard instead), counting its traffic.
class InProcessShard final : public ParameterShard {
 public:
  InProcessShard(ParameterShard* store, Traffic* traffic) : store_(store), traffic_(traffic) {}
  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    if (payload.size() > 0) ++traffic_->gradient_pushes;
    return store_->Push(request, payload);
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    ++traffic_->pulls;
    return store_->Pull(request, deadline, payload);
  }
  void CancelCalls() override { ++traffic_->cancels; }

 private:
  ParameterShard* const store_;
  Traffic* const traffic_;
};

// Dark images are class 0, bright ones class 1.
void WriteDataset(const std::string& path, int examples) {
  auto writer = data::RecordWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < examples; ++i) {
    const int label = i % 2;
    std::vector<uint8_t> pixels(kPixels, static_cast<uint8_t>(label ? 200 + i % 50 : i % 50));
    ASSERT_TRUE(
        (*writer)->Write(data::EncodeImageExample(pixels.data(), kPixels, label, {kPixels})).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
}

JobSpec Spec(int64_t steps) {
  JobSpec spec;
  spec.set_name("t");
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(kPixels);
  model->set_num_classes(2);
  model->add_layer()->mutable_dense()->set_units(2);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_dataset()->set_train_files("train-*");
  spec.mutable_dataset()->set_test_files("test-*");
  spec.mutable_dataset()->set_batch_size(8);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  spec.set_num_workers(1);
  spec.set_num_shards(1);
  spec.set_steps(steps);
  spec.set_log_every_steps(1);
  ApplyJobDefaults(&spec);
  return spec;
}

// The runtime driven as in the daemon — tasks from a node agent's
// heartbeats, reports through it — with an in-process coordinator and the
// job's shard an in-process store.
class WorkerRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    data_dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/worker_runtime_test");
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", data_dir_).c_str()), 0);
    WriteDataset(data_dir_ + "/train-00000-of-00001", 64);
    WriteDataset(data_dir_ + "/test-00000-of-00001", 32);

    TrainerOptions options;
    options.data_dir = data_dir_;
    options.metrics = &metrics_;
    options.exchange.pull_timeout = absl::Seconds(30);
    options.exchange.pull_slice = absl::Milliseconds(200);
    runtime_ = std::make_unique<WorkerRuntime>(
        options,
        [this](const std::string& address) {
          return std::make_unique<InProcessShard>(&stores_[address], &traffic_);
        },
        /*failed_run_grace=*/absl::Milliseconds(300), MetricsGrace(),
        /*release_memory=*/
        [this](const std::function<void()>& free_memory) {
          free_memory();
          ++releases_;
        });
    NodeAgent::Options agent;
    agent.coordinator_name = "fake";
    agent.self.set_id(kNode);
    agent.self.set_role(WORKER);
    agent.self.set_address("127.0.0.1:1");
    auto started = NodeAgent::Start(
        agent, &coordinator_, [this](const std::vector<Task>& tasks) { runtime_->OnTasks(tasks); });
    ASSERT_TRUE(started.ok()) << started.status();
    agent_ = std::move(started).value();
    runtime_->set_agent(agent_.get());
  }
  void TearDown() override {
    runtime_->StopAll();
    agent_.reset();
    SetLogObserver(nullptr);
  }

  // Keeps every line logged from now on (until TearDown), for LogLines and
  // AwaitLogLine.
  void CaptureLog() {
    SetLogObserver([this](absl::Time, absl::string_view line) {
      absl::MutexLock lock(&log_mu_);
      log_.emplace_back(line);
    });
  }
  std::vector<std::string> LogLines() {
    absl::MutexLock lock(&log_mu_);
    return log_;
  }
  // Waits up to 60 s for a captured line that ends with `text`.
  bool AwaitLogLine(const std::string& text) {
    absl::MutexLock lock(&log_mu_);
    const auto logged = [this, &text]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_) {
      return std::any_of(log_.begin(), log_.end(),
                         [&](const std::string& line) { return absl::EndsWith(line, text); });
    };
    return log_mu_.AwaitWithTimeout(absl::Condition(&logged), absl::Seconds(60));
  }

  // A task running `spec` as rank 0 against the store at "shard0", which
  // hosts the job.
  Task HostedTask(const std::string& job_id, const JobSpec& spec) {
    Task task;
    task.set_job_id(job_id);
    *task.mutable_spec() = spec;
    task.set_rank(0);
    task.set_evaluates(true);
    auto params = ValidateJobSpec(spec);
    EXPECT_TRUE(params.ok()) << params.status();
    auto placed = PlacePartitions(*params, 1, spec.partition_bytes());
    EXPECT_TRUE(placed.ok());
    Placement* placement = task.mutable_placement();
    placement->add_shard_nodes("ps@0");
    placement->add_worker_nodes(kNode);
    for (const PartitionPlacement& p : *placed) *placement->add_partitions() = p;
    task.add_shard_addresses("shard0");
    EXPECT_TRUE(stores_["shard0"].AddJob(job_id, spec, 0, *placed).ok());
    return task;
  }

  // How long an ended job's series stay.
  virtual absl::Duration MetricsGrace() const { return absl::Minutes(10); }

  bool Exported(const std::string& text) {
    return metrics_.Exposition().find(text) != std::string::npos;
  }

  bool AwaitNoJobs() {
    for (int i = 0; i < 200; ++i) {
      if (runtime_->Jobs().empty()) return true;
      coordinator_.AwaitHeartbeats(1);
    }
    return false;
  }

  std::string data_dir_;
  MetricsRegistry metrics_;
  std::atomic<int> releases_{0};  // Calls to release_memory.
  std::map<std::string, ParameterStore> stores_;
  Traffic traffic_;
  control::FakeCoordinator coordinator_;
  std::unique_ptr<WorkerRuntime> runtime_;
  std::unique_ptr<NodeAgent> agent_;
  absl::Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
};

// A SYNC job's lost rank that no free worker took goes to a worker of the
// job: it trains both ranks at once, each pushing as its own (the shards
// keep their requests apart), and each reports its end.
TEST_F(WorkerRuntimeTest, TrainsTwoRanksOfASyncJobAtOnce) {
  JobSpec spec = Spec(30);
  spec.set_num_workers(2);
  Task zero = HostedTask("j", spec);
  zero.mutable_placement()->add_worker_nodes(kNode);
  Task one = zero;
  one.set_rank(1);
  one.set_evaluates(false);
  coordinator_.SetTasks(kNode, {zero, one});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.has_test_accuracy(); }));
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.rank() == 1 && r.finished(); }));
  for (const ReportProgressRequest& r : coordinator_.reports()) {
    EXPECT_TRUE(r.error().empty()) << r.error();
    if (r.finished()) EXPECT_EQ(r.step(), 30);
  }
  EXPECT_EQ(runtime_->Jobs(), std::vector<std::string>{"j"});
  // Its step count is the shards' completed steps: every one had both
  // ranks' pushes.
  PullRequest pull;
  pull.set_job_id("j");
  auto pulled = stores_["shard0"].Pull(pull, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->partitions(0).version(), 30);
  coordinator_.SetTasks(kNode, {});
  EXPECT_TRUE(AwaitNoJobs());
}

TEST_F(WorkerRuntimeTest, TrainsItsTaskAndReportsTheResult) {
  coordinator_.SetTasks(kNode, {HostedTask("j", Spec(40))});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.has_test_accuracy(); }));
  const std::vector<ReportProgressRequest> reports = coordinator_.reports();
  const ReportProgressRequest& final = reports.back();
  EXPECT_EQ(final.job_id(), "j");
  EXPECT_EQ(final.node_id(), kNode);
  EXPECT_TRUE(final.finished());
  EXPECT_EQ(final.step(), 40);
  EXPECT_TRUE(final.error().empty()) << final.error();
  EXPECT_GE(final.test_accuracy(), 0.9);
  // Progress came every step before it.
  EXPECT_GE(reports.size(), 40u);

  coordinator_.SetTasks(kNode, {});
  EXPECT_TRUE(AwaitNoJobs());
  // The ended job's series stay, with their last values, for the grace.
  coordinator_.AwaitHeartbeats(2);
  EXPECT_TRUE(Exported("downpour_worker_steps_total{job=\"j\"} 40\n")) << metrics_.Exposition();
  EXPECT_TRUE(Exported("downpour_worker_step_seconds_count{job=\"j\"} 40\n"));
  EXPECT_TRUE(Exported("downpour_worker_examples_total{job=\"j\"} 320\n"));
  EXPECT_TRUE(Exported("downpour_worker_test_accuracy{job=\"j\"} "));
  // Its shard clients' too: rank 0's pulls and pushes to shard 0.
  EXPECT_TRUE(Exported("downpour_worker_pull_seconds_count{job=\"j\",shard=\"0\"} "));
  EXPECT_TRUE(Exported("downpour_worker_pushed_bytes_total{job=\"j\",shard=\"0\"} "));
}

// A worker whose ended jobs' series go at once.
class WorkerRuntimeNoGraceTest : public WorkerRuntimeTest {
 protected:
  absl::Duration MetricsGrace() const override { return absl::ZeroDuration(); }
};

TEST_F(WorkerRuntimeNoGraceTest, AnEndedJobsSeriesGoAfterTheGrace) {
  coordinator_.SetTasks(kNode, {HostedTask("j", Spec(5))});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.has_test_accuracy(); }));
  EXPECT_TRUE(Exported("job=\"j\""));
  coordinator_.SetTasks(kNode, {});
  ASSERT_TRUE(AwaitNoJobs());
  coordinator_.AwaitHeartbeats(2);
  EXPECT_FALSE(Exported("job=\"j\"")) << metrics_.Exposition();
}

TEST_F(WorkerRuntimeTest, AnEndedRunIsDestroyedThroughTheMemoryReleaserOnce) {
  coordinator_.SetTasks(kNode, {HostedTask("j", Spec(1000000))});
  ASSERT_TRUE(
      coordinator_.AwaitReport([](const ReportProgressRequest& r) { return r.step() >= 2; }));
  EXPECT_EQ(releases_.load(), 0);
  coordinator_.SetTasks(kNode, {});
  ASSERT_TRUE(AwaitNoJobs());
  // Once for the ended run, not with every heartbeat after it.
  coordinator_.AwaitHeartbeats(3);
  EXPECT_EQ(releases_.load(), 1);
}

TEST_F(WorkerRuntimeTest, AsyncPushesEveryNStepsAndPullsEveryMAsTheSpecSays) {
  JobSpec spec = Spec(40);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  spec.mutable_consistency()->set_push_every(4);
  spec.mutable_consistency()->set_fetch_every(2);
  coordinator_.SetTasks(kNode, {HostedTask("j", spec)});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.has_test_accuracy(); }));
  const ReportProgressRequest final = coordinator_.reports().back();
  EXPECT_EQ(final.step(), 40);
  EXPECT_GE(final.test_accuracy(), 0.9);
  // Steps 4, 8, ..., 40 push the sum of four steps' gradients (the final
  // capture adds none here: the job is not saved).
  EXPECT_EQ(traffic_.gradient_pushes.load(), 10);
  // The first pull, one after every second step but the last, and rank 0's
  // pull of the final parameters to evaluate.
  EXPECT_EQ(traffic_.pulls.load(), 1 + 19 + 1);
}

TEST_F(WorkerRuntimeTest, ShardThatCannotHostTheJobFailsItWithTheReason) {
  stores_["shard0"].RefuseJob("j", absl::ResourceExhaustedError("no memory for 9 GiB"));
  Task task = HostedTask("other", Spec(10));
  task.set_job_id("j");
  coordinator_.SetTasks(kNode, {task});
  ASSERT_TRUE(
      coordinator_.AwaitReport([](const ReportProgressRequest& r) { return !r.error().empty(); }));
  EXPECT_THAT(coordinator_.reports().back().error(), HasSubstr("no memory for 9 GiB"));
  EXPECT_TRUE(Exported("downpour_worker_failures_total{reason=\"failed_precondition\"} "))
      << metrics_.Exposition();
}

TEST_F(WorkerRuntimeTest, AFailedRunStillAssignedAfterTheGraceRunsItsRankAgain) {
  // The coordinator keeps the task although the run failed and said so (a
  // report it never acted on): the rank does not stay held by no run.
  stores_["shard0"].RefuseJob("j", absl::ResourceExhaustedError("no memory for 9 GiB"));
  Task task = HostedTask("other", Spec(10));
  task.set_job_id("j");
  coordinator_.SetTasks(kNode, {task});
  int failures = 0;
  for (int i = 0; i < 100 && failures < 2; ++i) {
    coordinator_.AwaitHeartbeats(1);
    failures = 0;
    for (const ReportProgressRequest& r : coordinator_.reports()) failures += !r.error().empty();
  }
  EXPECT_GE(failures, 2);
  coordinator_.SetTasks(kNode, {});
  EXPECT_TRUE(AwaitNoJobs());
}

TEST_F(WorkerRuntimeTest, ARunWhoseStepsGrewAsItFinishedRunsAgainForTheRest) {
  // The rank took on a lost rank's steps just as its run finished.
  Task task = HostedTask("j", Spec(20));
  coordinator_.SetTasks(kNode, {task});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.finished() && r.step() == 20; }));
  task.set_steps(30);
  coordinator_.SetTasks(kNode, {task});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.finished() && r.step() == 30; }));
  int from_20 = 0;  // Steps it trained the second time: 21..30.
  for (const ReportProgressRequest& r : coordinator_.reports()) {
    from_20 += !r.finished() && r.step() > 20;
  }
  EXPECT_GE(from_20, 9);
  coordinator_.SetTasks(kNode, {});
  EXPECT_TRUE(AwaitNoJobs());
}

TEST_F(WorkerRuntimeTest, AFinishedRankToldToEvaluateRunsAgainFromWhereItGotTo) {
  // Rank 0 was lost after this rank finished: it evaluates now, and trains
  // none of its steps again on the way.
  coordinator_.SetRankZeroEvaluates(false);
  Task task = HostedTask("j", Spec(20));
  task.set_evaluates(false);
  coordinator_.SetTasks(kNode, {task});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.finished() && r.step() == 20; }));
  const size_t before = coordinator_.reports().size();
  task.set_evaluates(true);
  coordinator_.SetTasks(kNode, {task});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.finished() && r.has_test_accuracy(); }));
  const std::vector<ReportProgressRequest> reports = coordinator_.reports();
  for (size_t i = before; i < reports.size(); ++i) {  // Step 0: its data listing.
    EXPECT_TRUE(reports[i].step() == 0 || reports[i].step() >= 20)
        << "step " << reports[i].step() << " trained again";
  }
  coordinator_.SetTasks(kNode, {});
  EXPECT_TRUE(AwaitNoJobs());
}

TEST_F(WorkerRuntimeTest, JobThatIsNoLongerATaskIsCancelledWithoutAReport) {
  coordinator_.SetTasks(kNode, {HostedTask("j", Spec(1000000))});
  ASSERT_TRUE(
      coordinator_.AwaitReport([](const ReportProgressRequest& r) { return r.step() >= 2; }));
  coordinator_.SetTasks(kNode, {});
  ASSERT_TRUE(AwaitNoJobs());
  for (const ReportProgressRequest& r : coordinator_.reports()) {
    EXPECT_TRUE(r.error().empty()) << r.error();
  }
}

// A run the worker stops while the job goes on says what happened, in the
// job's log: its rank went to another worker (and it takes another over),
// the job started again, or the job left the worker's task list (which does
// not say whether it ended) — never that the job ended.
TEST_F(WorkerRuntimeTest, AStoppedRunSaysWhatHappenedNotThatTheJobEnded) {
  CaptureLog();
  JobSpec spec = Spec(1000000);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  spec.set_num_workers(2);
  Task rank0 = HostedTask("j", spec);
  rank0.mutable_placement()->add_worker_nodes("other@test");
  rank0.set_attempt(1);
  coordinator_.SetTasks(kNode, {rank0});
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.rank() == 0 && r.step() >= 2; }));

  // Rank 0 went to another worker; this one takes rank 1 over.
  Task rank1 = rank0;
  rank1.set_rank(1);
  rank1.mutable_placement()->set_worker_nodes(0, "other@test");
  rank1.mutable_placement()->set_worker_nodes(1, kNode);
  EXPECT_EQ(traffic_.cancels.load(), 0);
  coordinator_.SetTasks(kNode, {rank1});
  EXPECT_TRUE(
      AwaitLogLine("job j: rank 0 was handed to another worker; this worker stops its run"));
  // Each stopped run's calls to its shard were cancelled (a call to a shard
  // that is gone would hold it until its deadline).
  EXPECT_GE(traffic_.cancels.load(), 1);
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.rank() == 1 && r.step() >= 2; }));

  Task again = rank1;
  again.set_attempt(2);
  coordinator_.SetTasks(kNode, {again});
  const int cancels = traffic_.cancels.load();
  EXPECT_TRUE(AwaitLogLine(
      "job j: the job started again (attempt 2); this worker stops its run of attempt 1"));
  EXPECT_GT(traffic_.cancels.load(), cancels);
  ASSERT_TRUE(coordinator_.AwaitReport(
      [](const ReportProgressRequest& r) { return r.attempt() == 2 && r.step() >= 2; }));

  coordinator_.SetTasks(kNode, {});
  ASSERT_TRUE(AwaitNoJobs());
  EXPECT_TRUE(
      AwaitLogLine("job j: the job is no longer this worker's task (it ended, or rank 1 went to "
                   "another worker); this worker stops its run"));
  for (const std::string& line : LogLines()) {
    EXPECT_THAT(line, Not(HasSubstr("job ended")));
    EXPECT_THAT(line, Not(HasSubstr("CANCELLED")));
  }
}

TEST_F(WorkerRuntimeTest, ShutdownHandsTheRankBackAfterACompletedStep) {
  CaptureLog();
  coordinator_.SetTasks(kNode, {HostedTask("j", Spec(1000000))});
  ASSERT_TRUE(
      coordinator_.AwaitReport([](const ReportProgressRequest& r) { return r.step() >= 2; }));
  runtime_->StopAll();
  const std::vector<ReportProgressRequest> reports = coordinator_.reports();
  const ReportProgressRequest& last = reports.back();
  EXPECT_TRUE(last.drained());
  EXPECT_TRUE(last.error().empty());
  // It names the steps it completed: at least those it reported.
  EXPECT_GE(last.step(), reports[reports.size() - 2].step());
  EXPECT_TRUE(runtime_->Jobs().empty());
  // The job goes on elsewhere: the log says the rank was handed back.
  EXPECT_TRUE(
      AwaitLogLine("job j: rank 0 was handed back to the coordinator for another worker (this "
                   "worker is shutting down); this worker stops its run"));
  for (const std::string& line : LogLines()) EXPECT_THAT(line, Not(HasSubstr("job ended")));
}

}  // namespace
}  // namespace downpour
