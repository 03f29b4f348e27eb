#include "ps/sparse_table.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/memory_budget.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr char kTable[] = "clicks/table";
constexpr uint64_t kSeed = 42;
constexpr float kScale = 0.05f;

SparseTableOptions Options(int64_t dim = 4, OptimizerKind optimizer = OptimizerKind::kSgd,
                           int64_t max_rows = 0, EvictionPolicy eviction = EvictionPolicy::kLru) {
  SparseTableOptions options;
  options.name = kTable;
  options.dim = dim;
  options.optimizer = optimizer;
  options.hyper.beta1 = 0.8f;
  options.hyper.beta2 = 0.95f;
  options.hyper.epsilon = 1e-6f;
  options.init_scale = kScale;
  options.seed = kSeed;
  options.max_rows = max_rows;
  options.eviction = eviction;
  return options;
}

std::unique_ptr<SparseTable> MakeTable(const SparseTableOptions& options) {
  absl::StatusOr<std::unique_ptr<SparseTable>> table = SparseTable::Create(options);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(table).value() : nullptr;
}

std::vector<float> InitRow(int64_t id, int64_t dim = 4) {
  std::vector<float> row(dim);
  InitSparseRow(kSeed, kTable, id, kScale, dim, row.data());
  return row;
}

std::vector<float> LookupOk(SparseTable& table, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * table.dim(), std::nanf(""));
  absl::Status status = table.Lookup(ids.data(), static_cast<int64_t>(ids.size()), out.data());
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

void ApplyOk(SparseTable& table, const std::vector<int64_t>& ids, const std::vector<float>& grads,
             float learning_rate) {
  absl::Status status =
      table.Apply(ids.data(), static_cast<int64_t>(ids.size()), grads.data(), learning_rate);
  EXPECT_TRUE(status.ok()) << status;
}

std::vector<float> RowOf(const std::vector<float>& rows, size_t k, int64_t dim) {
  return std::vector<float>(rows.begin() + k * dim, rows.begin() + (k + 1) * dim);
}

std::vector<int64_t> IdsOf(const SparseTable& table) { return table.TakeSnapshot().ids; }

// Bit for bit, so that -0 and 0, or two NaNs, are told apart as they should.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameSnapshot(const SparseTable::Snapshot& a, const SparseTable::Snapshot& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_TRUE(SameBits(a.values, b.values));
  EXPECT_TRUE(SameBits(a.slot_values, b.slot_values));
  EXPECT_EQ(a.updates, b.updates);
  EXPECT_EQ(a.touches, b.touches);
}

TEST(InitSparseRowTest, InRangeDeterministicAndKeyedBySeedTableAndId) {
  std::vector<float> row = InitRow(7, 64);
  for (float v : row) {
    EXPECT_GE(v, -kScale);
    EXPECT_LE(v, kScale);
  }
  EXPECT_TRUE(SameBits(row, InitRow(7, 64)));
  EXPECT_GT(std::set<float>(row.begin(), row.end()).size(), 60u);
  EXPECT_FALSE(SameBits(row, InitRow(8, 64)));
  std::vector<float> other(64);
  InitSparseRow(kSeed + 1, kTable, 7, kScale, 64, other.data());
  EXPECT_FALSE(SameBits(row, other));
  InitSparseRow(kSeed, "views/table", 7, kScale, 64, other.data());
  EXPECT_FALSE(SameBits(row, other));
  // A shorter row is the start of the longer one: element i depends on i only.
  std::vector<float> shorter(16);
  InitSparseRow(kSeed, kTable, 7, kScale, 16, shorter.data());
  EXPECT_TRUE(SameBits(shorter, RowOf(row, 0, 16)));
}

TEST(SparseTableTest, CreateRefusesBadOptionsNamingTheTable) {
  SparseTableOptions bad_dim = Options(0);
  SparseTableOptions no_scale = Options();
  no_scale.init_scale = 0;
  SparseTableOptions negative_rows = Options(4, OptimizerKind::kSgd, -1);
  for (const SparseTableOptions& options : {bad_dim, no_scale, negative_rows}) {
    absl::StatusOr<std::unique_ptr<SparseTable>> table = SparseTable::Create(options);
    ASSERT_FALSE(table.ok());
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr(kTable));
  }
}

// Rows are created on first touch with InitSparseRow's values, whatever the
// order, the calls and the striping.
TEST(SparseTableTest, LazyRowsEqualInitSparseRowWhateverTheOrder) {
  const std::vector<int64_t> ids = {
      3, 1000, -7, 42, std::numeric_limits<int64_t>::min(), 0, std::numeric_limits<int64_t>::max()};
  std::unique_ptr<SparseTable> together = MakeTable(Options());
  std::unique_ptr<SparseTable> one_by_one = MakeTable(Options(4, OptimizerKind::kSgd, 50));
  std::vector<float> rows = LookupOk(*together, ids);
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_TRUE(SameBits(RowOf(rows, k, 4), InitRow(ids[k]))) << ids[k];
  }
  for (size_t k = ids.size(); k-- > 0;) {
    EXPECT_TRUE(SameBits(LookupOk(*one_by_one, {ids[k]}), InitRow(ids[k]))) << ids[k];
  }
  EXPECT_EQ(together->rows(), 7);
  EXPECT_EQ(one_by_one->rows(), 7);
  // Read again, they are the same rows.
  EXPECT_TRUE(SameBits(LookupOk(*together, ids), rows));
  EXPECT_EQ(together->rows(), 7);
}

