// Checkpoints of a job's sparse embedding tables on a shard (issue 13): the
// capture of a SparseStore (SYNC at exactly the checkpoint's step, whoever
// copies the rows first; ASYNC at once), its restore, and the same through
// ParameterStore, the CheckpointWriter and the shard file.
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/checkpoint.h"
#include "ps/memory_budget.h"
#include "ps/parameter_store.h"
#include "ps/sparse_store.h"
#include "ps/sparse_store_fixture.h"
#include "ps/sparse_table.h"
#include "spec/checkpoint_files.h"
#include "spec/sparse_ids.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;
using namespace sparse_testing;  // NOLINT(build/namespaces): the fixture's helpers.

// emb/table takes the job's Adagrad (one slot per row), tags/table Adam
// (two): every kind of row state goes into the checkpoint.
JobSpec TrainedSpec(ConsistencySpec::Mode mode, int num_workers) {
  JobSpec spec = Spec(mode, num_workers, "optimizer { kind: ADAM learning_rate: 0.1 }");
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
  return spec;
}

// Rank `rank`'s rows of `step`: four of emb/table (overlapping the other
// ranks' and the other steps'), two of tags/table, gradients that differ by
// rank, step and row.
std::vector<Rows> StepRows(int rank, int64_t step) {
  std::vector<Rows> rows(2);
  rows[0].table = 0;
  rows[0].ids = RowsOf(0, 4, step * 3 + rank);
  rows[1].table = 1;
  rows[1].ids = RowsOf(0, 2, (step + rank) % 10);
  for (Rows& r : rows) {
    const int64_t dim = kDim[r.table];
    for (size_t k = 0; k < r.ids.size() * dim; ++k) {
      r.grads.push_back(0.25f * static_cast<float>((rank + 1) * (k + 1)) - 0.1f * step);
    }
  }
  return rows;
}

// Bit for bit.
template <typename T>
bool Same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void ExpectSameRows(const std::vector<SparseTableSnapshot>& got,
                    const std::vector<SparseTable::Snapshot>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    SCOPED_TRACE(kTableName[t]);
    EXPECT_EQ(got[t].name, kTableName[t]);
    EXPECT_EQ(got[t].dim, want[t].dim);
    EXPECT_EQ(got[t].slots, want[t].slots);
    EXPECT_EQ(got[t].ids, want[t].ids);
    EXPECT_TRUE(Same(got[t].values, want[t].values));
    EXPECT_TRUE(Same(got[t].slot_values, want[t].slot_values));
    EXPECT_EQ(got[t].updates, want[t].updates);
    EXPECT_EQ(got[t].touches, want[t].touches);
  }
}

void ExpectSameRows(const std::vector<SparseTable::Snapshot>& got,
                    const std::vector<SparseTable::Snapshot>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    SCOPED_TRACE(kTableName[t]);
    EXPECT_EQ(got[t].ids, want[t].ids);
    EXPECT_TRUE(Same(got[t].values, want[t].values));
    EXPECT_TRUE(Same(got[t].slot_values, want[t].slot_values));
    EXPECT_EQ(got[t].updates, want[t].updates);
  }
}

// The captures a store hands over.
struct Captured {
  int calls = 0;
  absl::StatusOr<std::shared_ptr<SparseCapture>> capture = absl::UnknownError("none yet");
  SparseStore::CapturedFn Fn() {
    return [this](absl::StatusOr<std::shared_ptr<SparseCapture>> c) {
      ++calls;
      capture = std::move(c);
    };
  }
};

