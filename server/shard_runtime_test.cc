#include "server/shard_runtime.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "control/fake_coordinator.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "ps/memory_budget.h"
#include "rpc/node_agent.h"
#include "spec/checkpoint_files.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "spec/sparse_ids.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kNode[] = "ps@test";

// A job of a small MLP (or `spec`) over two shards, as the coordinator
// places it; this shard is `shard`.
Task MakeTask(const std::string& job_id, int shard, const JobSpec* given = nullptr) {
  Task task;
  task.set_job_id(job_id);
  task.set_rank(shard);
  JobSpec* spec = task.mutable_spec();
  *spec = given != nullptr ? *given : SmallMlpJob(/*num_workers=*/1, /*num_shards=*/2);
  ApplyJobDefaults(spec);
  auto params = ValidateJobSpec(*spec);
  EXPECT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, 2, spec->partition_bytes());
  EXPECT_TRUE(placed.ok()) << placed.status();
  Placement* placement = task.mutable_placement();
  placement->add_shard_nodes(kNode);
  placement->add_shard_nodes("ps@other");
  placement->add_worker_nodes("worker@w");
  for (const PartitionPlacement& p : *placed) *placement->add_partitions() = p;
  return task;
}

absl::StatusCode PullCode(ParameterStore& store, const std::string& job) {
  PullRequest pull;
  pull.set_job_id(job);
  return store.Pull(pull, absl::Now() + absl::Seconds(5)).status().code();
}

// The runtime driven as in the daemon: by a node agent's heartbeats, here
// against an in-process coordinator.
class ShardRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeAgent::Options options;
    options.coordinator_name = "fake";
    options.self.set_id(kNode);
    options.self.set_role(SHARD);
    options.self.set_address("127.0.0.1:1");
    auto agent = NodeAgent::Start(options, &coordinator_, [this](const std::vector<Task>& tasks) {
      runtime_.OnTasks(tasks);
    });
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(agent).value();
  }
  void TearDown() override { agent_.reset(); }

  // Sets the shard's tasks and waits for the agent to have handed them over.
  void Tasks(std::vector<Task> tasks) {
    coordinator_.SetTasks(kNode, std::move(tasks));
    ASSERT_TRUE(coordinator_.AwaitHeartbeats(2));
  }
  double Gauge(const std::string& name) { return metrics_.GetGauge(name, "")->value(); }

  ParameterStore store_;
  MetricsRegistry metrics_;
  std::atomic<int> releases_{0};  // Calls to release_memory.
  ShardRuntime runtime_{&store_, /*writer=*/nullptr, &metrics_,
                        [this](const std::function<void()>& free_memory) {
                          free_memory();
                          ++releases_;
                        }};
  control::FakeCoordinator coordinator_;
  std::unique_ptr<NodeAgent> agent_;
};

TEST_F(ShardRuntimeTest, HostsItsTasksAndDropsThemWhenTheyEnd) {
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kNotFound);
  const Task task = MakeTask("j", 0);
  Tasks({task});
  EXPECT_THAT(runtime_.HostedJobs(), ElementsAre("j"));
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kOk);
  EXPECT_EQ(Gauge("downpour_ps_jobs"), 1);
  const std::vector<PartitionPlacement> partitions(task.placement().partitions().begin(),
                                                   task.placement().partitions().end());
  EXPECT_EQ(Gauge("downpour_ps_parameter_bytes"), BytesPerShard(partitions, 2)[0]);
  // The job's memory: at least its parameters (Adam's slots come on top).
  EXPECT_GE(metrics_.GetGauge("downpour_ps_memory_bytes", "", {{"job", "j"}})->value(),
            BytesPerShard(partitions, 2)[0]);
  // Pushes and pulls through serving() are measured, per job.
  PullRequest pull;
  pull.set_job_id("j");
  ASSERT_TRUE(runtime_.serving()->Pull(pull, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_NE(metrics_.Exposition().find("downpour_ps_sent_bytes_total{job=\"j\"} " +
                                       std::to_string(BytesPerShard(partitions, 2)[0]) + "\n"),
            std::string::npos)
      << metrics_.Exposition();

  Tasks({});
  EXPECT_TRUE(runtime_.HostedJobs().empty());
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kNotFound);
  EXPECT_EQ(Gauge("downpour_ps_jobs"), 0);
  EXPECT_EQ(Gauge("downpour_ps_parameter_bytes"), 0);
  // The job's own series go with it.
  EXPECT_EQ(metrics_.Exposition().find("job=\"j\""), std::string::npos) << metrics_.Exposition();
}