TEST(SparseTableTest, RepeatedIdsInOneLookup) {
  std::unique_ptr<SparseTable> table = MakeTable(Options());
  std::vector<float> rows = LookupOk(*table, {5, 9, 5, 5, 9});
  EXPECT_EQ(table->rows(), 2);
  for (size_t k : {0, 2, 3}) EXPECT_TRUE(SameBits(RowOf(rows, k, 4), InitRow(5)));
  for (size_t k : {1, 4}) EXPECT_TRUE(SameBits(RowOf(rows, k, 4), InitRow(9)));
  SparseTable::Snapshot snapshot = table->TakeSnapshot();
  EXPECT_EQ(snapshot.ids, (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(snapshot.touches, (std::vector<int64_t>{3, 2}));
}

// Each row updates as a dense array of dim elements does under the CPU
// reference, with its own step count: row 11 is updated at every step, row
// 22 at every other, so their Adam bias corrections differ.
class SparseTableOptimizerTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(SparseTableOptimizerTest, RowsMatchTheReferenceUpdateBitForBit) {
  constexpr int64_t kDim = 5;  // Not a multiple of any vector width.
  SparseTableOptions options = Options(kDim, GetParam());
  options.hyper.weight_decay = 0.01f;
  std::unique_ptr<SparseTable> table = MakeTable(options);
  const int num_slots = NumOptimizerSlots(GetParam());

  struct Reference {
    std::vector<float> values;
    std::vector<std::vector<float>> slots;
    int64_t updates = 0;
  };
  std::map<int64_t, Reference> reference;
  for (int64_t id : {11, 22}) {
    reference[id].values = InitRow(id, kDim);
    reference[id].slots.assign(num_slots, std::vector<float>(kDim, 0.f));
  }
  std::mt19937 random(1);
  std::normal_distribution<float> normal;
  for (int step = 0; step < 7; ++step) {
    std::vector<int64_t> ids = {11};
    if (step % 2 == 0) ids.push_back(22);
    std::vector<float> grads(ids.size() * kDim);
    for (float& g : grads) g = normal(random);
    const float learning_rate = 0.1f / (step + 1);
    ApplyOk(*table, ids, grads, learning_rate);
    for (size_t k = 0; k < ids.size(); ++k) {
      Reference& row = reference[ids[k]];
      OptimizerHyperparams hyper = options.hyper;
      hyper.learning_rate = learning_rate;
      hyper.step = ++row.updates;
      float* slots[2] = {num_slots > 0 ? row.slots[0].data() : nullptr,
                         num_slots > 1 ? row.slots[1].data() : nullptr};
      kernels::cpu::ApplyOptimizer(GetParam(), hyper, &grads[k * kDim], kDim, row.values.data(),
                                   slots);
    }
  }
  SparseTable::Snapshot snapshot = table->TakeSnapshot();
  ASSERT_EQ(snapshot.ids, (std::vector<int64_t>{11, 22}));
  EXPECT_EQ(snapshot.updates, (std::vector<int64_t>{7, 4}));
  for (size_t k = 0; k < 2; ++k) {
    const Reference& row = reference[snapshot.ids[k]];
    EXPECT_TRUE(SameBits(RowOf(snapshot.values, k, kDim), row.values)) << snapshot.ids[k];
    for (int j = 0; j < num_slots; ++j) {
      EXPECT_TRUE(SameBits(RowOf(snapshot.slot_values, j * 2 + k, kDim), row.slots[j]))
          << snapshot.ids[k] << " slot " << j;
    }
  }
  EXPECT_FALSE(SameBits(reference[11].values, InitRow(11, kDim)));
  EXPECT_TRUE(SameBits(LookupOk(*table, {22}), reference[22].values));
}

INSTANTIATE_TEST_SUITE_P(Kinds, SparseTableOptimizerTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                                           OptimizerKind::kAdam));

// Below max_rows 128 a table is one stripe: eviction is exact.
TEST(SparseTableTest, LruEvictsTheLeastRecentlyTouched) {
  std::unique_ptr<SparseTable> table =
      MakeTable(Options(4, OptimizerKind::kSgd, 3, EvictionPolicy::kLru));
  for (int64_t id : {1, 2, 3}) LookupOk(*table, {id});
  LookupOk(*table, {1});
  LookupOk(*table, {4});
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(table->evictions(), 1);
  // An Apply touches too: 3 is now the most recent, 1 the least.
  ApplyOk(*table, {3}, {0, 0, 0, 0}, 0.1f);
  LookupOk(*table, {5});
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(table->evictions(), 2);
  EXPECT_EQ(table->rows(), 3);
}

TEST(SparseTableTest, LfuEvictsTheLeastOftenTouchedTiesLeastRecently) {
  std::unique_ptr<SparseTable> table =
      MakeTable(Options(4, OptimizerKind::kSgd, 3, EvictionPolicy::kLfu));
  LookupOk(*table, {1, 1, 1});
  LookupOk(*table, {2});
  LookupOk(*table, {3, 3});
  LookupOk(*table, {2});  // 2 is the most recent, but touched twice only.
  LookupOk(*table, {3});  // 1: 3 touches, 2: 2, 3: 3.
  LookupOk(*table, {4});
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{1, 3, 4}));
  // 4 is touched once more, but with 2 touches it still goes before 1 and 3.
  LookupOk(*table, {4});
  LookupOk(*table, {5});
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{1, 3, 5}));
  // Ties between 1 and 3 (3 touches each): 1 was touched less recently.
  LookupOk(*table, {5, 5, 5});
  LookupOk(*table, {6});
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{3, 5, 6}));
  EXPECT_EQ(table->evictions(), 3);
  EXPECT_EQ(table->TakeSnapshot().touches, (std::vector<int64_t>{3, 4, 1}));
}