class SparseStoreCheckpointTest : public ::testing::Test {
 protected:
  std::unique_ptr<SparseStore> Make(const JobSpec& spec, MemoryBudget* budget = nullptr) {
    auto store = SparseStore::Create(kJob, spec, 0, budget,
                                     [](const std::string& why) { ADD_FAILURE() << why; });
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  static void PushTo(SparseStore& store, const PushRequest& request) {
    Payload payload;
    payload.Append(request.payload().data(), request.payload().size());
    size_t end = 0;
    auto pieces = store.ParsePush(request, payload, 0, &end);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    auto pushed = store.Push(request, payload, *pieces);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
  }
  // Both ranks' pushes of `step`, rank 1 first.
  static void Step(SparseStore& store, int64_t step) {
    for (int rank : {1, 0}) PushTo(store, MakePush(rank, step + 1, step, StepRows(rank, step)));
  }
};

// SYNC: a capture asked for at step 2 while the tables are at 1 is handed
// over when step 1 completes, and holds the tables as they were at version
// 2, byte for byte, though step 2 is applied before the rows are taken (the
// push applying it copies them first) or after (the taker copies them).
TEST_F(SparseStoreCheckpointTest, SyncCaptureHoldsTheTablesAtItsStep) {
  for (bool taken_first : {false, true}) {
    SCOPED_TRACE(taken_first ? "taken before step 2" : "step 2 first");
    std::unique_ptr<SparseStore> store = Make(TrainedSpec(ConsistencySpec::SYNC, 2));
    Step(*store, 0);
    Captured captured;
    store->CaptureAt(2, captured.Fn());
    PushTo(*store, MakePush(0, 2, 1, StepRows(0, 1)));
    EXPECT_EQ(captured.calls, 0);  // Step 1 waits for rank 1.
    PushTo(*store, MakePush(1, 2, 1, StepRows(1, 1)));
    ASSERT_EQ(captured.calls, 1);
    ASSERT_TRUE(captured.capture.ok()) << captured.capture.status();
    EXPECT_EQ((*captured.capture)->version(), 2);
    const std::vector<SparseTable::Snapshot> at_step = store->Snapshot();

    ShardSnapshot info;
    if (taken_first) (*captured.capture)->Take(&info, /*keep=*/true);
    Step(*store, 2);
    EXPECT_FALSE(Same(store->Snapshot()[0].values, at_step[0].values));  // Trained on.
    ShardSnapshot later;
    (*captured.capture)->Take(&later, /*keep=*/false);
    EXPECT_TRUE(later.has_sparse);
    EXPECT_EQ(later.sparse_version, 2);
    ExpectSameRows(later.sparse_tables, at_step);
    if (taken_first) ExpectSameRows(info.sparse_tables, at_step);
    EXPECT_EQ(at_step[1].slots, 2);  // Adam's m and v are in it.
    EXPECT_EQ(at_step[0].slots, 1);
  }
}

TEST_F(SparseStoreCheckpointTest, SyncCaptureAtOrPastTheTablesVersion) {
  std::unique_ptr<SparseStore> store = Make(TrainedSpec(ConsistencySpec::SYNC, 2));
  Step(*store, 0);
  Captured now;
  store->CaptureAt(1, now.Fn());  // The tables are at 1: at once.
  ASSERT_EQ(now.calls, 1);
  ASSERT_TRUE(now.capture.ok());
  EXPECT_EQ((*now.capture)->version(), 1);
  Captured late;
  store->CaptureAt(0, late.Fn());
  ASSERT_EQ(late.calls, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(late.capture.status()));
  EXPECT_THAT(late.capture.status().message(),
              HasSubstr("the sparse tables are already at version 1, past the checkpoint's "
                        "step 0"));
  // A capture nobody holds any more is not copied by the next step.
  now.capture = absl::UnknownError("dropped");
  Step(*store, 1);
  EXPECT_EQ(store->version(), 2);
}

// ASYNC/SSP: at once, at the tables' version (pushes received); later
// pushes do not reach it.
TEST_F(SparseStoreCheckpointTest, AsyncCaptureIsTakenAtOnce) {
  std::unique_ptr<SparseStore> store = Make(TrainedSpec(ConsistencySpec::ASYNC, 2));
  PushTo(*store, MakePush(0, 1, 0, StepRows(0, 0)));
  PushTo(*store, MakePush(1, 1, 0, StepRows(1, 0)));
  PushTo(*store, MakePush(0, 2, 1, StepRows(0, 1)));
  const std::vector<SparseTable::Snapshot> now = store->Snapshot();
  Captured captured;
  store->CaptureAt(7, captured.Fn());
  ASSERT_EQ(captured.calls, 1);
  ASSERT_TRUE(captured.capture.ok());
  EXPECT_EQ((*captured.capture)->version(), 3);
  PushTo(*store, MakePush(1, 2, 1, StepRows(1, 1)));
  ShardSnapshot info;
  (*captured.capture)->Take(&info, /*keep=*/false);
  EXPECT_EQ(info.sparse_version, 3);
  ExpectSameRows(info.sparse_tables, now);
}

// A restored store holds the captured rows byte for byte (touch counts
// too), continues at the captured step, and trains on to the same bits as
// the store it was captured from.
TEST_F(SparseStoreCheckpointTest, RestoreContinuesWhereTheCaptureWas) {
  const JobSpec spec = TrainedSpec(ConsistencySpec::SYNC, 2);
  std::unique_ptr<SparseStore> store = Make(spec);
  Step(*store, 0);
  Step(*store, 1);
  Captured captured;
  store->CaptureAt(2, captured.Fn());
  ASSERT_TRUE(captured.capture.ok());
  ShardSnapshot info;
  info.step = 2;
  (*captured.capture)->Take(&info, /*keep=*/false);

  std::unique_ptr<SparseStore> restored = Make(spec);
  absl::Status status = restored->Restore(info);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(restored->version(), 2);
  ExpectSameRows(info.sparse_tables, restored->Snapshot());
  EXPECT_TRUE(restored->CheckStep(2).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(restored->CheckStep(3)));
  Step(*store, 2);
  Step(*restored, 2);
  ExpectSameRows(restored->Snapshot(), store->Snapshot());
}

// A checkpoint written before checkpoints held the tables: the rows start
// afresh, at the checkpoint's version (SYNC: its step; ASYNC: its
// partitions' highest).
TEST_F(SparseStoreCheckpointTest, OldCheckpointWithoutTablesStartsTheRowsAfresh) {
  ShardSnapshot old;
  old.step = 5;
  std::unique_ptr<SparseStore> sync = Make(TrainedSpec(ConsistencySpec::SYNC, 2));
  Step(*sync, 0);
  ASSERT_TRUE(sync->Restore(old).ok());
  EXPECT_EQ(sync->version(), 5);
  for (const SparseTable::Snapshot& table : sync->Snapshot()) EXPECT_TRUE(table.ids.empty());
  EXPECT_TRUE(sync->CheckStep(5).ok());

  PartitionSnapshot p;
  p.version = 12;
  old.partitions = {p, PartitionSnapshot()};
  std::unique_ptr<SparseStore> async = Make(TrainedSpec(ConsistencySpec::ASYNC, 2));
  ASSERT_TRUE(async->Restore(old).ok());
  EXPECT_EQ(async->version(), 12);
}

// Rows without optimizer state (a new job's initial weights, written by
// control/export.h): the values are restored, the state starts afresh.
TEST_F(SparseStoreCheckpointTest, RowsWithoutOptimizerStateStartItAfresh) {
  const JobSpec spec = TrainedSpec(ConsistencySpec::SYNC, 2);
  ShardSnapshot initial;
  initial.has_sparse = true;
  for (int t = 0; t < 2; ++t) {
    SparseTableSnapshot table;
    table.name = kTableName[t];
    table.dim = kDim[t];
    table.ids = RowsOf(0, 3);
    if (t == 1) table.ids.resize(1);  // tags/table's vocabulary is 50.
    table.values.assign(table.ids.size() * kDim[t], 0.75f);
    table.updates.assign(table.ids.size(), 0);
    table.touches.assign(table.ids.size(), 1);
    initial.sparse_tables.push_back(std::move(table));
  }
  std::unique_ptr<SparseStore> store = Make(spec);
  absl::Status status = store->Restore(initial);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<SparseTable::Snapshot> rows = store->Snapshot();
  EXPECT_EQ(rows[0].ids, initial.sparse_tables[0].ids);
  EXPECT_EQ(rows[0].values, initial.sparse_tables[0].values);
  EXPECT_EQ(rows[0].slot_values, std::vector<float>(3 * 4, 0.f));  // Adagrad's.
  EXPECT_EQ(rows[1].slot_values, std::vector<float>(2 * 2, 0.f));  // Adam's m and v.
  EXPECT_EQ(store->version(), 0);
}

TEST_F(SparseStoreCheckpointTest, RestoreRefusesWhatIsNotTheJobs) {
  const JobSpec spec = TrainedSpec(ConsistencySpec::SYNC, 2);
  std::unique_ptr<SparseStore> store = Make(spec);
  Step(*store, 0);
  Captured captured;
  store->CaptureAt(1, captured.Fn());
  ASSERT_TRUE(captured.capture.ok());
  ShardSnapshot good;
  good.step = 1;
  (*captured.capture)->Take(&good, /*keep=*/true);

  auto refused = [&](ShardSnapshot snapshot, absl::StatusCode code, const std::string& says) {
    std::unique_ptr<SparseStore> fresh = Make(spec);
    absl::Status status = fresh->Restore(snapshot);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(status.message(), HasSubstr(says));
    EXPECT_EQ(fresh->version(), 0);
  };
  ShardSnapshot missing = good;
  missing.sparse_tables.pop_back();
  refused(missing, absl::StatusCode::kInvalidArgument,
          "restoring job job-s from step 1: the checkpoint has no sparse table tags/table");
  ShardSnapshot unknown = good;
  unknown.sparse_tables[1].name = "other/table";
  refused(unknown, absl::StatusCode::kInvalidArgument,
          "the checkpoint's sparse table other/table is not the job's");
  ShardSnapshot other_shard = good;
  const int64_t theirs = RowsOf(1, 1, good.sparse_tables[0].ids.back() + 1)[0];
  SparseTableSnapshot& emb = other_shard.sparse_tables[0];
  emb.ids.push_back(theirs);
  emb.values.resize(emb.values.size() + 4);
  emb.slot_values.resize(emb.slot_values.size() + 4);
  emb.updates.push_back(1);
  emb.touches.push_back(1);
  refused(other_shard, absl::StatusCode::kInvalidArgument,
          absl::StrCat("row ", theirs, " of table emb/table belongs to shard 1, not 0"));
  ShardSnapshot shape = good;
  shape.sparse_tables[1].slots = 1;
  shape.sparse_tables[1].slot_values.resize(shape.sparse_tables[1].slot_values.size() / 2);
  refused(shape, absl::StatusCode::kInvalidArgument, "sparse table tags/table");

  // Rows past the shard's memory limit: refused naming the table.
  std::unique_ptr<SparseStore> big = Make(spec);
  std::vector<int64_t> ids = RowsOf(0, 300);
  PushTo(*big, MakePush(0, 1, 0, {{0, ids, std::vector<float>(ids.size() * 4, 1.f)}}));
  PushTo(*big, MakePush(1, 1, 0, {}));
  Captured full;
  big->CaptureAt(1, full.Fn());
  ASSERT_TRUE(full.capture.ok());
  ShardSnapshot rows;
  (*full.capture)->Take(&rows, /*keep=*/false);
  int64_t empty_bytes = 0;
  {
    MemoryBudget probe(0);
    std::unique_ptr<SparseStore> empty = Make(spec, &probe);
    empty_bytes = probe.used();
  }
  MemoryBudget small(empty_bytes + 4096);
  std::unique_ptr<SparseStore> bounded = Make(spec, &small);
  absl::Status status = bounded->Restore(rows);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("table emb/table"));
  EXPECT_THAT(status.message(), HasSubstr("--memory_limit"));
}

