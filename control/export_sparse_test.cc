// Export and import of sparse embedding tables (issue 13): a table's rows,
// gathered from every shard's part of a checkpoint, become "<layer>.ids"
// and "<layer>.weight" in id order; a new job's initial weights split them
// over its shards.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "control/checkpoints.h"
#include "control/export.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "spec/checkpoint_files.h"
#include "spec/job_validation.h"
#include "spec/model_shape.h"
#include "spec/shard_map.h"
#include "spec/sparse_ids.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;

constexpr int kShards = 2;
constexpr int64_t kDim = 3;

// Two dense features and a sparse embedding (dim 3, vocabulary 1000) into a
// dense layer: fc/weight [5, 2], fc/bias [2].
JobSpec CtrSpec() {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        name: "ctr"
        model {
          num_classes: 2
          inputs {
            name: "x"
            features: [ "a", "b" ]
          }
          inputs { name: "c" kind: SPARSE }
          layer {
            name: "emb"
            inputs: "c"
            embedding { sparse: true vocab_size: 1000 dim: 3 }
          }
          layer {
            name: "joined"
            inputs: [ "x", "emb" ]
            concat {}
          }
          layer {
            name: "fc"
            dense { units: 2 }
          }
          layer {
            name: "loss"
            softmax_cross_entropy {}
          }
        }
        dataset { train_files: "x" test_files: "x" batch_size: 1 }
        optimizer { kind: ADAM learning_rate: 0.1 }
        num_workers: 1
        num_shards: 2
        steps: 1
      )pb",
      &spec));
  ApplyJobDefaults(&spec);
  return spec;
}

// Row `id`'s values in the tests.
std::vector<float> RowOf(int64_t id) {
  return {static_cast<float>(id), 0.5f, -static_cast<float>(id) / 8};
}

class ExportSparseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/export_sparse_test";
    ASSERT_TRUE(RemoveAll(root_).ok());
    ASSERT_TRUE(MakeDirs(root_).ok());
  }

  // A checkpoint at step 7 of job `job_id` whose shard k holds the rows
  // `rows[k]` of emb/table (with Adam's slots), or no tables at all when
  // `with_tables` is false (a file written before checkpoints held them).
  CheckpointRestore Checkpoint(const std::string& job_id,
                               const std::vector<std::vector<int64_t>>& rows,
                               bool with_tables = true) {
    const JobSpec spec = CtrSpec();
    const ModelShape shape = InferModel(spec.model()).value();
    const std::vector<PartitionPlacement> placed =
        PlacePartitions(shape.params, kShards, spec.partition_bytes()).value();
    const std::string dir = absl::StrCat(root_, "/", CheckpointDir(job_id, 7));
    EXPECT_TRUE(MakeDirs(dir).ok());
    CheckpointParts parts;
    parts.step = 7;
    for (int shard = 0; shard < kShards; ++shard) {
      ShardSnapshot snapshot;
      snapshot.job_id = job_id;
      snapshot.shard = shard;
      snapshot.step = 7;
      snapshot.worker_steps = {7};
      for (const PartitionPlacement& p : placed) {
        if (p.shard() != shard) continue;
        PartitionSnapshot part;
        part.tensor_id = p.tensor_id();
        part.partition = p.partition();
        part.offset = p.offset();
        part.values.assign(p.num_elements(), 0.25f);
        snapshot.partitions.push_back(std::move(part));
      }
      snapshot.has_sparse = with_tables;
      snapshot.sparse_version = 7;
      if (with_tables) {
        SparseTableSnapshot table;
        table.name = "emb/table";
        table.dim = kDim;
        table.slots = 2;
        table.ids = rows[shard];
        for (int64_t id : table.ids) {
          const std::vector<float> row = RowOf(id);
          table.values.insert(table.values.end(), row.begin(), row.end());
          table.updates.push_back(3);
          table.touches.push_back(4);
        }
        table.slot_values.assign(table.values.size() * 2, 9.f);
        snapshot.sparse_tables.push_back(std::move(table));
      }
      const std::string name = ShardFileName(shard);
      auto written = WriteShardSnapshot(absl::StrCat(dir, "/", name), snapshot);
      EXPECT_TRUE(written.ok()) << written.status();
      CheckpointFile file;
      file.set_name(name);
      file.set_shard(shard);
      file.set_bytes(written->bytes);
      file.set_crc32c(written->crc32c);
      parts.shard_files.push_back(file);
    }
    const double scale = 0;
    parts.worker_state =
        SerializeSafetensors({{kLossScaleTensor, TensorDtype::kF64, {}, &scale}}, {}).value();
    JobStatus job;
    job.set_id(job_id);
    *job.mutable_spec() = spec;
    auto info = CommitCheckpoint(root_, job, parts, 1);
    EXPECT_TRUE(info.ok()) << info.status();
    std::vector<std::string> refused;
    auto restore = CompleteCheckpoint(root_, {*info}, 0, &refused);
    EXPECT_TRUE(restore.ok()) << restore.status();
    return *restore;
  }

  std::string root_;
};