// A table without max_rows never evicts: it keeps each row's touch count
// (which a checkpoint keeps) but no eviction order, and for LFU no
// frequency buckets, so its rows take the bytes an LRU table's do; with
// max_rows an LFU row holds its bucket node too.
TEST(SparseTableTest, ATableThatNeverEvictsCountsTouchesAndKeepsNoOrder) {
  std::unique_ptr<SparseTable> lfu =
      MakeTable(Options(4, OptimizerKind::kSgd, 0, EvictionPolicy::kLfu));
  std::unique_ptr<SparseTable> lru =
      MakeTable(Options(4, OptimizerKind::kSgd, 0, EvictionPolicy::kLru));
  for (SparseTable* table : {lfu.get(), lru.get()}) {
    LookupOk(*table, {1, 1, 1, 2});
    LookupOk(*table, {2, 3});
    EXPECT_EQ(table->TakeSnapshot().touches, (std::vector<int64_t>{3, 2, 1}));
    EXPECT_EQ(table->evictions(), 0);
  }
  EXPECT_EQ(lfu->bytes(), lru->bytes());
  std::unique_ptr<SparseTable> bounded_lfu =
      MakeTable(Options(4, OptimizerKind::kSgd, 1000, EvictionPolicy::kLfu));
  std::unique_ptr<SparseTable> bounded_lru =
      MakeTable(Options(4, OptimizerKind::kSgd, 1000, EvictionPolicy::kLru));
  LookupOk(*bounded_lfu, {1});
  LookupOk(*bounded_lru, {1});
  EXPECT_GT(bounded_lfu->bytes(), bounded_lru->bytes());
}

// A row the call reads is never the one evicted for a row it creates, even
// when it is the least recently touched and comes later in the call.
TEST(SparseTableTest, NeverEvictsARowTheSameCallReads) {
  std::unique_ptr<SparseTable> table = MakeTable(Options(4, OptimizerKind::kSgd, 3));
  LookupOk(*table, {1, 2, 3});
  ApplyOk(*table, {1}, {1, 1, 1, 1}, 1.f);
  const std::vector<float> trained = LookupOk(*table, {1});
  LookupOk(*table, {2, 3});  // 1 is now the least recently touched.
  std::vector<float> rows = LookupOk(*table, {4, 1, 2});
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_TRUE(SameBits(RowOf(rows, 1, 4), trained));
}

TEST(SparseTableTest, ACallTouchingMoreRowsThanAStripeHoldsFailsHavingCreatedNone) {
  std::unique_ptr<SparseTable> table = MakeTable(Options(4, OptimizerKind::kSgd, 3));
  LookupOk(*table, {1});
  std::vector<int64_t> ids = {2, 3, 4, 5};
  std::vector<float> out(16);
  absl::Status status = table->Lookup(ids.data(), 4, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "sparse table clicks/table: one call touches more rows than the 3 a stripe of it "
            "holds (max_rows 3 over 1 stripes); raise max_rows or send fewer distinct ids per "
            "call");
  // Row 1 was evicted for 4 (evictions are not undone); 2, 3 and 4 are gone again.
  EXPECT_EQ(table->rows(), 0);
  EXPECT_EQ(table->evictions(), 1);
  EXPECT_TRUE(IdsOf(*table).empty());
  EXPECT_TRUE(SameBits(LookupOk(*table, {2, 3, 4}), [] {
    std::vector<float> expected;
    for (int64_t id : {2, 3, 4}) {
      std::vector<float> row = InitRow(id);
      expected.insert(expected.end(), row.begin(), row.end());
    }
    return expected;
  }()));
}

