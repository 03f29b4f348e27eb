// SparseExchange against in-process parameter stores: rows come back as
// created, pushed gradients update them once (SYNC over two workers,
// ASYNC at once), retried requests apply once, evaluations create nothing.
#include "worker/sparse_exchange.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "ps/sparse_table.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "spec/sparse_ids.h"
#include "worker/slow_shard_for_tests.h"

namespace downpour {
namespace {

constexpr char kJob[] = R"pb(
  name: "sparse"
  model {
    num_classes: 2
    inputs { name: "c" kind: SPARSE }
    layer {
      name: "e"
      inputs: "c"
      embedding { sparse: true vocab_size: 1000 dim: 3 }
    }
    layer { dense { units: 2 } }
    layer { softmax_cross_entropy {} }
  }
  dataset { train_files: "x" test_files: "y" batch_size: 4 }
  optimizer { kind: SGD learning_rate: 0.5 }
  consistency { mode: %s }
  num_workers: 2
  num_shards: 2
  steps: 10
  seed: 9
)pb";

class SparseExchangeTest : public ::testing::Test {
 protected:
  void Host(const std::string& mode) {
    std::string text = kJob;
    text.replace(text.find("%s"), 2, mode);
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec_));
    ApplyJobDefaults(&spec_);
    auto params = ValidateJobSpec(spec_);
    ASSERT_TRUE(params.ok()) << params.status();
    auto placed = PlacePartitions(*params, 2, spec_.partition_bytes());
    ASSERT_TRUE(placed.ok());
    for (int s = 0; s < 2; ++s) {
      stores_.push_back(std::make_unique<ParameterStore>());
      stores_.back()->SetCheckpointSink([this, s](ShardCapture capture) {
        absl::MutexLock lock(&captured_mu_);
        captured_.emplace_back(s, capture.info().step);
      });
      ASSERT_TRUE(stores_.back()->AddJob("j", spec_, s, *placed).ok());
      shards_.push_back(stores_.back().get());
    }
    auto shape = InferModel(spec_.model());
    ASSERT_TRUE(shape.ok());
    shape_ = *shape;
  }

  std::unique_ptr<SparseExchange> Exchange(int rank) {
    ExchangeOptions options;
    options.job_id = "j";
    options.rank = rank;
    options.worker_id = "worker" + std::to_string(rank);
    options.pull_timeout = absl::Seconds(20);
    return std::make_unique<SparseExchange>(shape_, options, shards_);
  }

  // A batch of one example per id list.
  SparseBatch Plan(const std::vector<std::vector<int64_t>>& examples) {
    std::vector<data::InputBatch> inputs(1);
    inputs[0].offsets = {0};
    for (const auto& ids : examples) {
      inputs[0].ids.insert(inputs[0].ids.end(), ids.begin(), ids.end());
      inputs[0].offsets.push_back(static_cast<int64_t>(inputs[0].ids.size()));
    }
    auto plan = SparseBatch::Plan(shape_, inputs, static_cast<int64_t>(examples.size()), 2);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }

  // Row `row`'s values in the last pull of `exchange` for `plan`.
  static std::vector<float> Row(const SparseExchange& exchange, const SparseBatch& plan,
                                int64_t row) {
    for (int s = 0; s < plan.num_shards(); ++s) {
      const std::vector<int64_t>& rows = plan.rows(0, s);
      for (size_t k = 0; k < rows.size(); ++k) {
        if (rows[k] == row) {
          const float* v = exchange.rows()[0][s] + 3 * k;
          return {v, v + 3};
        }
      }
    }
    ADD_FAILURE() << "row " << row << " not pulled";
    return {};
  }

  // Gradients of `value` for every row of `plan`.
  static std::vector<std::vector<std::vector<float>>> Grads(const SparseBatch& plan, float value) {
    std::vector<std::vector<std::vector<float>>> grads(1);
    for (int s = 0; s < plan.num_shards(); ++s) {
      grads[0].emplace_back(plan.rows(0, s).size() * 3, value);
    }
    return grads;
  }

  std::vector<float> Init(int64_t row) const {
    std::vector<float> v(3);
    InitSparseRow(spec_.seed(), "e/table", row, 1.f / std::sqrt(3.f), 3, v.data());
    return v;
  }

  JobSpec spec_;
  ModelShape shape_;
  absl::Mutex captured_mu_;
  std::vector<std::pair<int, int64_t>> captured_ ABSL_GUARDED_BY(captured_mu_);  // (shard, step)
  std::vector<std::unique_ptr<ParameterStore>> stores_;
  std::vector<ParameterShard*> shards_;
};