std::vector<int64_t> IdsIn(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsFile::Tensor t = file.Get(name).value();
  EXPECT_EQ(t.dtype, TensorDtype::kI64);
  std::vector<int64_t> ids(t.data.size() / sizeof(int64_t));
  std::memcpy(ids.data(), t.data.data(), t.data.size());
  return ids;
}

std::vector<float> FloatsIn(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsFile::Tensor t = file.Get(name).value();
  EXPECT_EQ(t.dtype, TensorDtype::kF32);
  std::vector<float> values(t.data.size() / sizeof(float));
  std::memcpy(values.data(), t.data.data(), t.data.size());
  return values;
}

// Rows of both shards, each shard's own in its file, come out as one table
// in id order, in both layouts, without optimizer state.
TEST_F(ExportSparseTest, RowsOfEveryShardAreGatheredInIdOrder) {
  std::vector<std::vector<int64_t>> rows(kShards);
  std::vector<int64_t> all;
  for (int64_t id : {900, 3, 41, 17, 0, 512, 999, 8}) {
    rows[SparseShardOf(id, kShards)].push_back(id);
    all.push_back(id);
  }
  for (std::vector<int64_t>& shard : rows) std::sort(shard.begin(), shard.end());
  ASSERT_FALSE(rows[0].empty());
  ASSERT_FALSE(rows[1].empty());
  std::sort(all.begin(), all.end());
  const CheckpointRestore checkpoint = Checkpoint("a", rows);

  for (ExportLayout layout : {ExportLayout::kPyTorch, ExportLayout::kNative}) {
    const bool torch = layout == ExportLayout::kPyTorch;
    auto exported = ExportCheckpoint(root_, "a", CtrSpec(), checkpoint, layout);
    ASSERT_TRUE(exported.ok()) << exported.status();
    auto file = SafetensorsFile::Parse(*exported, "export").value();
    const std::string ids_name = torch ? "emb.ids" : "emb/ids";
    const std::string rows_name = torch ? "emb.weight" : "emb/table";
    EXPECT_EQ(IdsIn(file, ids_name), all);
    EXPECT_EQ(file.Get(ids_name)->shape, (std::vector<int64_t>{8}));
    EXPECT_EQ(file.Get(rows_name)->shape, (std::vector<int64_t>{8, kDim}));
    std::vector<float> expected;
    for (int64_t id : all) {
      const std::vector<float> row = RowOf(id);
      expected.insert(expected.end(), row.begin(), row.end());
    }
    EXPECT_EQ(FloatsIn(file, rows_name), expected);
    // The dense layer is there as before; nothing else of the table.
    EXPECT_TRUE(file.Get(torch ? "fc.weight" : "fc/weight").ok());
    for (const auto& [name, tensor] : file.tensors()) {
      EXPECT_FALSE(absl::StrContains(name, "slot")) << name;
    }
  }
}

// A checkpoint written before checkpoints held the tables exports them
// empty; a row in two shards' files is refused.
TEST_F(ExportSparseTest, OldCheckpointsExportNoRowsAndDuplicatesAreRefused) {
  const CheckpointRestore old = Checkpoint("old", {}, /*with_tables=*/false);
  auto exported = ExportCheckpoint(root_, "old", CtrSpec(), old, ExportLayout::kPyTorch);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto file = SafetensorsFile::Parse(*exported, "export").value();
  EXPECT_EQ(file.Get("emb.ids")->shape, (std::vector<int64_t>{0}));
  EXPECT_EQ(file.Get("emb.weight")->shape, (std::vector<int64_t>{0, kDim}));

  const CheckpointRestore twice = Checkpoint("twice", {{5, 6}, {6}});
  auto refused = ExportCheckpoint(root_, "twice", CtrSpec(), twice, ExportLayout::kPyTorch);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("row 6 of sparse table emb/table is in two shards' files"));
}

