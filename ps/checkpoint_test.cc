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
  RequestDedup::WorkerWindow w;
  w.worker_id = "worker@host with spaces:7";
  w.incarnation = 123;
  w.floor = 7;
  w.applied = {8, 10};
  s.requests = {w, RequestDedup::WorkerWindow{"w2", 1, -5, {}}};
  return s;
}

TEST(CheckpointTest, ShardSnapshotRoundTrips) {
  const std::string path = TempDir("round_trip") + "/" + ShardFileName(1);
  const ShardSnapshot s = Sample();
  auto written = WriteShardSnapshot(path, s);
  ASSERT_TRUE(written.ok()) << written.status();
  CheckpointFile expected;
  expected.set_bytes(written->bytes);
  expected.set_crc32c(written->crc32c);
  auto read = ReadShardSnapshot(path, expected);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_id, "job-1");
  EXPECT_EQ(read->shard, 1);
  EXPECT_EQ(read->step, 40);
  EXPECT_FALSE(read->sync);
  ASSERT_EQ(read->partitions.size(), 2u);
  EXPECT_EQ(read->partitions[0].offset, 8);
  EXPECT_EQ(read->partitions[0].updates, 39);
  EXPECT_EQ(read->partitions[0].values, s.partitions[0].values);
  EXPECT_EQ(read->partitions[0].slots, s.partitions[0].slots);
  EXPECT_EQ(read->partitions[1].version, 41);
  EXPECT_TRUE(read->partitions[1].slots.empty());
  EXPECT_EQ(read->worker_steps, s.worker_steps);
  ASSERT_EQ(read->requests.size(), 2u);
  EXPECT_EQ(read->requests[0].worker_id, "worker@host with spaces:7");
  EXPECT_EQ(read->requests[0].applied, (std::vector<int64_t>{8, 10}));
  EXPECT_EQ(read->requests[1].floor, -5);
}

TEST(CheckpointTest, PartialOrCorruptFileIsRefusedNamingIt) {
  const std::string path = TempDir("corrupt") + "/" + ShardFileName(0);
  auto written = WriteShardSnapshot(path, Sample());
  ASSERT_TRUE(written.ok());
  CheckpointFile expected;
  expected.set_bytes(written->bytes);
  expected.set_crc32c(written->crc32c);
  std::string bytes = ReadFileToString(path).value();

  auto truncated = AtomicFile::Create(path, "test file");
  ASSERT_TRUE((*truncated)->Append(bytes.substr(0, bytes.size() / 2)).ok());
  ASSERT_TRUE((*truncated)->Commit().ok());
  auto read = ReadShardSnapshot(path, expected);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("partial"));

  bytes[bytes.size() - 3] ^= 0x40;  // One flipped bit in the data.
  auto flipped = AtomicFile::Create(path, "test file");
  ASSERT_TRUE((*flipped)->Append(bytes).ok());
  ASSERT_TRUE((*flipped)->Commit().ok());
  read = ReadShardSnapshot(path, expected);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr("CRC32C"));

  EXPECT_EQ(ReadShardSnapshot(path + ".missing", expected).status().code(),
            absl::StatusCode::kNotFound);
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
