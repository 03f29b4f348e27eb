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
  // No sparse tables: as a file written before checkpoints held them.
  EXPECT_FALSE(read->has_sparse);
  EXPECT_TRUE(read->sparse_tables.empty());
}

// Sample() with two sparse tables: Adam's (two slots) and SGD's (none, and
// no rows on this shard).
ShardSnapshot SampleWithTables() {
  ShardSnapshot s = Sample();
  s.has_sparse = true;
  s.sparse_version = 40;
  SparseTableSnapshot emb;
  emb.name = "emb/table";
  emb.dim = 2;
  emb.slots = 2;
  emb.ids = {3, 17, int64_t{1} << 40};
  emb.values = {0.5f, -0.5f, 1.f, 2.f, -3.f, 4.f};
  emb.slot_values = {1, 2, 3, 4, 5, 6, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  emb.updates = {1, 0, 39};
  emb.touches = {4, 1, 80};
  SparseTableSnapshot tags;
  tags.name = "tags/table";
  tags.dim = 3;
  s.sparse_tables = {emb, tags};
  return s;
}

CheckpointFile Expected(const WrittenFile& written) {
  CheckpointFile expected;
  expected.set_bytes(written.bytes);
  expected.set_crc32c(written.crc32c);
  return expected;
}

TEST(CheckpointTest, SparseTablesRoundTrip) {
  const std::string path = TempDir("sparse_round_trip") + "/" + ShardFileName(1);
  const ShardSnapshot s = SampleWithTables();
  auto written = WriteShardSnapshot(path, s);
  ASSERT_TRUE(written.ok()) << written.status();
  auto read = ReadShardSnapshot(path, Expected(*written));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->has_sparse);
  EXPECT_EQ(read->sparse_version, 40);
  ASSERT_EQ(read->sparse_tables.size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    const SparseTableSnapshot& a = s.sparse_tables[t];
    const SparseTableSnapshot& b = read->sparse_tables[t];
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.dim, a.dim);
    EXPECT_EQ(b.slots, a.slots);
    EXPECT_EQ(b.ids, a.ids);
    EXPECT_EQ(b.values, a.values);
    EXPECT_EQ(b.slot_values, a.slot_values);
    EXPECT_EQ(b.updates, a.updates);
    EXPECT_EQ(b.touches, a.touches);
  }
  EXPECT_EQ(read->partitions.size(), 2u);  // The dense part is as before.

  // A PyTorch-readable file: the rows are plain tensors.
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto values = file->Get("sparse/emb/table/values");
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(file->Get("sparse/emb/table/slot1")->dtype, TensorDtype::kF32);
  EXPECT_EQ(file->Get("sparse/emb/table/ids")->dtype, TensorDtype::kI64);

  // A table whose vectors do not match its ids is not written.
  ShardSnapshot bad = SampleWithTables();
  bad.sparse_tables[0].slot_values.pop_back();
  auto refused = WriteShardSnapshot(path + ".bad", bad);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("emb/table"));
}

// A table section cut short or changed is refused naming the file: by the
// manifest's size and CRC32C, and (a file whose CRC32C was recomputed) by
// its tensors' shapes.
TEST(CheckpointTest, DamagedSparseTablesAreRefusedNamingTheFile) {
  const std::string dir = TempDir("sparse_damaged");
  const std::string path = dir + "/" + ShardFileName(1);
  auto written = WriteShardSnapshot(path, SampleWithTables());
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string bytes = ReadFileToString(path).value();
  // The tables' bytes are the last of the file.
  for (size_t cut : {size_t{8}, size_t{60}}) {
    auto truncated = AtomicFile::Create(path, "test file");
    ASSERT_TRUE((*truncated)->Append(bytes.substr(0, bytes.size() - cut)).ok());
    ASSERT_TRUE((*truncated)->Commit().ok());
    auto read = ReadShardSnapshot(path, Expected(*written));
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(path));
  }
  std::string flipped = bytes;
  flipped[bytes.size() - 20] ^= 0x01;  // In the tables' counts.
  auto changed = AtomicFile::Create(path, "test file");
  ASSERT_TRUE((*changed)->Append(flipped).ok());
  ASSERT_TRUE((*changed)->Commit().ok());
  auto read = ReadShardSnapshot(path, Expected(*written));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("CRC32C"));

  // Consistent bytes, inconsistent tables: ids of 2 rows where the header
  // says 3; a tensor missing; a header line that does not parse.
  const int64_t ids[2] = {1, 2};
  const float values[6] = {};
  const int64_t counts[3] = {};
  struct Case {
    std::string sparse;
    std::vector<TensorToWrite> tensors;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"version 4\n3 2 0 emb/table",
       {{"sparse/emb/table/ids", TensorDtype::kI64, {2}, ids},
        {"sparse/emb/table/values", TensorDtype::kF32, {3, 2}, values},
        {"sparse/emb/table/updates", TensorDtype::kI64, {3}, counts},
        {"sparse/emb/table/touches", TensorDtype::kI64, {3}, counts}},
       "sparse table emb/table: tensor sparse/emb/table/ids is I64 [2], not I64 [3]"},
      {"version 4\n3 2 0 emb/table",
       {{"sparse/emb/table/values", TensorDtype::kF32, {3, 2}, values}},
       "sparse table emb/table has no tensor sparse/emb/table/ids"},
      {"version 4\n3 two 0 emb/table", {}, "bad sparse table line"},
      {"3 2 0 emb/table", {}, "does not start with the tables' version"},
  };
  for (const Case& c : cases) {
    std::vector<TensorToWrite> tensors = c.tensors;
    const int64_t steps[1] = {4};
    tensors.push_back({"worker_steps", TensorDtype::kI64, {1}, steps});
    auto made = WriteSafetensors(path, tensors,
                                 {{"job", "job-1"},
                                  {"shard", "1"},
                                  {"step", "4"},
                                  {"mode", "SYNC"},
                                  {"partitions", ""},
                                  {"requests", ""},
                                  {"sparse", c.sparse}});
    ASSERT_TRUE(made.ok()) << made.status();
    auto damaged = ReadShardSnapshot(path, Expected(*made));
    EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << c.says;
    EXPECT_THAT(damaged.status().message(), HasSubstr(absl::StrCat("checkpoint file ", path)));
    EXPECT_THAT(damaged.status().message(), HasSubstr(c.says));
  }
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