// Through ParameterStore, the writer and the shard file: a SYNC job with
// partitions and tables on this shard checkpoints at step 2 while step 2 is
// pushed; a fresh store restored from the file answers as the original did
// at step 2 and trains on to the same rows and partitions.
constexpr int64_t kWeight = 16, kBias = 2;

PushRequest DenseAndRows(int rank, int64_t step, int64_t checkpoint_step = 0) {
  PushRequest request = MakePush(rank, step + 1, step, StepRows(rank, step));
  std::string rows = request.payload();
  std::string dense;
  for (int t = 0; t < 2; ++t) {
    const int64_t n = t == 0 ? kWeight : kBias;
    PartitionHeader* header = request.add_partitions();
    header->mutable_key()->set_tensor_id(t);
    header->set_dtype(FLOAT32);
    header->set_num_elements(n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = 0.01f * static_cast<float>((i + 1) * (rank + 1)) - 0.02f * step;
      dense.append(reinterpret_cast<const char*>(&g), sizeof(float));
    }
  }
  request.set_payload(dense + rows);
  request.set_checkpoint_step(checkpoint_step);
  return request;
}

// What a pull of every row the steps touch and both partitions answers.
std::string Answer(ParameterStore& store, int64_t min_version) {
  PullRequest pull = MakePull(0, RowsOf(0, 12));
  pull.set_min_version(min_version);
  pull.set_sparse_read_only(true);
  SparseRows* tags = pull.add_sparse();
  tags->set_table(1);
  for (int64_t id : RowsOf(0, 6)) tags->add_ids(id);
  for (int t = 0; t < 2; ++t) pull.add_keys()->set_tensor_id(t);
  absl::StatusOr<PullResponse> response = store.Pull(pull, Soon());
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? response->payload() : "";
}