// An evicted row touched again starts afresh: InitSparseRow's values, zero
// optimizer state and step count, whether a Lookup or an Apply recreates it.
TEST(SparseTableTest, AnEvictedRowTouchedAgainIsReinitialised) {
  constexpr int64_t kDim = 3;
  SparseTableOptions options = Options(kDim, OptimizerKind::kAdam, 2);
  std::unique_ptr<SparseTable> table = MakeTable(options);
  const std::vector<float> grads = {0.5f, -1.f, 2.f};
  ApplyOk(*table, {1}, grads, 0.1f);
  ApplyOk(*table, {1}, grads, 0.1f);
  EXPECT_FALSE(SameBits(LookupOk(*table, {1}), InitRow(1, kDim)));
  LookupOk(*table, {2});
  LookupOk(*table, {3});  // Evicts 1.
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(SameBits(LookupOk(*table, {1}), InitRow(1, kDim)));  // Evicts 2.
  SparseTable::Snapshot snapshot = table->TakeSnapshot();
  ASSERT_EQ(snapshot.ids, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(snapshot.updates[0], 0);
  EXPECT_TRUE(SameBits(RowOf(snapshot.slot_values, 0, kDim), {0, 0, 0}));
  EXPECT_TRUE(SameBits(RowOf(snapshot.slot_values, 2, kDim), {0, 0, 0}));

  // Apply recreates row 2 (evicted since it was read) and updates it as the
  // first step from its initial values.
  ApplyOk(*table, {2}, grads, 0.1f);
  std::vector<float> expected = InitRow(2, kDim);
  std::vector<float> m(kDim, 0.f);
  std::vector<float> v(kDim, 0.f);
  OptimizerHyperparams hyper = options.hyper;
  hyper.learning_rate = 0.1f;
  hyper.step = 1;
  kernels::cpu::AdamUpdate(hyper, grads.data(), kDim, expected.data(), m.data(), v.data());
  EXPECT_TRUE(SameBits(LookupOk(*table, {2}), expected));
  EXPECT_EQ(table->evictions(), 3);
}

TEST(SparseTableTest, MaxRowsIsHonoured) {
  std::unique_ptr<SparseTable> small = MakeTable(Options(4, OptimizerKind::kSgd, 100));
  for (int64_t batch = 0; batch < 100; ++batch) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < 10; ++k) ids.push_back(batch * 10 + k);
    LookupOk(*small, ids);
    EXPECT_LE(small->rows(), 100);
  }
  EXPECT_EQ(small->rows(), 100);
  EXPECT_EQ(small->evictions(), 900);

  // Split over 64 stripes (156 or 157 rows each): each fills its share.
  std::unique_ptr<SparseTable> large = MakeTable(Options(4, OptimizerKind::kSgd, 10000));
  for (int64_t batch = 0; batch < 100; ++batch) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < 500; ++k) ids.push_back(batch * 500 + k);
    LookupOk(*large, ids);
    EXPECT_LE(large->rows(), 10000);
  }
  EXPECT_EQ(large->rows(), 10000);
  EXPECT_EQ(large->evictions(), 40000);
  EXPECT_EQ(static_cast<int64_t>(IdsOf(*large).size()), 10000);
}

// A table that does not evict fails when the budget refuses, naming the limit
// and what the table holds, and the failed call leaves no row behind.
TEST(SparseTableTest, BudgetRefusalFailsWithNothingHalfDone) {
  MemoryBudget budget(400 * 1000);
  SparseTableOptions options = Options(16, OptimizerKind::kAdam);
  options.budget = &budget;
  std::unique_ptr<SparseTable> table = MakeTable(options);
  absl::Status status;
  int64_t next_id = 0;
  SparseTable::Snapshot before;
  while (status.ok()) {
    before = table->TakeSnapshot();
    std::vector<int64_t> ids;
    for (int k = 0; k < 200; ++k) ids.push_back(next_id++);
    std::vector<float> out(ids.size() * 16);
    status = table->Lookup(ids.data(), static_cast<int64_t>(ids.size()), out.data());
    ASSERT_LT(next_id, 100000) << "the budget never refused";
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "shard memory limit of 400000 bytes reached: table clicks/table holds " +
                std::to_string(table->rows()) + " rows (" + std::to_string(table->bytes()) +
                " bytes); raise --memory_limit, add shards or set max_rows on the table to evict");
  EXPECT_GT(budget.refusals(), 0);
  EXPECT_EQ(table->rows(), static_cast<int64_t>(before.ids.size()));
  ExpectSameSnapshot(table->TakeSnapshot(), before);
  EXPECT_EQ(table->evictions(), 0);
  // Every byte the table holds is reserved, and no more.
  EXPECT_EQ(budget.used(), table->bytes());
  EXPECT_LE(budget.used(), budget.limit());
  // Rows that exist are still served.
  LookupOk(*table, {before.ids.front(), before.ids.back()});
  table.reset();
  EXPECT_EQ(budget.used(), 0);
}

// A table with max_rows evicts when the budget refuses to let it grow.
TEST(SparseTableTest, EvictsUnderBudgetPressure) {
  SparseTableOptions options = Options(8, OptimizerKind::kSgd, 100);
  int64_t one_block = 0;
  {
    MemoryBudget unlimited(0);
    options.budget = &unlimited;
    std::unique_ptr<SparseTable> probe = MakeTable(options);
    LookupOk(*probe, {0});
    one_block = probe->bytes();
    EXPECT_EQ(unlimited.used(), one_block);
  }
  MemoryBudget budget(one_block);  // Room for the first block of 16 rows.
  options.budget = &budget;
  std::unique_ptr<SparseTable> table = MakeTable(options);
  for (int64_t id = 0; id < 50; ++id) LookupOk(*table, {id});
  EXPECT_EQ(table->rows(), 16);
  EXPECT_EQ(table->evictions(), 34);
  EXPECT_GT(budget.refusals(), 0);
  EXPECT_EQ(budget.used(), table->bytes());
  std::vector<int64_t> last;
  for (int64_t id = 34; id < 50; ++id) last.push_back(id);
  EXPECT_EQ(IdsOf(*table), last);
}