// A new job's initial weights: the rows go to the shards of the new job
// that hold them (SparseShardOf), without optimizer state, and export back
// as they came, in id order.
TEST_F(ExportSparseTest, InitialWeightsSplitTheRowsOverTheNewJobsShards) {
  const std::vector<int64_t> ids = {999, 4, 250, 17, 3, 640};
  std::vector<float> rows;
  for (int64_t id : ids) {
    const std::vector<float> row = RowOf(id);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const std::vector<float> weight(5 * 2, 0.5f), bias(2, -1.f);
  const int64_t n = static_cast<int64_t>(ids.size());
  auto weights_bytes =
      SerializeSafetensors({{"fc/weight", TensorDtype::kF32, {5, 2}, weight.data()},
                            {"fc/bias", TensorDtype::kF32, {2}, bias.data()},
                            {"emb.ids", TensorDtype::kI64, {n}, ids.data()},
                            {"emb.weight", TensorDtype::kF32, {n, kDim}, rows.data()}},
                           {});
  ASSERT_TRUE(weights_bytes.ok()) << weights_bytes.status();
  auto weights = SafetensorsFile::Parse(*weights_bytes, "weights").value();
  auto info = WriteInitialCheckpoint(root_, "init", CtrSpec(), weights, 1);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> refused;
  auto checkpoint = CompleteCheckpoint(root_, {*info}, 0, &refused);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  size_t held = 0;
  for (const CheckpointFile& f : checkpoint->files()) {
    auto snapshot =
        ReadShardSnapshot(absl::StrCat(root_, "/", checkpoint->dir(), "/", f.name()), f);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ASSERT_TRUE(snapshot->has_sparse);
    ASSERT_EQ(snapshot->sparse_tables.size(), 1u);
    const SparseTableSnapshot& table = snapshot->sparse_tables[0];
    EXPECT_TRUE(std::is_sorted(table.ids.begin(), table.ids.end()));
    for (int64_t id : table.ids) EXPECT_EQ(SparseShardOf(id, kShards), f.shard()) << id;
    EXPECT_EQ(table.slots, 0);
    EXPECT_EQ(table.updates, std::vector<int64_t>(table.ids.size(), 0));
    held += table.ids.size();
  }
  EXPECT_EQ(held, ids.size());

  auto exported = ExportCheckpoint(root_, "init", CtrSpec(), *checkpoint, ExportLayout::kPyTorch);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto file = SafetensorsFile::Parse(*exported, "export").value();
  std::vector<int64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(IdsIn(file, "emb.ids"), sorted);
  const std::vector<float> back = FloatsIn(file, "emb.weight");
  for (size_t k = 0; k < sorted.size(); ++k) {
    EXPECT_EQ(std::vector<float>(back.begin() + k * kDim, back.begin() + (k + 1) * kDim),
              RowOf(sorted[k]));
  }

  // Without the table the job starts it afresh; half of it, an id outside
  // the vocabulary or an id twice is refused naming the tensor.
  auto dense_only = SafetensorsFile::Parse(
      SerializeSafetensors({{"fc/weight", TensorDtype::kF32, {5, 2}, weight.data()},
                            {"fc/bias", TensorDtype::kF32, {2}, bias.data()}},
                           {})
          .value(),
      "dense");
  EXPECT_TRUE(WriteInitialCheckpoint(root_, "dense", CtrSpec(), *dense_only, 1).ok());
  auto refusal = [&](std::vector<TensorToWrite> sparse) {
    sparse.push_back({"fc/weight", TensorDtype::kF32, {5, 2}, weight.data()});
    sparse.push_back({"fc/bias", TensorDtype::kF32, {2}, bias.data()});
    auto bad = SafetensorsFile::Parse(SerializeSafetensors(sparse, {}).value(), "bad").value();
    absl::Status status = WriteInitialCheckpoint(root_, "bad", CtrSpec(), bad, 1).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    return std::string(status.message());
  };
  EXPECT_THAT(refusal({{"emb.ids", TensorDtype::kI64, {n}, ids.data()}}),
              HasSubstr("the initial weights have emb.ids but no emb.weight"));
  const std::vector<int64_t> outside = {3, 1000};
  EXPECT_THAT(refusal({{"emb/ids", TensorDtype::kI64, {2}, outside.data()},
                       {"emb/table", TensorDtype::kF32, {2, kDim}, rows.data()}}),
              HasSubstr("emb/ids holds id 1000, outside sparse table emb/table's vocabulary"));
  const std::vector<int64_t> repeated = {3, 3};
  EXPECT_THAT(refusal({{"emb.ids", TensorDtype::kI64, {2}, repeated.data()},
                       {"emb.weight", TensorDtype::kF32, {2, kDim}, rows.data()}}),
              HasSubstr("emb.ids holds id 3 twice"));
  EXPECT_THAT(refusal({{"emb.ids", TensorDtype::kI64, {2}, repeated.data()},
                       {"emb.weight", TensorDtype::kF32, {2, 2}, rows.data()}}),
              HasSubstr("emb.weight is F32 [2, 2]; the model's is F32 [2, 3]"));
}

}  // namespace
}  // namespace control
}  // namespace downpour
