#include "ps/checkpoint.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// Two partitions of job-1 on shard 1, at versions 40 and 41 (ASYNC).
ShardSnapshot Sample() {
  ShardSnapshot s;
  s.job_id = "job-1";
  s.shard = 1;
  s.step = 40;
  s.sync = false;
  for (int64_t version : {40, 41}) {
    PartitionSnapshot p;
    p.tensor_id = static_cast<int32_t>(version - 40);
    p.version = version;
    p.values = {1.f, 2.f};
    s.partitions.push_back(p);
  }
  s.worker_steps = {40};
  return s;
}

std::string Root(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  EXPECT_TRUE(RemoveAll(root).ok());
  return root;
}

TEST(CheckpointTest, WriterWritesUnderTheRootAndReportsParts) {
  const std::string root = Root("checkpoint_writer_test");
  CheckpointWriter writer(root);
  writer.Write(Sample());
  ShardSnapshot failed;
  failed.job_id = "job-1";
  failed.shard = 0;
  failed.step = 40;
  failed.error = "partition 0/0 is already at version 42, past the checkpoint's step 40";
  writer.Write(failed);
  writer.Drain();
  const std::vector<CheckpointPart> parts = writer.Parts();
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].job_id(), "job-1");
  EXPECT_EQ(parts[0].step(), 40);
  EXPECT_TRUE(parts[0].error().empty()) << parts[0].error();
  EXPECT_EQ(parts[0].file().name(), "shard-1.safetensors");
  EXPECT_EQ(parts[0].file().min_version(), 40);
  EXPECT_EQ(parts[0].file().max_version(), 41);
  const std::string path = root + "/job-1/step-40/shard-1.safetensors";
  EXPECT_EQ(ReadFileToString(path).value().size(), parts[0].file().bytes());
  EXPECT_TRUE(ReadShardSnapshot(path, parts[0].file()).ok());
  EXPECT_THAT(parts[1].error(), HasSubstr("past the checkpoint's step 40"));
  writer.ForgetJob("job-1");
  EXPECT_TRUE(writer.Parts().empty());
}

// The file holds the store's state at the checkpoint's step, though the
// pushes that follow the capture update every partition while it is
// written.
TEST(CheckpointTest, WritesTheStoresStateAtItsStepWhilePushesGoOn) {
  const std::string root = Root("checkpoint_store_test");
  CheckpointWriter writer(root);
  ParameterStore store, reference;
  store.SetCheckpointSink([&writer](ShardCapture c) { writer.Write(std::move(c)); });
  JobSpec spec = SmallMlpJob(1, 1);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  ApplyJobDefaults(&spec);
  const auto placed = PlacePartitions(ValidateJobSpec(spec).value(), 1, spec.partition_bytes());
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_TRUE(store.AddJob("job", spec, 0, *placed).ok());
  ASSERT_TRUE(reference.AddJob("job", spec, 0, *placed).ok());
  PullResponse at_step_3;
  for (int64_t step = 0; step < 6; ++step) {
    PushRequest push;
    push.set_job_id("job");
    push.mutable_request_id()->set_worker_id("w");
    push.mutable_request_id()->set_incarnation(1);
    push.mutable_request_id()->set_sequence(step + 1);
    push.set_step(step);
    for (const PartitionPlacement& p : *placed) {
      PartitionHeader* header = push.add_partitions();
      header->mutable_key()->set_tensor_id(p.tensor_id());
      header->mutable_key()->set_partition(p.partition());
      header->set_dtype(FLOAT32);
      header->set_num_elements(p.num_elements());
      const std::vector<float> grad(p.num_elements(), 0.25f * static_cast<float>(step + 1));
      push.mutable_payload()->append(reinterpret_cast<const char*>(grad.data()),
                                     grad.size() * sizeof(float));
    }
    ASSERT_TRUE(reference.Push(push).ok());
    if (step == 2) {
      push.set_checkpoint_step(3);
      PullRequest pull;
      pull.set_job_id("job");
      at_step_3 = reference.Pull(pull, absl::Now() + absl::Seconds(10)).value();
    }
    ASSERT_TRUE(store.Push(push).ok());
  }
  writer.Drain();
  const std::vector<CheckpointPart> parts = writer.Parts();
  ASSERT_EQ(parts.size(), 1u);
  ASSERT_TRUE(parts[0].error().empty()) << parts[0].error();
  const auto written = ReadShardSnapshot(
      absl::StrCat(root, "/", CheckpointDir("job", 3), "/", ShardFileName(0)), parts[0].file());
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->partitions.size(), static_cast<size_t>(at_step_3.partitions_size()));
  size_t offset = 0;
  for (int i = 0; i < at_step_3.partitions_size(); ++i) {
    const PartitionSnapshot& p = written->partitions[i];
    EXPECT_EQ(p.version, 3);
    const size_t bytes = p.values.size() * sizeof(float);
    EXPECT_EQ(std::memcmp(p.values.data(), at_step_3.payload().data() + offset, bytes), 0)
        << "partition " << p.tensor_id << "/" << p.partition;
    offset += bytes;
  }
}

}  // namespace
}  // namespace downpour