TEST_F(ShardRuntimeTest, TakesARanksPushesOnlyFromTheNodeTheCoordinatorPlacedThere) {
  Task task = MakeTask("j", 0);
  Tasks({task});
  auto push_code = [this](const std::string& node) {
    PushRequest push;
    push.set_job_id("j");
    push.set_worker_rank(0);
    push.mutable_request_id()->set_worker_id(node);
    push.mutable_request_id()->set_sequence(1);
    return runtime_.serving()->Push(push, Payload()).status().code();
  };
  // From the first task on that hosts the job.
  EXPECT_EQ(push_code("worker@x"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(runtime_.AuthorizeWorker("worker@x", "j", 0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(runtime_.AuthorizeWorker("worker@w", "j", 0).ok());
  EXPECT_EQ(push_code("worker@w"), absl::StatusCode::kOk);

  // The rank handed on to worker@x (its old holder lost, then a taker).
  task.mutable_placement()->set_worker_nodes(0, "worker@x");
  Tasks({task});
  EXPECT_EQ(push_code("worker@w"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(push_code("worker@x"), absl::StatusCode::kOk);
}

// The coordinator starts a job again with a rank that has no worker as lost
// and may give it a taker a moment later: a rank absent in the task list
// that hosts the job still counts until the next task list says so, so no
// step completes without its batch meanwhile.
// A push of step 0 by `node` as worker `rank` of job "j" (SYNC, 2 workers)
// to every partition of shard 0 of `task`, and a pull of them at version 1.
void StepZero(const Task& task, int rank, const std::string& node, PushRequest* push,
              PullRequest* pull) {
  push->set_job_id("j");
  push->set_worker_rank(rank);
  push->mutable_request_id()->set_worker_id(node);
  push->mutable_request_id()->set_sequence(1);
  pull->set_job_id("j");
  pull->set_min_version(1);
  for (const PartitionPlacement& p : task.placement().partitions()) {
    if (p.shard() != 0) continue;
    PartitionHeader* header = push->add_partitions();
    header->mutable_key()->set_tensor_id(p.tensor_id());
    header->mutable_key()->set_partition(p.partition());
    header->set_dtype(FLOAT32);
    header->set_num_elements(p.num_elements());
    push->mutable_payload()->append(p.num_elements() * sizeof(float), '\0');
    PartitionKey* key = pull->add_keys();
    key->set_tensor_id(p.tensor_id());
    key->set_partition(p.partition());
  }
}

// The coordinator starts a job again with a rank that has no worker as lost
// and may give it a taker a moment later: a rank absent in the task list
// that hosts the job still counts until the next task list says so, so no
// step completes without its batch meanwhile.
TEST(ShardRuntimeTasksTest, ARankAbsentWhenTheJobIsHostedCountsUntilTheNextTaskList) {
  for (const bool taken_over : {false, true}) {
    SCOPED_TRACE(taken_over ? "then taken over" : "still absent");
    ParameterStore store;
    MetricsRegistry metrics;
    ShardRuntime runtime(&store, /*writer=*/nullptr, &metrics);
    const JobSpec spec = SmallMlpJob(/*num_workers=*/2, /*num_shards=*/2);
    Task task = MakeTask("j", 0, &spec);
    task.mutable_placement()->add_worker_nodes("");
    task.add_absent_ranks(1);
    runtime.OnTasks({task});
    PushRequest push;
    PullRequest pull;
    StepZero(task, 0, "worker@w", &push, &pull);
    ASSERT_TRUE(store.Push(push).ok());
    EXPECT_EQ(store.Pull(pull, absl::Now() + absl::Milliseconds(300)).status().code(),
              absl::StatusCode::kDeadlineExceeded);
    if (taken_over) {
      task.clear_absent_ranks();
      task.mutable_placement()->set_worker_nodes(1, "worker@x");
    }
    runtime.OnTasks({task});
    if (taken_over) {
      // The step waits for the taker, whose push completes it.
      EXPECT_EQ(store.Pull(pull, absl::Now() + absl::Milliseconds(300)).status().code(),
                absl::StatusCode::kDeadlineExceeded);
      PushRequest taker;
      PullRequest same;
      StepZero(task, 1, "worker@x", &taker, &same);
      ASSERT_TRUE(store.Push(taker).ok());
    }
    EXPECT_TRUE(store.Pull(pull, absl::Now() + absl::Seconds(10)).ok());
  }
}

TEST_F(ShardRuntimeTest, DropsJobsThroughTheMemoryReleaserOnly) {
  Tasks({MakeTask("j", 0)});
  Tasks({MakeTask("j", 0), MakeTask("k", 0)});
  EXPECT_EQ(releases_.load(), 0);
  Tasks({MakeTask("k", 0)});
  // Once, for the task list that dropped "j": not with every heartbeat.
  ASSERT_TRUE(coordinator_.AwaitHeartbeats(3));
  EXPECT_EQ(releases_.load(), 1);
  EXPECT_THAT(runtime_.HostedJobs(), ElementsAre("k"));
  // A job started again is hosted afresh: its old start is dropped.
  Task again = MakeTask("k", 0);
  again.set_attempt(2);
  Tasks({again});
  EXPECT_EQ(releases_.load(), 2);
  Tasks({});
  EXPECT_EQ(releases_.load(), 3);
  EXPECT_TRUE(runtime_.HostedJobs().empty());
}

TEST_F(ShardRuntimeTest, JobItCannotHostIsRefusedWithTheReasonUntilItEnds) {
  Task bad = MakeTask("bad", 0);
  bad.mutable_placement()->mutable_partitions(0)->set_num_elements(1 << 30);
  Task wrong_shard = MakeTask("wrong", 5);  // The job has 2 shards.
  Tasks({bad, wrong_shard});
  EXPECT_TRUE(runtime_.HostedJobs().empty());
  PullRequest pull;
  pull.set_job_id("bad");
  absl::Status refused = store_.Pull(pull, absl::Now() + absl::Seconds(5)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("the shard cannot host job bad"));
  EXPECT_THAT(refused.message(), HasSubstr("is not inside tensor"));
  pull.set_job_id("wrong");
  EXPECT_THAT(store_.Pull(pull, absl::Now() + absl::Seconds(5)).status().message(),
              HasSubstr("shard index 5 is outside the job's 2 shards"));

  Tasks({});
  EXPECT_EQ(PullCode(store_, "bad"), absl::StatusCode::kNotFound);
  EXPECT_EQ(PullCode(store_, "wrong"), absl::StatusCode::kNotFound);
}

// A job with a sparse table (ids 0..99, dim 4) over two shards.
JobSpec SparseJob() {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        model {
          num_classes: 2
          inputs { name: "c" kind: SPARSE }
          layer {
            name: "emb"
            inputs: "c"
            embedding { sparse: true vocab_size: 100 dim: 4 max_rows: 6 }
          }
          layer {
            name: "fc"
            dense { units: 2 }
          }
          layer { softmax_cross_entropy {} }
        }
        dataset { train_files: "train-*" test_files: "test-*" batch_size: 4 }
        optimizer { learning_rate: 0.1 }
        num_workers: 1
        num_shards: 2
        steps: 10
      )pb",
      &spec));
  return spec;
}

// Without the node agent: the runtime is handed its tasks directly.
TEST(ShardRuntimeSparseTest, ExportsSparseTablesAndTheMemoryLimit) {
  MemoryBudget budget(1 << 20);
  ParameterStore store(&budget);
  MetricsRegistry metrics;
  ShardRuntime runtime(&store, /*writer=*/nullptr, &metrics);
  const JobSpec spec = SparseJob();
  runtime.OnTasks({MakeTask("s", 0, &spec)});
  ASSERT_THAT(runtime.HostedJobs(), ElementsAre("s"));
  // Rows of this shard, one pull each: 3 of them held (max_rows 6 over 2
  // shards), 2 evicted.
  int pulled = 0;
  for (int64_t row = 0; pulled < 5; ++row) {
    if (SparseShardOf(row, 2) != 0) continue;
    PullRequest pull;
    pull.set_job_id("s");
    SparseRows* rows = pull.add_sparse();
    rows->add_ids(row);
    ASSERT_TRUE(runtime.serving()->Pull(pull, absl::Now() + absl::Seconds(5)).ok());
    ++pulled;
  }
  runtime.OnTasks({MakeTask("s", 0, &spec)});
  const std::string exposition = metrics.Exposition();
  EXPECT_THAT(exposition,
              HasSubstr("downpour_shard_sparse_rows{job=\"s\",table=\"emb/table\"} 3\n"));
  EXPECT_THAT(exposition, HasSubstr("downpour_shard_sparse_evictions_total{job=\"s\",table=\"emb/"
                                    "table\"} 2\n"));
  EXPECT_THAT(exposition, HasSubstr("downpour_shard_sparse_rows_pulled_total{job=\"s\"} 5\n"));
  EXPECT_GE(metrics.GetGauge("downpour_ps_memory_bytes", "", {{"job", "s"}})->value(),
            store.SparseTables("s")[0].bytes);

  runtime.OnTasks({});
  EXPECT_EQ(metrics.Exposition().find("job=\"s\""), std::string::npos) << metrics.Exposition();
  EXPECT_EQ(budget.used(), 0);
}

TEST(ShardRuntimeSparseTest, JobPastTheMemoryLimitIsRefusedWithTheReason) {
  MemoryBudget budget(100);
  ParameterStore store(&budget);
  MetricsRegistry metrics;
  ShardRuntime runtime(&store, /*writer=*/nullptr, &metrics);
  runtime.OnTasks({MakeTask("m", 0)});
  EXPECT_TRUE(runtime.HostedJobs().empty());
  PullRequest pull;
  pull.set_job_id("m");
  const absl::Status refused = store.Pull(pull, absl::Now() + absl::Seconds(5)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("the shard cannot host job m: job m: its partitions "
                                           "need"));
  EXPECT_THAT(refused.message(), HasSubstr("memory limit of 100 bytes (raise --memory_limit"));
}

// A task resuming from a checkpoint: this shard's file puts the sparse
// table's rows back, unless they do not fit the shard's memory limit, which
// refuses the job naming the table.
TEST(ShardRuntimeSparseTest, RestoresTheTablesRowsOrRefusesThemPastTheMemoryLimit) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/shard_runtime_sparse");
  ASSERT_TRUE(RemoveAll(root).ok());
  JobSpec spec = SparseJob();
  spec.mutable_model()->mutable_layer(0)->mutable_embedding()->clear_max_rows();
  Task task = MakeTask("r", 0, &spec);
  ShardSnapshot snapshot;
  snapshot.job_id = "r";
  snapshot.step = 5;
  snapshot.worker_steps = {5};
  for (const PartitionPlacement& p : task.placement().partitions()) {
    if (p.shard() != 0) continue;
    PartitionSnapshot part;
    part.tensor_id = p.tensor_id();
    part.partition = p.partition();
    part.offset = p.offset();
    part.version = 5;
    part.values.assign(p.num_elements(), 0.5f);
    snapshot.partitions.push_back(part);
  }
  snapshot.has_sparse = true;
  snapshot.sparse_version = 5;
  SparseTableSnapshot table;
  table.name = "emb/table";
  table.dim = 4;
  for (int64_t row = 0; row < 100; ++row) {
    if (SparseShardOf(row, 2) != 0) continue;
    table.ids.push_back(row);
    table.updates.push_back(5);
    table.touches.push_back(5);
  }
  table.values.assign(table.ids.size() * 4, 0.25f);
  snapshot.sparse_tables.push_back(table);
  const std::string dir = CheckpointDir("r", 5);
  ASSERT_TRUE(MakeDirs(absl::StrCat(root, "/", dir)).ok());
  auto written = WriteShardSnapshot(absl::StrCat(root, "/", dir, "/", ShardFileName(0)), snapshot);
  ASSERT_TRUE(written.ok()) << written.status();
  CheckpointRestore* restore = task.mutable_restore();
  restore->set_step(5);
  restore->set_dir(dir);
  CheckpointFile* file = restore->add_files();
  file->set_name(ShardFileName(0));
  file->set_shard(0);
  file->set_bytes(written->bytes);
  file->set_crc32c(written->crc32c);

  CheckpointWriter writer(root);
  {
    ParameterStore store;
    MetricsRegistry metrics;
    ShardRuntime runtime(&store, &writer, &metrics);
    runtime.OnTasks({task});
    ASSERT_THAT(runtime.HostedJobs(), ElementsAre("r"));
    EXPECT_EQ(store.SparseTables("r")[0].rows, static_cast<int64_t>(table.ids.size()));
  }
  // Room for the job before its rows, and few of them.
  int64_t empty = 0;
  {
    MemoryBudget probe(0);
    ParameterStore store(&probe);
    MetricsRegistry metrics;
    ShardRuntime runtime(&store, &writer, &metrics);
    runtime.OnTasks({MakeTask("r", 0, &spec)});
    empty = probe.used();
  }
  MemoryBudget budget(empty + 256);
  ParameterStore store(&budget);
  MetricsRegistry metrics;
  ShardRuntime runtime(&store, &writer, &metrics);
  runtime.OnTasks({task});
  EXPECT_TRUE(runtime.HostedJobs().empty());
  PullRequest pull;
  pull.set_job_id("r");
  const absl::Status refused = store.Pull(pull, absl::Now() + absl::Seconds(5)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("the shard cannot host job r: restoring job r from "
                                           "step 5: shard memory limit of"));
  EXPECT_THAT(refused.message(), HasSubstr("table emb/table"));
  EXPECT_EQ(budget.used(), 0);
}

TEST_F(ShardRuntimeTest, CoordinatorOutageKeepsTheJobs) {
  Tasks({MakeTask("j", 1)});
  ASSERT_THAT(runtime_.HostedJobs(), ElementsAre("j"));
  coordinator_.SetUp(false);
  ASSERT_TRUE(coordinator_.AwaitHeartbeats(3));
  EXPECT_THAT(runtime_.HostedJobs(), ElementsAre("j"));
  EXPECT_EQ(PullCode(store_, "j"), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace downpour