TEST(ParameterStoreSparseCheckpointTest, WrittenAndRestoredThroughTheShardFile) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/sparse_checkpoint");
  ASSERT_TRUE(RemoveAll(root).ok());
  const JobSpec spec = TrainedSpec(ConsistencySpec::SYNC, 2);
  CheckpointWriter writer(root);
  ParameterStore store;
  store.SetCheckpointSink([&writer](ShardCapture c) { writer.Write(std::move(c)); });
  ASSERT_TRUE(store.AddJob(kJob, spec, 0, Placements(0), /*attempt=*/1).ok());
  for (int64_t step = 0; step < 2; ++step) {
    for (int rank : {0, 1}) {
      auto pushed = store.Push(DenseAndRows(rank, step, step == 1 && rank == 0 ? 2 : 0));
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
  }
  const std::string at_step = Answer(store, 2);
  for (int rank : {1, 0}) ASSERT_TRUE(store.Push(DenseAndRows(rank, 2)).ok());
  const std::string after = Answer(store, 3);
  writer.Drain();
  const std::vector<CheckpointPart> parts = writer.Parts();
  ASSERT_EQ(parts.size(), 1u);
  ASSERT_TRUE(parts[0].error().empty()) << parts[0].error();
  EXPECT_EQ(parts[0].file().min_version(), 2);
  const std::string path = absl::StrCat(root, "/", CheckpointDir(kJob, 2), "/", ShardFileName(0));
  absl::StatusOr<ShardSnapshot> snapshot = ReadShardSnapshot(path, parts[0].file());
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->has_sparse);
  EXPECT_EQ(snapshot->sparse_version, 2);
  ASSERT_EQ(snapshot->sparse_tables.size(), 2u);
  EXPECT_EQ(snapshot->sparse_tables[0].name, "emb/table");
  // Only the rows pushed exist: emb/table's of steps 0 and 1.
  std::set<int64_t> pushed;
  for (int64_t step : {0, 1}) {
    for (int rank : {0, 1}) {
      const std::vector<Rows> rows = StepRows(rank, step);
      pushed.insert(rows[0].ids.begin(), rows[0].ids.end());
    }
  }
  EXPECT_EQ(snapshot->sparse_tables[0].ids, std::vector<int64_t>(pushed.begin(), pushed.end()));

  ParameterStore restored;
  ASSERT_TRUE(restored.AddJob(kJob, spec, 0, Placements(0), /*attempt=*/2).ok());
  absl::Status status = restored.Restore(kJob, *snapshot);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Answer(restored, 2), at_step);
  for (int rank : {0, 1}) {
    PushRequest push = DenseAndRows(rank, 2);
    push.set_attempt(2);
    ASSERT_TRUE(restored.Push(push).ok());
  }
  EXPECT_EQ(Answer(restored, 3), after);

  // One flipped bit in the tables' bytes (the file's last) is refused,
  // naming the file.
  std::string bytes = ReadFileToString(path).value();
  bytes[bytes.size() - 12] ^= 0x10;
  auto changed = AtomicFile::Create(path, "test file");
  ASSERT_TRUE((*changed)->Append(bytes).ok());
  ASSERT_TRUE((*changed)->Commit().ok());
  absl::StatusOr<ShardSnapshot> damaged = ReadShardSnapshot(path, parts[0].file());
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr(path));
}

