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

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/checkpoint_test_", name);
  EXPECT_TRUE(RemoveAll(dir).ok());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

ShardSnapshot Sample() {
  ShardSnapshot s;
  s.job_id = "job-1";
  s.shard = 1;
  s.step = 40;
  s.sync = false;
  PartitionSnapshot a;
  a.tensor_id = 0;
  a.partition = 2;
  a.offset = 8;
  a.version = 40;
  a.updates = 39;
  a.values = {1.f, 2.f, 3.f};
  a.slots = {{0.1f, 0.2f, 0.3f}, {4.f, 5.f, 6.f}};
  PartitionSnapshot b;
  b.tensor_id = 3;
  b.values = {-1.f};
  b.version = 41;
  s.partitions = {a, b};
  s.worker_steps = {40, 39};
  RequestWindow w;
  w.worker_id = "worker@host with spaces:7";
  w.incarnation = 123;
  w.floor = 7;
  w.applied = {8, 10};
  s.requests = {w, RequestWindow{"w2", 1, -5, {}}};
  return s;
}

TEST(CheckpointTest, WriterWritesUnderTheRootAndReportsParts) {
  const std::string root = TempDir("writer");
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
