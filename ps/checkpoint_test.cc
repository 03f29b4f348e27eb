#include "ps/checkpoint.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

TEST(CheckpointTest, WriterWritesUnderTheRootAndReportsParts) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/checkpoint_writer_test");
  ASSERT_TRUE(RemoveAll(root).ok());
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

}  // namespace
}  // namespace downpour