std::vector<float> PeekOk(const SparseTable& table, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * table.dim(), std::nanf(""));
  absl::Status status = table.Peek(ids.data(), static_cast<int64_t>(ids.size()), out.data());
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// A peek answers existing rows as they are and others as they would be
// created, and changes nothing: no row created or touched, no byte reserved.
TEST(SparseTableTest, PeekCreatesAndTouchesNothing) {
  MemoryBudget budget(0);
  SparseTableOptions options = Options(4, OptimizerKind::kAdam);
  options.budget = &budget;
  std::unique_ptr<SparseTable> table = MakeTable(options);
  LookupOk(*table, {1, 2, 3});
  ApplyOk(*table, {2}, {1, -1, 2, -2}, 0.1f);
  const std::vector<float> trained = LookupOk(*table, {2});
  const SparseTable::Snapshot before = table->TakeSnapshot();
  const int64_t used = budget.used();
  const int64_t bytes = table->bytes();

  // Ids repeat, exist or not, in any order.
  const std::vector<float> rows = PeekOk(*table, {2, 9, 1, 9, 1000000007});
  EXPECT_TRUE(SameBits(RowOf(rows, 0, 4), trained));
  EXPECT_TRUE(SameBits(RowOf(rows, 1, 4), InitRow(9)));
  EXPECT_TRUE(SameBits(RowOf(rows, 2, 4), InitRow(1)));
  EXPECT_TRUE(SameBits(RowOf(rows, 3, 4), InitRow(9)));
  EXPECT_TRUE(SameBits(RowOf(rows, 4, 4), InitRow(1000000007)));
  EXPECT_EQ(table->rows(), 3);
  EXPECT_EQ(table->bytes(), bytes);
  EXPECT_EQ(budget.used(), used);
  ExpectSameSnapshot(table->TakeSnapshot(), before);  // Touch counts included.
  EXPECT_TRUE(table->Peek(nullptr, 0, nullptr).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(table->Peek(nullptr, -1, nullptr)));
}

// Apply's `before` holds each row as Peek read it before the call (a row
// created by the call: as created), in the order of the ids, and the update
// is the same with or without it.
TEST(SparseTableTest, ApplyWritesEachRowAsItWasBeforeItsUpdate) {
  std::unique_ptr<SparseTable> table = MakeTable(Options(4, OptimizerKind::kAdam));
  std::unique_ptr<SparseTable> plain = MakeTable(Options(4, OptimizerKind::kAdam));
  for (SparseTable* t : {table.get(), plain.get()}) {
    LookupOk(*t, {1, 2, 3});
    ApplyOk(*t, {2}, {1, -1, 2, -2}, 0.1f);
  }
  // Row 7 does not exist yet; 2 has been updated once.
  const std::vector<int64_t> ids = {3, 7, 2};
  const std::vector<float> peeked = PeekOk(*table, ids);
  const std::vector<float> grads = {0.5f, 1, -1, 2, 3, -3, 0.25f, 1, -2, 1, 1, 4};
  std::vector<float> before(ids.size() * 4, std::nanf(""));
  ASSERT_TRUE(table->Apply(ids.data(), 3, grads.data(), 0.01f, before.data()).ok());
  EXPECT_TRUE(SameBits(before, peeked));
  ApplyOk(*plain, ids, grads, 0.01f);
  EXPECT_TRUE(SameBits(LookupOk(*table, ids), LookupOk(*plain, ids)));
}

// A full table peeked at evicts nothing, and its eviction order is as it
// was: a peek is no touch.
TEST(SparseTableTest, PeekAtAFullTableEvictsNothing) {
  std::unique_ptr<SparseTable> table = MakeTable(Options(4, OptimizerKind::kSgd, 3));
  LookupOk(*table, {1, 2, 3});
  const std::vector<float> rows = PeekOk(*table, {1, 4, 5, 6});
  EXPECT_TRUE(SameBits(RowOf(rows, 1, 4), InitRow(4)));
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(table->evictions(), 0);
  LookupOk(*table, {7});  // 1 is still the least recently touched.
  EXPECT_EQ(IdsOf(*table), (std::vector<int64_t>{2, 3, 7}));

  // A table that does not evict, at its memory limit: a peek still answers.
  MemoryBudget budget(0);
  SparseTableOptions options = Options(4);
  options.budget = &budget;
  std::unique_ptr<SparseTable> bounded = MakeTable(options);
  LookupOk(*bounded, {1});
  MemoryBudget full(bounded->bytes());
  options.budget = &full;
  bounded = MakeTable(options);
  std::vector<int64_t> ids;
  absl::Status created;
  for (int64_t id = 0; created.ok(); ++id) {
    std::vector<float> out(4);
    created = bounded->Lookup(&id, 1, out.data());
    ids.push_back(id + 1000);
  }
  ASSERT_TRUE(absl::IsResourceExhausted(created)) << created;
  const int64_t refusals = full.refusals();
  const std::vector<float> peeked = PeekOk(*bounded, ids);
  EXPECT_TRUE(SameBits(RowOf(peeked, 0, 4), InitRow(ids[0])));
  EXPECT_EQ(full.refusals(), refusals);
}

// Restore gives back the table a snapshot was taken of: values, optimizer
// state, step counts and touch counts, and it trains on as the original does.
class SparseTableRestoreTest : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(SparseTableRestoreTest, RoundTripPreservesRowsStateAndCounts) {
  constexpr int64_t kDim = 6;
  SparseTableOptions options = Options(kDim, OptimizerKind::kAdam, 0, GetParam());
  std::unique_ptr<SparseTable> original = MakeTable(options);
  std::mt19937 random(2);
  std::uniform_int_distribution<int64_t> id_of(0, 299);
  auto train = [&](SparseTable& table, std::mt19937 random) {
    for (int step = 0; step < 40; ++step) {
      std::set<int64_t> unique;
      for (int k = 0; k < 30; ++k) unique.insert(id_of(random) * (step % 3 == 0 ? 7 : 1));
      std::vector<int64_t> ids(unique.begin(), unique.end());
      LookupOk(table, ids);
      std::vector<float> grads(ids.size() * kDim);
      for (size_t k = 0; k < grads.size(); ++k) grads[k] = 0.01f * static_cast<float>(k % 13);
      ApplyOk(table, ids, grads, 0.05f);
    }
  };
  train(*original, std::mt19937(3));
  const SparseTable::Snapshot snapshot = original->TakeSnapshot();
  ASSERT_GT(snapshot.ids.size(), 100u);

