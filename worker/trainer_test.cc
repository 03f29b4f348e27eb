#include "worker/trainer.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/example.h"
#include "data/record_io.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"

namespace downpour {
namespace {

constexpr int kPixels = 16;
constexpr int kWorkers = 3;
constexpr int kShards = 2;

// Dark images are class 0, bright ones class 1, with some texture.
void WriteDataset(const std::string& path, int examples) {
  auto writer = data::RecordWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < examples; ++i) {
    const int label = i % 2;
    std::vector<uint8_t> pixels(kPixels);
    for (int k = 0; k < kPixels; ++k) {
      pixels[k] = static_cast<uint8_t>((label ? 150 : 20) + (i * 7 + k * 13) % 90);
    }
    ASSERT_TRUE(
        (*writer)->Write(data::EncodeImageExample(pixels.data(), kPixels, label, {kPixels})).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
}

// Three layers, split into partitions of 1 KiB over two shards: each step
// is many messages, which the overlapped exchange sends in the order
// backward finishes them and the three workers' arrive in any order.
JobSpec Spec() {
  JobSpec spec;
  spec.set_name("t");
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(kPixels);
  model->set_num_classes(2);
  model->add_layer()->mutable_dense()->set_units(24);
  model->add_layer()->mutable_relu();
  model->add_layer()->mutable_dense()->set_units(12);
  model->add_layer()->mutable_relu();
  model->add_layer()->mutable_dense()->set_units(2);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_dataset()->set_train_files("train-*");
  spec.mutable_dataset()->set_test_files("test-*");
  spec.mutable_dataset()->set_batch_size(8);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  spec.set_num_workers(kWorkers);
  spec.set_num_shards(kShards);
  spec.set_steps(30);
  spec.set_log_every_steps(10);
  spec.set_partition_bytes(1024);
  spec.set_seed(5);
  ApplyJobDefaults(&spec);
  return spec;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    data_dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/trainer_test");
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", data_dir_).c_str()), 0);
    WriteDataset(data_dir_ + "/train-00000-of-00001", 96);
    WriteDataset(data_dir_ + "/test-00000-of-00001", 32);
  }

  // Trains Spec() with kWorkers trainers on threads against in-process
  // shards and returns every partition's final values, as the shards hold
  // them, byte for byte.
  std::string TrainSync(bool overlap) {
    const JobSpec spec = Spec();
    auto params = ValidateJobSpec(spec);
    EXPECT_TRUE(params.ok()) << params.status();
    auto placed = PlacePartitions(*params, kShards, spec.partition_bytes());
    EXPECT_TRUE(placed.ok()) << placed.status();
    std::vector<std::unique_ptr<ParameterStore>> stores;
    std::vector<ParameterShard*> shards;
    for (int s = 0; s < kShards; ++s) {
      stores.push_back(std::make_unique<ParameterStore>());
      EXPECT_TRUE(stores.back()->AddJob("j", spec, s, *placed).ok());
      shards.push_back(stores.back().get());
    }
    std::vector<std::unique_ptr<JobTrainer>> trainers;
    for (int rank = 0; rank < kWorkers; ++rank) {
      Task task;
      task.set_job_id("j");
      *task.mutable_spec() = spec;
      task.set_rank(rank);
      for (const PartitionPlacement& p : *placed) *task.mutable_placement()->add_partitions() = p;
      // Every third record of the one file.
      DataPart* part = task.add_data();
      part->set_file("train-00000-of-00001");
      part->set_stride(kWorkers);
      part->set_offset(rank);
      TrainerOptions options;
      options.node_id = absl::StrCat("w", rank);
      options.incarnation = 1;
      options.data_dir = data_dir_;
      options.exchange.pull_timeout = absl::Seconds(60);
      options.exchange.pull_slice = absl::Milliseconds(200);
      options.exchange.message_bytes = 1024;
      options.exchange.max_inflight = 4;
      options.overlap = overlap;
      trainers.push_back(std::make_unique<JobTrainer>(
          task, options, shards,
          [](const ReportProgressRequest&) -> absl::StatusOr<ReportProgressResponse> {
            return ReportProgressResponse();
          }));
    }
    std::vector<absl::Status> results(kWorkers);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kWorkers; ++rank) {
      threads.emplace_back([&, rank] { results[rank] = trainers[rank]->Run(); });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < kWorkers; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
    }
    std::string values;
    for (auto& store : stores) {
      PullRequest pull;
      pull.set_job_id("j");
      pull.set_min_version(spec.steps());
      Payload payload;
      absl::StatusOr<PullResponse> pulled =
          store->Pull(pull, absl::Now() + absl::Seconds(10), &payload);
      EXPECT_TRUE(pulled.ok()) << pulled.status();
      values += payload.ToString();
    }
    return values;
  }

  std::string data_dir_;
};

// The overlapped exchange changes when each partition's gradients reach
// the shards and in which order the workers' arrive, never what a SYNC step
// computes: the shards sum the workers' gradients in rank order, so the
// parameters are the serial path's, bit for bit — one-step-stale
// parameters could never pass as SYNC.
TEST_F(TrainerTest, SyncWithOverlapIsBitIdenticalToTheSerialPath) {
  const std::string serial = TrainSync(/*overlap=*/false);
  ASSERT_FALSE(serial.empty());
  for (int run = 0; run < 3; ++run) {
    const std::string overlapped = TrainSync(/*overlap=*/true);
    ASSERT_EQ(overlapped.size(), serial.size());
    EXPECT_TRUE(overlapped == serial) << "run " << run << " differs from the serial path";
  }
}

}  // namespace
}  // namespace downpour
