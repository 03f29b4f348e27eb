#include "spec/checkpoint_files.h"

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
            absl::StatusCode::kDataLoss);
}

TEST(CheckpointTest, ManifestNamesCompleteFilesAndLoadingVerifiesThem) {
  const std::string root = TempDir("manifest");
  ASSERT_TRUE(MakeDirs(root + "/job-1/step-40").ok());
  CheckpointManifest manifest;
  manifest.set_job_id("job-1");
  manifest.set_step(40);
  manifest.mutable_spec()->set_name("mlp");
  const std::string shard_path = root + "/job-1/step-40/" + ShardFileName(1);
  auto written = WriteShardSnapshot(shard_path, Sample());
  ASSERT_TRUE(written.ok());
  CheckpointFile* file = manifest.add_files();
  file->set_name(ShardFileName(1));
  file->set_shard(1);
  file->set_bytes(written->bytes);
  file->set_crc32c(written->crc32c);

  // No manifest yet: the checkpoint is incomplete.
  auto verified = VerifyCheckpoint(root, "job-1/step-40");
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr("job-1/step-40/manifest.json"));

  ASSERT_TRUE(WriteManifest(root, manifest).ok());
  verified = VerifyCheckpoint(root, "job-1/step-40");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->spec().name(), "mlp");
  ASSERT_EQ(verified->files_size(), 1);
  EXPECT_EQ(verified->files(0).crc32c(), written->crc32c);
  // Another checkpoint's directory does not take this manifest.
  EXPECT_EQ(ReadManifest(root, "job-2/step-40").status().code(), absl::StatusCode::kDataLoss);

  std::string bytes = ReadFileToString(shard_path).value();
  bytes[100] ^= 1;
  auto corrupt = AtomicFile::Create(shard_path, "test file");
  ASSERT_TRUE((*corrupt)->Append(bytes).ok());
  ASSERT_TRUE((*corrupt)->Commit().ok());
  verified = VerifyCheckpoint(root, "job-1/step-40");
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr(shard_path));

  auto garbage = AtomicFile::Create(ManifestPath(root, "job-1/step-40"), "test file");
  ASSERT_TRUE((*garbage)->Append("{not json").ok());
  ASSERT_TRUE((*garbage)->Commit().ok());
  EXPECT_THAT(ReadManifest(root, "job-1/step-40").status().message(),
              HasSubstr("manifest.json is damaged"));
}

}  // namespace
}  // namespace downpour
