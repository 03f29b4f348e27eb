// Model parallelism through the real daemons (issue 13): Fashion-MNIST MLPs
// split into pipeline stages (ModelSpec.pipeline) train through two shards
// and two workers, every stage of a worker on its CPU (--devices=cpu, so a
// GPU host runs the test the same way), to the accuracy of the unsplit
// model; a worker's --device_memory_limit reaches each stage.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

// FashionMlpSpec's model (layers flatten0, dense1, relu2, dense3,
// softmax_cross_entropy4) with `pipeline` appended to it.
std::string PipelinedMlpSpec(int64_t steps, const std::string& pipeline) {
  return absl::StrReplaceAll(
      FashionMlpSpec("SYNC", 2, 2, steps),
      {{"  layer { softmax_cross_entropy {} }\n}",
        absl::StrCat("  layer { softmax_cross_entropy {} }\n  pipeline { ", pipeline, " }\n}")}});
}

class PipelineClusterTest : public ClusterFixture {
 protected:
  void StartCluster(std::vector<std::string> worker_flags) {
    LocalCluster::Options options;
    options.shards = 2;
    options.workers = 2;
    options.worker_flags = std::move(worker_flags);
    ClusterFixture::StartCluster(options);
  }

  // Submits `spec` with --wait; returns the ended job.
  JobStatus Submit(const std::string& spec, const std::string& id) {
    CommandResult result = cluster_->Ctl({"submit", WriteSpec(spec), "--job_id=" + id, "--wait"});
    JobStatus job = cluster_->GetJob(id);
    if (job.state() == SUCCEEDED) {
      EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
    }
    return job;
  }
};

// Two stages and three, each worker's stages on its CPU, in SYNC: the
// stages' pushed gradients are the whole model's batch means, so the job
// learns as the unsplit one does (tests/cluster_test.cc's 0.78 in 300
// steps), to within a point of its accuracy.
TEST_F(PipelineClusterTest, MlpsSplitIntoStagesTrainFashionMnistInSync) {
  StartCluster({"--devices=cpu"});
  struct Case {
    std::string id, pipeline;
    int stages;
  };
  const std::vector<Case> cases = {
      {"two-stages",
       "stage { layers: [\"flatten0\", \"dense1\", \"relu2\"] } "
       "stage { layers: [\"dense3\", \"softmax_cross_entropy4\"] } micro_batches: 8",
       2},
      {"three-stages",
       "stage { layers: [\"flatten0\", \"dense1\"] } stage { layers: [\"relu2\"] } "
       "stage { layers: [\"dense3\", \"softmax_cross_entropy4\"] } micro_batches: 4 "
       "schedule: GPIPE",
       3},
  };
  const JobStatus unsplit = Submit(FashionMlpSpec("SYNC", 2, 2, 300), "unsplit");
  ASSERT_EQ(unsplit.state(), SUCCEEDED) << unsplit.message() << cluster_->Logs();
  for (const Case& c : cases) {
    JobStatus job = Submit(PipelinedMlpSpec(300, c.pipeline), c.id);
    EXPECT_EQ(job.state(), SUCCEEDED)
        << c.id << ": " << job.message() << Events(job) << cluster_->Logs();
    EXPECT_EQ(job.step(), 300) << c.id;
    EXPECT_GE(job.test_accuracy(), 0.78) << c.id;
    EXPECT_NEAR(job.test_accuracy(), unsplit.test_accuracy(), 0.01) << c.id;
    std::cout << c.id << ": test accuracy " << job.test_accuracy() << " (unsplit "
              << unsplit.test_accuracy() << ")" << std::endl;
    ASSERT_EQ(job.workers_size(), 2) << c.id;
    EXPECT_TRUE(job.workers(0).finished() && job.workers(1).finished()) << c.id;
    // Each worker says where its stages run.
    const std::string logs = cluster_->Logs();
    EXPECT_THAT(logs, ::testing::HasSubstr(
                          absl::StrCat("job ", c.id, ": pipeline of ", c.stages, " stages in ")))
        << c.id;
  }
}

// --device_memory_limit caps the stages' compute memory on each device, and the worker
// registers it: a job whose model cannot fit it is refused at submit,
// naming the worker and the flag (model_runner_test shows the cap reaching
// each stage's device, which fails a job the estimate let through).
TEST_F(PipelineClusterTest, AModelOverTheWorkersDeviceMemoryLimitIsRefusedNamingIt) {
  StartCluster({"--devices=cpu", "--device_memory_limit=65536"});
  CommandResult refused = cluster_->Ctl(
      {"submit",
       WriteSpec(PipelinedMlpSpec(50,
                                  "stage { layers: [\"flatten0\", \"dense1\", \"relu2\"] } "
                                  "stage { layers: [\"dense3\", \"softmax_cross_entropy4\"] }")),
       "--job_id=too-big"});
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_THAT(refused.err, ::testing::HasSubstr("may hold 64.0 KiB (its --device_memory_limit)"));
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
  std::cout << refused.err << std::endl;
}

// A negative limit stops the worker at start, in one sentence.
TEST(PipelineWorkerFlagsTest, ANegativeDeviceMemoryLimitIsRefused) {
  CommandResult result = RunCommand(
      {Runfile("worker/downpour-worker"), "--coordinator=127.0.0.1:1", "--device_memory_limit=-1"},
      absl::Seconds(20));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, ::testing::HasSubstr("--device_memory_limit=-1 is not a memory limit"));
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
}

}  // namespace
}  // namespace testing
}  // namespace downpour