  std::unique_ptr<SparseTable> restored = MakeTable(options);
  LookupOk(*restored, {100000, 100001});  // Replaced by the snapshot's.
  ASSERT_TRUE(restored->Restore(snapshot).ok());
  EXPECT_EQ(restored->rows(), original->rows());
  ExpectSameSnapshot(restored->TakeSnapshot(), snapshot);

  // Both go on alike: Adam's per-row step counts came back too.
  train(*original, std::mt19937(4));
  train(*restored, std::mt19937(4));
  ExpectSameSnapshot(restored->TakeSnapshot(), original->TakeSnapshot());
}

// Restored rows are evicted in the order of their touch counts.
TEST_P(SparseTableRestoreTest, RestoredRowsEvictByTouchCount) {
  std::unique_ptr<SparseTable> original = MakeTable(Options(4, OptimizerKind::kSgd, 0));
  LookupOk(*original, {1, 1, 1, 1, 2, 3, 3, 3});  // 2 is touched once.
  std::unique_ptr<SparseTable> bounded = MakeTable(Options(4, OptimizerKind::kSgd, 3, GetParam()));
  ASSERT_TRUE(bounded->Restore(original->TakeSnapshot()).ok());
  LookupOk(*bounded, {4});
  EXPECT_EQ(IdsOf(*bounded), (std::vector<int64_t>{1, 3, 4}));
}

// Past a stripe's share of max_rows, Restore keeps the most touched.
TEST_P(SparseTableRestoreTest, RestoreKeepsTheMostTouchedPastMaxRows) {
  std::unique_ptr<SparseTable> original = MakeTable(Options(4, OptimizerKind::kSgd, 0));
  LookupOk(*original, {1, 2, 2, 2, 3, 4, 4, 5, 5, 5, 5});
  std::unique_ptr<SparseTable> bounded = MakeTable(Options(4, OptimizerKind::kSgd, 3, GetParam()));
  ASSERT_TRUE(bounded->Restore(original->TakeSnapshot()).ok());
  EXPECT_EQ(IdsOf(*bounded), (std::vector<int64_t>{2, 4, 5}));
  EXPECT_EQ(bounded->evictions(), 2);
  EXPECT_TRUE(SameBits(LookupOk(*bounded, {4}), InitRow(4)));
}

INSTANTIATE_TEST_SUITE_P(Policies, SparseTableRestoreTest,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kLfu));

TEST(SparseTableTest, RestoreRefusesAnotherShapeOrAMalformedSnapshot) {
  std::unique_ptr<SparseTable> table = MakeTable(Options(4, OptimizerKind::kAdam));
  LookupOk(*table, {1, 2, 3});
  const SparseTable::Snapshot before = table->TakeSnapshot();

  std::unique_ptr<SparseTable> wide = MakeTable(Options(5, OptimizerKind::kAdam));
  LookupOk(*wide, {7});
  absl::Status status = table->Restore(wide->TakeSnapshot());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "sparse table clicks/table: the snapshot's rows have dim 5, the table's 4");

  std::unique_ptr<SparseTable> sgd = MakeTable(Options(4, OptimizerKind::kSgd));
  LookupOk(*sgd, {7});
  status = table->Restore(sgd->TakeSnapshot());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("clicks/table"));
  EXPECT_THAT(status.message(), HasSubstr("0 optimizer slots"));

  SparseTable::Snapshot unsorted = before;
  std::swap(unsorted.ids[0], unsorted.ids[1]);
  EXPECT_EQ(table->Restore(unsorted).code(), absl::StatusCode::kInvalidArgument);
  SparseTable::Snapshot short_values = before;
  short_values.values.pop_back();
  EXPECT_EQ(table->Restore(short_values).code(), absl::StatusCode::kInvalidArgument);

  ExpectSameSnapshot(table->TakeSnapshot(), before);
}

TEST(SparseTableTest, RestoreThatDoesNotFitTheBudgetChangesNothing) {
  std::unique_ptr<SparseTable> big = MakeTable(Options(16, OptimizerKind::kAdam));
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 5000; ++id) ids.push_back(id);
  LookupOk(*big, ids);

  MemoryBudget budget(200 * 1000);
  SparseTableOptions options = Options(16, OptimizerKind::kAdam);
  options.budget = &budget;
  std::unique_ptr<SparseTable> table = MakeTable(options);
  LookupOk(*table, {1, 2, 3});
  const SparseTable::Snapshot before = table->TakeSnapshot();
  const int64_t bytes = table->bytes();
  absl::Status status = table->Restore(big->TakeSnapshot());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("shard memory limit of 200000 bytes reached: table "
                                          "clicks/table holds 3 rows"));
  ExpectSameSnapshot(table->TakeSnapshot(), before);
  EXPECT_EQ(table->bytes(), bytes);
  EXPECT_EQ(budget.used(), bytes);

  // A smaller snapshot fits, and releases what the table held beyond it.
  std::unique_ptr<SparseTable> empty = MakeTable(Options(16, OptimizerKind::kAdam));
  ASSERT_TRUE(table->Restore(empty->TakeSnapshot()).ok());
  EXPECT_EQ(table->rows(), 0);
  EXPECT_LT(table->bytes(), bytes);
  EXPECT_EQ(budget.used(), table->bytes());
}