// A job whose shard holds no partition of it checkpoints its tables alone;
// an ASYNC one at once, on the marked push.
TEST(ParameterStoreSparseCheckpointTest, TablesAloneAndAsync) {
  for (ConsistencySpec::Mode mode : {ConsistencySpec::SYNC, ConsistencySpec::ASYNC}) {
    SCOPED_TRACE(ConsistencySpec::Mode_Name(mode));
    std::vector<ShardSnapshot> captures;
    ParameterStore store;
    store.SetCheckpointSink([&captures](ShardCapture c) {
      c.Detach();
      captures.push_back(c.Copy());
    });
    ASSERT_TRUE(store.AddJob(kJob, TrainedSpec(mode, 2), 0, Placements(1)).ok());
    for (int rank : {0, 1}) ASSERT_TRUE(store.Push(MakePush(rank, 1, 0, StepRows(rank, 0))).ok());
    PushRequest marked = MakePush(0, 2, 1, StepRows(0, 1));
    marked.set_checkpoint_step(2);
    ASSERT_TRUE(store.Push(marked).ok());
    EXPECT_EQ(captures.size(), mode == ConsistencySpec::SYNC ? 0u : 1u);
    ASSERT_TRUE(store.Push(MakePush(1, 2, 1, StepRows(1, 1))).ok());
    ASSERT_EQ(captures.size(), 1u);
    EXPECT_TRUE(captures[0].error.empty()) << captures[0].error;
    EXPECT_TRUE(captures[0].partitions.empty());
    EXPECT_TRUE(captures[0].has_sparse);
    // SYNC: step 2; ASYNC: the two pushes before the marked one.
    EXPECT_EQ(captures[0].sparse_version, 2);
    EXPECT_EQ(captures[0].sparse_tables.size(), 2u);
  }
}

}  // namespace
}  // namespace downpour