const auto kNever = [] { return false; };

TEST_F(SparseExchangeTest, SyncStepAppliesTheMeanOfBothWorkersOnce) {
  Host("SYNC");
  auto w0 = Exchange(0), w1 = Exchange(1);
  const SparseBatch a = Plan({{1, 2}, {3}}), b = Plan({{2, 7}});
  w0->Begin(0, nullptr, nullptr, &a.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  for (int64_t row : {1, 2, 3}) EXPECT_EQ(Row(*w0, a, row), Init(row));
  w1->Begin(0, nullptr, nullptr, &b.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w1->Finish().ok());
  // Step 0: worker 0 pushes 1.0 for rows 1, 2, 3; worker 1 pushes 3.0 for
  // rows 2, 7; both pull rows 1, 2, 7 for step 1 (version 1).
  const SparseBatch next = Plan({{1, 2, 7}});
  const auto ga = Grads(a, 1.f), gb = Grads(b, 3.f);
  w0->Begin(0, &a, &ga, &next.row_ids(), 1, 0, kNever);
  w1->Begin(0, &b, &gb, &next.row_ids(), 1, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  ASSERT_TRUE(w1->Finish().ok());
  // The mean over the two workers (a row one did not touch gets nothing
  // from it), times the learning rate 0.5.
  for (int d = 0; d < 3; ++d) {
    EXPECT_FLOAT_EQ(Row(*w0, next, 1)[d], Init(1)[d] - 0.5f * (1.f + 0.f) / 2);
    EXPECT_FLOAT_EQ(Row(*w0, next, 2)[d], Init(2)[d] - 0.5f * (1.f + 3.f) / 2);
    EXPECT_FLOAT_EQ(Row(*w0, next, 7)[d], Init(7)[d] - 0.5f * (0.f + 3.f) / 2);
  }
  EXPECT_EQ(Row(*w0, next, 7), Row(*w1, next, 7));
  EXPECT_EQ(w0->rows_pushed(), 3);
  EXPECT_EQ(w0->rows_pulled(), 3 + 3);
}

TEST_F(SparseExchangeTest, AsyncAppliesEachPushAtOnceAndEvaluationsCreateNoRow) {
  Host("ASYNC");
  auto w0 = Exchange(0);
  const SparseBatch a = Plan({{5}});
  w0->Begin(0, nullptr, nullptr, &a.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  const auto g = Grads(a, 2.f);
  w0->Begin(0, &a, &g, &a.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  for (int d = 0; d < 3; ++d) EXPECT_FLOAT_EQ(Row(*w0, a, 5)[d], Init(5)[d] - 0.5f * 2.f);
  int64_t rows_before = 0;
  for (const auto& store : stores_) {
    for (const SparseTableStats& t : store->SparseTables("j")) rows_before += t.rows;
  }
  EXPECT_EQ(rows_before, 1);
  // An evaluation reads rows 5 and 900: 900 is its initial value, and no
  // shard holds it afterwards.
  const SparseBatch eval = Plan({{5, 900}});
  w0->Begin(0, nullptr, nullptr, &eval.row_ids(), 0, 0, kNever, /*read_only=*/true);
  ASSERT_TRUE(w0->Finish().ok());
  EXPECT_EQ(Row(*w0, eval, 900), Init(900));
  for (int d = 0; d < 3; ++d) EXPECT_FLOAT_EQ(Row(*w0, eval, 5)[d], Init(5)[d] - 1.f);
  int64_t rows_after = 0;
  for (const auto& store : stores_) {
    for (const SparseTableStats& t : store->SparseTables("j")) rows_after += t.rows;
  }
  EXPECT_EQ(rows_after, 1);
  // Finishing again, the evaluation's plan gone, is a no-op.
  EXPECT_TRUE(w0->Finish().ok());
  {
    const SparseBatch gone = Plan({{6}});
    w0->Begin(0, nullptr, nullptr, &gone.row_ids(), 0, 0, kNever, /*read_only=*/true);
    ASSERT_TRUE(w0->Finish().ok());
  }
  EXPECT_TRUE(w0->Finish().ok());
  EXPECT_FALSE(w0->in_flight());
}

TEST_F(SparseExchangeTest, AShardThatRefusesFailsTheStepWithItsReason) {
  // Shards whose memory limit leaves no room for a row.
  Host("ASYNC");
  stores_.clear();
  shards_.clear();
  auto params = ValidateJobSpec(spec_);
  ASSERT_TRUE(params.ok());
  auto placed = PlacePartitions(*params, 2, spec_.partition_bytes());
  ASSERT_TRUE(placed.ok());
  std::vector<std::unique_ptr<MemoryBudget>> budgets;
  for (int s = 0; s < 2; ++s) {
    budgets.push_back(std::make_unique<MemoryBudget>(1 << 16));
    stores_.push_back(std::make_unique<ParameterStore>(budgets.back().get()));
    const absl::Status added = stores_.back()->AddJob("j", spec_, s, *placed);
    ASSERT_TRUE(added.ok()) << added;
    shards_.push_back(stores_.back().get());
  }
  auto w0 = Exchange(0);
  std::vector<std::vector<int64_t>> many(1);
  for (int64_t id = 0; id < 1000; ++id) many[0].push_back(id);
  const SparseBatch plan = Plan(many);
  w0->Begin(0, nullptr, nullptr, &plan.row_ids(), 0, 0, kNever);
  const absl::Status refused = w0->Finish();
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_NE(refused.message().find("shard memory limit"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("exchanging sparse rows with shard"), std::string::npos);
  // The stores give their reservations back to the budgets, which go first.
  w0.reset();
  shards_.clear();
  stores_.clear();
}

// An exchange's round trip is its slowest shard's (from the request's
// sending to its answer), and the shards' part of it that shard's own
// account; an exchange whose shards say nothing of theirs is not counted.
TEST_F(SparseExchangeTest, AnExchangesRoundTripIsItsSlowestShardsAndSaysWhatThatShardSpent) {
  Host("ASYNC");
  SlowShard fast(stores_[0].get(), absl::ZeroDuration(), absl::Milliseconds(1));
  SlowShard slow(stores_[1].get(), absl::Milliseconds(300), absl::Milliseconds(40));
  shards_ = {&fast, &slow};
  auto w0 = Exchange(0);
  // Rows on both shards (ids are spread over them).
  const SparseBatch plan = Plan({{1}, {2}, {3}, {4}, {5}, {6}});
  ASSERT_FALSE(plan.rows(0, 0).empty());
  ASSERT_FALSE(plan.rows(0, 1).empty());
  // A pull alone (the shards say nothing of theirs: not counted), then a
  // push and pull.
  w0->Begin(0, nullptr, nullptr, &plan.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  EXPECT_EQ(w0->round_trip_seconds(), 0);
  const auto grads = Grads(plan, 0.1f);
  const absl::Time began = absl::Now();
  w0->Begin(0, &plan, &grads, &plan.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  const double waited = absl::ToDoubleSeconds(absl::Now() - began);
  EXPECT_GE(w0->round_trip_seconds(), 0.3);
  EXPECT_LE(w0->round_trip_seconds(), waited);
  EXPECT_DOUBLE_EQ(w0->shard_seconds(), 0.04);
}

TEST_F(SparseExchangeTest, APushCarryingACheckpointStepStartsACaptureOnEveryShard) {
  Host("ASYNC");
  auto w0 = Exchange(0);
  const SparseBatch a = Plan({{1, 2, 3, 4, 5, 6}});
  w0->Begin(0, nullptr, nullptr, &a.row_ids(), 0, 0, kNever);
  ASSERT_TRUE(w0->Finish().ok());
  const auto g = Grads(a, 1.f);
  w0->Begin(0, &a, &g, nullptr, 0, 0, kNever, /*read_only=*/false, /*checkpoint_step=*/1);
  ASSERT_TRUE(w0->Finish().ok());
  absl::MutexLock lock(&captured_mu_);
  ASSERT_EQ(captured_.size(), 2u);
  std::sort(captured_.begin(), captured_.end());
  EXPECT_EQ(captured_[0], std::make_pair(0, int64_t{1}));
  EXPECT_EQ(captured_[1], std::make_pair(1, int64_t{1}));
}

TEST_F(SparseExchangeTest, ACancelledExchangeStops) {
  Host("SYNC");
  auto w0 = Exchange(0);
  const SparseBatch a = Plan({{4}});
  // Version 5 never comes: only cancellation ends the pull.
  w0->Begin(0, nullptr, nullptr, &a.row_ids(), 5, 0, [] { return true; });
  EXPECT_TRUE(absl::IsCancelled(w0->Finish()));
}

}  // namespace
}  // namespace downpour