// The index, the slab's free list and the eviction order against a model of
// the policy, over many calls with evictions: the ids held, their touch
// counts and their values (a row found at the wrong slot would show).
class SparseTableModelTest : public ::testing::TestWithParam<std::tuple<EvictionPolicy, int64_t>> {
};

TEST_P(SparseTableModelTest, MatchesAModelOfThePolicy) {
  const EvictionPolicy policy = std::get<0>(GetParam());
  const int64_t max_rows = std::get<1>(GetParam());  // 48 fills the index to 3/4.
  std::unique_ptr<SparseTable> table = MakeTable(Options(2, OptimizerKind::kSgd, max_rows, policy));
  struct Row {
    int64_t touches = 0;
    int64_t last_touch = 0;
  };
  std::map<int64_t, Row> model;
  int64_t clock = 0;
  int64_t evictions = 0;
  std::mt19937 random(5);
  std::uniform_int_distribution<int64_t> id_of(0, 4 * max_rows);
  std::uniform_int_distribution<int> count_of(1, 5);
  for (int call = 0; call < 4000; ++call) {
    std::vector<int64_t> ids(count_of(random));
    for (int64_t& id : ids) id = id_of(random);
    LookupOk(*table, ids);
    // The rows that exist are touched first, then the missing ones created.
    std::set<int64_t> pinned;
    for (int64_t id : ids) {
      auto it = model.find(id);
      if (it == model.end()) continue;
      ++it->second.touches;
      it->second.last_touch = ++clock;
      pinned.insert(id);
    }
    std::set<int64_t> created;
    for (int64_t id : ids) {
      if (pinned.count(id) != 0 && created.count(id) == 0) continue;
      if (created.count(id) != 0) {
        ++model[id].touches;
        model[id].last_touch = ++clock;
        continue;
      }
      if (static_cast<int64_t>(model.size()) == max_rows) {
        int64_t victim = 0;
        const Row* best = nullptr;
        for (const auto& [candidate, row] : model) {
          if (pinned.count(candidate) != 0 || created.count(candidate) != 0) continue;
          const bool better =
              best == nullptr || (policy == EvictionPolicy::kLru
                                      ? row.last_touch < best->last_touch
                                      : std::make_pair(row.touches, row.last_touch) <
                                            std::make_pair(best->touches, best->last_touch));
          if (better) {
            victim = candidate;
            best = &row;
          }
        }
        const bool found = best != nullptr;
        ASSERT_TRUE(found);
        model.erase(victim);
        ++evictions;
      }
      model[id] = Row{1, ++clock};
      created.insert(id);
    }
    SparseTable::Snapshot snapshot = table->TakeSnapshot();
    std::vector<int64_t> model_ids;
    std::vector<int64_t> model_touches;
    for (const auto& [id, row] : model) {
      model_ids.push_back(id);
      model_touches.push_back(row.touches);
    }
    ASSERT_EQ(snapshot.ids, model_ids) << "call " << call;
    ASSERT_EQ(snapshot.touches, model_touches) << "call " << call;
    ASSERT_EQ(table->evictions(), evictions);
    for (size_t k = 0; k < snapshot.ids.size(); ++k) {
      ASSERT_TRUE(SameBits(RowOf(snapshot.values, k, 2), InitRow(snapshot.ids[k], 2)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndBounds, SparseTableModelTest,
                         ::testing::Combine(::testing::Values(EvictionPolicy::kLru,
                                                              EvictionPolicy::kLfu),
                                            ::testing::Values(int64_t{48}, int64_t{50})));

// 8 threads read and update shared and their own rows; SGD with gradient 1
// and learning rate 1 takes 1 off a row at each update, whichever thread
// makes it, so the final values are exact.
TEST(SparseTableTest, ConcurrentLookupsAndAppliesAreExact) {
  constexpr int kThreads = 8;
  constexpr int kSteps = 200;
  constexpr int64_t kDim = 4;
  constexpr int64_t kShared = 64;
  MemoryBudget budget(0);
  SparseTableOptions options = Options(kDim);
  options.budget = &budget;
  std::unique_ptr<SparseTable> table = MakeTable(options);
  auto minus_ones = [](std::vector<float> row, int times) {
    for (int t = 0; t < times; ++t) {
      for (float& v : row) v = v - 1.f;
    }
    return row;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < kShared; ++k) {
        ids.push_back(k);
        ids.push_back(1000 * (t + 1) + k);  // This thread's own.
      }
      const std::vector<float> ones(ids.size() * kDim, 1.f);
      for (int step = 0; step < kSteps; ++step) {
        std::vector<float> rows = LookupOk(*table, ids);
        // Its own rows are exactly as its own updates left them.
        if (step % 50 == 0) {
          EXPECT_TRUE(SameBits(RowOf(rows, 1, kDim), minus_ones(InitRow(1000 * (t + 1)), step)));
        }
        ApplyOk(*table, ids, ones, 1.f);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  SparseTable::Snapshot snapshot = table->TakeSnapshot();
  ASSERT_EQ(snapshot.ids.size(), static_cast<size_t>(kShared * (1 + kThreads)));
  for (size_t k = 0; k < snapshot.ids.size(); ++k) {
    const int64_t id = snapshot.ids[k];
    const int updates = id < kShared ? kThreads * kSteps : kSteps;
    EXPECT_TRUE(SameBits(RowOf(snapshot.values, k, kDim), minus_ones(InitRow(id), updates))) << id;
    EXPECT_EQ(snapshot.updates[k], updates) << id;
    EXPECT_EQ(snapshot.touches[k], 2 * updates) << id;
  }
  EXPECT_EQ(budget.used(), table->bytes());
}

// Threads under eviction pressure: the bound holds, the counts agree.
TEST(SparseTableTest, ConcurrentCallsUnderEvictionKeepTheBound) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
    MemoryBudget budget(0);
    SparseTableOptions options = Options(4, OptimizerKind::kAdagrad, 1000, policy);
    options.budget = &budget;
    std::unique_ptr<SparseTable> table = MakeTable(options);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 random(t);
        std::uniform_int_distribution<int64_t> id_of(0, 5000);
        for (int step = 0; step < 300; ++step) {
          std::set<int64_t> unique;
          for (int k = 0; k < 20; ++k) unique.insert(id_of(random));
          std::vector<int64_t> ids(unique.begin(), unique.end());
          LookupOk(*table, ids);
          ApplyOk(*table, ids, std::vector<float>(ids.size() * 4, 0.5f), 0.1f);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_LE(table->rows(), 1000);
    EXPECT_GT(table->evictions(), 0);
    EXPECT_EQ(static_cast<int64_t>(IdsOf(*table).size()), table->rows());
    EXPECT_EQ(budget.used(), table->bytes());
  }
}

// Throughput, printed, not asserted: 1M Zipf-distributed ids (exponent ~1
// over 10M ids), dim 16, Adam, in batches of 8192 deduplicated as a worker
// sends them; each row is looked up and then updated once per batch. Three
// passes over the same batches: the first creates the rows it meets first
// (one thread), the second finds them all (one thread), the third too with
// the batches split between two threads.
TEST(SparseTableTest, ThroughputOfLookupAndApply) {
  constexpr int64_t kDim = 16;
  constexpr int64_t kTotal = 1 << 20;
  constexpr int64_t kBatch = 8192;
  std::unique_ptr<SparseTable> table = MakeTable(Options(kDim, OptimizerKind::kAdam));
  std::mt19937_64 random(6);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double log_vocab = std::log(1e7);
  std::vector<std::vector<int64_t>> batches;
  int64_t rows = 0;
  for (int64_t begin = 0; begin < kTotal; begin += kBatch) {
    std::vector<int64_t> ids(kBatch);
    for (int64_t& id : ids) {
      // Log-uniform rank: P(rank r) ~ 1 / r; scattered over the id space.
      const int64_t rank = static_cast<int64_t>(std::exp(uniform(random) * log_vocab));
      id = static_cast<int64_t>(static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ULL >> 1);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    rows += static_cast<int64_t>(ids.size());
    batches.push_back(std::move(ids));
  }
  // Seconds spent in Lookup and in Apply by one thread over batches
  // [first, batches.size()) step `step`.
  auto run = [&](size_t first, size_t step, double* lookup, double* apply) {
    std::vector<float> out(kBatch * kDim);
    const std::vector<float> grads(kBatch * kDim, 0.01f);
    for (size_t b = first; b < batches.size(); b += step) {
      const std::vector<int64_t>& ids = batches[b];
      const int64_t n = static_cast<int64_t>(ids.size());
      const auto start = std::chrono::steady_clock::now();
      ASSERT_TRUE(table->Lookup(ids.data(), n, out.data()).ok());
      const auto looked_up = std::chrono::steady_clock::now();
      ASSERT_TRUE(table->Apply(ids.data(), n, grads.data(), 0.01f).ok());
      const auto applied = std::chrono::steady_clock::now();
      *lookup += std::chrono::duration<double>(looked_up - start).count();
      *apply += std::chrono::duration<double>(applied - looked_up).count();
    }
  };
  auto report = [&](const char* pass, double lookup, double apply, double wall) {
    std::printf(
        "sparse table throughput, %s: lookup %.2f M rows/s, apply %.2f M rows/s, lookup+apply "
        "%.2f M rows/s\n",
        pass, rows / lookup / 1e6, rows / apply / 1e6, rows / wall / 1e6);
  };
  std::printf(
      "sparse table throughput: %lld ids, %lld distinct per batch of %lld, dim %lld, Adam\n",
      static_cast<long long>(kTotal), static_cast<long long>(rows), static_cast<long long>(kBatch),
      static_cast<long long>(kDim));
  for (const char* pass : {"creating rows, 1 thread", "rows found, 1 thread"}) {
    double lookup = 0;
    double apply = 0;
    run(0, 1, &lookup, &apply);
    report(pass, lookup, apply, lookup + apply);
  }
  double unused[4] = {0, 0, 0, 0};
  const auto start = std::chrono::steady_clock::now();
  std::thread second([&] { run(1, 2, &unused[0], &unused[1]); });
  run(0, 2, &unused[2], &unused[3]);
  second.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "sparse table throughput, rows found, 2 threads: lookup+apply %.2f M rows/s; %lld rows "
      "held, %.1f bytes per row\n",
      rows / wall / 1e6, static_cast<long long>(table->rows()),
      static_cast<double>(table->bytes()) / table->rows());
}

}  // namespace
}  // namespace downpour
