// InputStage against in-process parameter stores, one SYNC worker training a
// model with one sparse table: what each step's input holds. With
// embedding_staleness 0 a step reads every row after the last step's
// update; with k > 0 it reads rows at most k steps behind, pulls fewer of
// them, and an evaluation between steps changes neither.
#include "worker/input_stage.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"
#include "ps/parameter_store.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

// SmallSparseModel's table: rows of 4.
constexpr int kDim = 4;

// One SYNC worker, 2 shards, SmallSparseModel with `staleness` on its table.
JobSpec SparseJob(int staleness) {
  JobSpec spec;
  spec.set_name("sparse");
  *spec.mutable_model() = SmallSparseModel();
  spec.mutable_model()->mutable_layer(0)->mutable_embedding()->set_embedding_staleness(staleness);
  spec.mutable_dataset()->set_train_files("x");
  spec.mutable_dataset()->set_test_files("y");
  spec.mutable_dataset()->set_batch_size(4);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5);
  spec.mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  spec.set_num_workers(1);
  spec.set_num_shards(2);
  spec.set_steps(100);
  spec.set_seed(9);
  return spec;
}

const auto kNever = [] { return false; };

class InputStageTest : public ::testing::Test {
 protected:
  void Host(int staleness) {
    spec_ = SparseJob(staleness);
    ApplyJobDefaults(&spec_);
    auto params = ValidateJobSpec(spec_);
    ASSERT_TRUE(params.ok()) << params.status();
    auto placed = PlacePartitions(*params, 2, spec_.partition_bytes());
    ASSERT_TRUE(placed.ok());
    for (int s = 0; s < 2; ++s) {
      stores_.push_back(std::make_unique<ParameterStore>());
      ASSERT_TRUE(stores_.back()->AddJob("j", spec_, s, *placed).ok());
      shards_.push_back(stores_.back().get());
    }
    auto model = Model::Create(spec_.model(), spec_.seed());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    const ExchangeOptions options = Options();
    stage_ = std::make_unique<InputStage>(model_->shape(), options, shards_, kNever);
    reader_ = std::make_unique<SparseExchange>(model_->shape(), options, shards_);
  }

  // One example per id list.
  static data::Batch MakeBatch(const std::vector<std::vector<int64_t>>& examples) {
    data::Batch batch;
    batch.size = static_cast<int64_t>(examples.size());
    batch.inputs.resize(1);
    batch.inputs[0].offsets = {0};
    for (const auto& ids : examples) {
      batch.inputs[0].ids.insert(batch.inputs[0].ids.end(), ids.begin(), ids.end());
      batch.inputs[0].offsets.push_back(static_cast<int64_t>(batch.inputs[0].ids.size()));
      batch.labels.push_back(static_cast<int32_t>(ids.size() % 2));
    }
    return batch;
  }

  // The batches of steps 0 .. steps (one more than trained): the ids {1},
  // {2}, {1, 2}, {3 + step} (rows 1 and 2 read every step).
  static std::vector<data::Batch> Batches(int steps) {
    std::vector<data::Batch> batches;
    for (int step = 0; step <= steps; ++step) {
      batches.push_back(MakeBatch({{1}, {2}, {1, 2}, {3 + step}}));
    }
    return batches;
  }

  static ExchangeOptions Options() {
    ExchangeOptions options;
    options.job_id = "j";
    options.worker_id = "worker0";
    options.pull_timeout = absl::Seconds(20);
    return options;
  }

  // Row `row` as the shards hold it now (read without creating).
  std::vector<float> ShardRow(int64_t row) {
    const data::Batch one = MakeBatch({{row}});
    auto plan = SparseBatch::Plan(model_->shape(), one.inputs, 1, 2);
    EXPECT_TRUE(plan.ok());
    reader_->Begin(0, nullptr, nullptr, &plan->row_ids(), 0, 0, kNever, /*read_only=*/true);
    EXPECT_TRUE(reader_->Finish().ok());
    for (int s = 0; s < 2; ++s) {
      if (!plan->rows(0, s).empty()) return {reader_->rows()[0][s], reader_->rows()[0][s] + kDim};
    }
    return {};
  }

  // Records rows 1 and 2 as the shards hold them now (versions_).
  void RecordVersion() {
    std::vector<float> now = ShardRow(1);
    const std::vector<float> two = ShardRow(2);
    now.insert(now.end(), two.begin(), two.end());
    versions_.push_back(now);
  }

  // Trains `steps` steps on batches of the ids {1}, {2}, {1, 2}, {3 + step}
  // (rows 1 and 2 read every step). Before each step, records rows 1 and
  // 2 as the shards hold them (versions_[v]: after v steps); returns what
  // each step's input held for them (example 0: row 1, example 1: row 2).
  std::vector<std::vector<float>> Train(int steps, bool evaluate = false) {
    std::vector<std::vector<float>> read;
    const std::vector<data::Batch> batches = Batches(steps);
    int64_t planned = 0;  // The last step planned ahead.
    for (int step = 0; step < steps; ++step) {
      // The last step's update applied (the push lane's answer), then read.
      EXPECT_TRUE(stage_->Finish().ok());
      RecordVersion();
      if (evaluate && step > 0) {
        // A batch of other rows between two steps.
        const data::Batch test = MakeBatch({{50}, {51}, {52}, {53}});
        stage_->NewEvaluation();
        EXPECT_TRUE(stage_->BeginEvalFeatures(test, 0, 0).ok());
        std::vector<float> pooled;
        EXPECT_TRUE(stage_->EvalFeatures(test, nullptr, &pooled).ok());
      }
      const data::Batch& batch = batches[step];
      absl::StatusOr<const float*> features = stage_->Features(step, batch, step, 0);
      EXPECT_TRUE(features.ok()) << features.status();
      if (!features.ok()) return read;
      // The slot is the model's whole input: [example][kDim].
      read.push_back({*features, *features + 2 * kDim});
      // As the trainer does: plan_depth() batches ahead.
      for (; planned < std::min<int64_t>(step + stage_->plan_depth(), steps); ++planned) {
        stage_->PlanAhead(planned + 1, &batches[planned + 1], planned + 1, 0);
      }
      EXPECT_TRUE(model_->TrainStep(*features, batch.labels.data(), batch.size, step).ok());
      EXPECT_TRUE(stage_->Exchange(step, *model_, &batches[step + 1], step + 1, 0).ok());
    }
    EXPECT_TRUE(stage_->Finish().ok());
    return read;
  }

  // The versions (steps applied) whose rows 1 and 2 `read` holds, the
  // older and the newer (-1: none). The two rows live on different shards,
  // so one pull may find them a step apart (one shard has applied a push
  // the other has not yet).
  std::pair<int64_t, int64_t> VersionsOf(const std::vector<float>& read) const {
    int64_t of[2] = {-1, -1};
    for (int row = 0; row < 2; ++row) {
      const auto half = [&](const std::vector<float>& rows) {
        return std::vector<float>(rows.begin() + row * kDim, rows.begin() + (row + 1) * kDim);
      };
      for (int64_t v = static_cast<int64_t>(versions_.size()) - 1; v >= 0 && of[row] < 0; --v) {
        if (half(versions_[v]) == half(read)) of[row] = v;
      }
    }
    if (of[0] < 0 || of[1] < 0) return {-1, -1};
    return {std::min(of[0], of[1]), std::max(of[0], of[1])};
  }

  // Both rows of `read` at most `staleness` steps behind step `step`;
  // true if either is behind.
  bool ExpectWithin(const std::vector<float>& read, int64_t step, int64_t staleness) const {
    const auto [older, newer] = VersionsOf(read);
    EXPECT_GE(older, step - staleness) << "step " << step;
    EXPECT_LE(newer, step) << "step " << step;
    return older < step;
  }

  JobSpec spec_;
  std::vector<std::unique_ptr<ParameterStore>> stores_;
  std::vector<ParameterShard*> shards_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<InputStage> stage_;
  std::unique_ptr<SparseExchange> reader_;
  std::vector<std::vector<float>> versions_;
};

TEST_F(InputStageTest, WithoutStalenessEveryStepReadsTheRowsOfTheStepBefore) {
  Host(0);
  const std::vector<std::vector<float>> read = Train(8, /*evaluate=*/true);
  ASSERT_EQ(read.size(), 8u);
  for (int64_t step = 0; step < 8; ++step) {
    EXPECT_EQ(VersionsOf(read[step]), std::make_pair(step, step)) << "step " << step;
  }
  EXPECT_EQ(stage_->rows_kept(), 0);
}

// An evaluation pulls each row once, the first test batch that reads it
// (past the bytes it may keep, once more); the next evaluation (after
// training) pulls them again, as trained. The
// rows of a batch are awaited apart from laying its input out, as the
// trainer does (there on the evaluation's own thread).
TEST_F(InputStageTest, AnEvaluationPullsEachRowOnceAndTheNextReadsThemAsTrained) {
  Host(0);
  // The test batch's input as EvalFeatures lays it out: [example][kDim].
  const auto evaluate = [&](const data::Batch& test) {
    EXPECT_TRUE(stage_->BeginEvalFeatures(test, 0, 0).ok());
    EXPECT_TRUE(stage_->AwaitEvalRows().ok());
    std::vector<float> pooled;
    absl::StatusOr<const float*> features = stage_->EvalFeatures(test, nullptr, &pooled);
    EXPECT_TRUE(features.ok()) << features.status();
    if (!features.ok()) return std::vector<float>();
    return std::vector<float>(*features, *features + test.size * kDim);
  };
  // Example e's row, as the shards hold `row` now.
  const auto expect_row = [&](const std::vector<float>& input, int e, int64_t row) {
    ASSERT_GE(input.size(), static_cast<size_t>((e + 1) * kDim));
    EXPECT_EQ(std::vector<float>(input.begin() + e * kDim, input.begin() + (e + 1) * kDim),
              ShardRow(row))
        << "example " << e << ", row " << row;
  };
  stage_->NewEvaluation();
  std::vector<float> input = evaluate(MakeBatch({{1}, {2}, {50}}));
  expect_row(input, 0, 1);
  expect_row(input, 1, 2);
  expect_row(input, 2, 50);
  EXPECT_EQ(stage_->eval_rows_read(), 3);
  EXPECT_EQ(stage_->eval_rows_pulled(), 3);
  // Rows 1, 2 and 50 come from the first batch's pull.
  input = evaluate(MakeBatch({{51}, {2}, {1}, {50}}));
  expect_row(input, 0, 51);
  expect_row(input, 1, 2);
  expect_row(input, 2, 1);
  expect_row(input, 3, 50);
  EXPECT_EQ(stage_->eval_rows_read(), 7);
  EXPECT_EQ(stage_->eval_rows_pulled(), 4);

  // An evaluation whose kept rows outgrow the cache's bytes lets them go
  // and pulls each batch's again: the same rows, pulled once more.
  stage_->NewEvaluation();
  stage_->SetEvalCacheBytesForTesting(1);
  input = evaluate(MakeBatch({{1}, {2}}));
  expect_row(input, 0, 1);
  expect_row(input, 1, 2);
  input = evaluate(MakeBatch({{2}, {1}}));
  expect_row(input, 0, 2);
  expect_row(input, 1, 1);
  EXPECT_EQ(stage_->eval_rows_read(), 4);
  EXPECT_EQ(stage_->eval_rows_pulled(), 4);
  stage_->SetEvalCacheBytesForTesting(InputStage::kEvalCacheBytes);

  // Training changes rows 1 and 2; the next evaluation reads them so.
  const std::vector<float> before = ShardRow(1);
  Train(2);
  ASSERT_NE(ShardRow(1), before);
  stage_->NewEvaluation();
  input = evaluate(MakeBatch({{1}, {2}}));
  expect_row(input, 0, 1);
  expect_row(input, 1, 2);
  EXPECT_EQ(stage_->eval_rows_pulled(), 2);
}

// A test batch's rows go into the device's block as a step's do (each
// example's sums from the block are the input pooled here), or, where the
// device has no room, are pooled here into the staging buffer; any other
// error of the block is the device's (Internal), not the test data's.
TEST_F(InputStageTest, ATestBatchIsLaidIntoTheDevicesBlockOrPooledHere) {
  Host(0);
  const data::Batch test = MakeBatch({{1}, {2}, {1, 2}, {50}});
  const int64_t input_size = model_->shape().input_size;
  ASSERT_EQ(input_size, kDim);  // The slot is the whole input.
  // The input pooled here, as a CPU worker's evaluation has it.
  stage_->NewEvaluation();
  ASSERT_TRUE(stage_->BeginEvalFeatures(test, 0, 0).ok());
  std::vector<float> host;
  absl::StatusOr<const float*> pooled_here = stage_->EvalFeatures(test, nullptr, &host);
  ASSERT_TRUE(pooled_here.ok()) << pooled_here.status();
  const std::vector<float> expected(*pooled_here, *pooled_here + test.size * input_size);

  // A device that lays out a block for one table, as Model::PooledStaging.
  std::vector<float> values;
  std::vector<int32_t> offsets, index, row_reads, readers;
  std::vector<PooledRows> block(1);
  int asked = 0;
  const InputStage::PoolOnDevice device = [&](int64_t batch, const std::vector<int32_t>& rows,
                                              const std::vector<int32_t>& ids,
                                              const std::vector<StoredRows>& stored) {
    ++asked;
    EXPECT_TRUE(stored.empty());  // A test batch's rows are all in the block.
    values.assign(rows[0] * kDim, 0.f);
    offsets.assign(batch + 1, 0);
    index.assign(ids[0], 0);
    row_reads.assign(rows[0] + 1, 0);
    readers.assign(ids[0], 0);
    block[0] = PooledRows{rows[0],      ids[0],           values.data(), offsets.data(),
                          index.data(), row_reads.data(), readers.data()};
    return absl::StatusOr<std::vector<PooledRows>*>(&block);
  };
  std::vector<float> staging(test.size * input_size, -1.f), unused;
  bool on_device = false;
  ASSERT_TRUE(stage_->BeginEvalFeatures(test, 0, 0).ok());
  absl::StatusOr<const float*> laid =
      stage_->EvalFeatures(test, staging.data(), &unused, device, &on_device);
  ASSERT_TRUE(laid.ok()) << laid.status();
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(on_device);
  EXPECT_EQ(*laid, staging.data());
  EXPECT_TRUE(unused.empty());
  ASSERT_EQ(block[0].rows, 3);  // Rows 1, 2 and 50, each once.
  for (int64_t b = 0; b < test.size; ++b) {
    std::vector<float> sum(kDim, 0.f);
    for (int32_t k = offsets[b]; k < offsets[b + 1]; ++k) {
      for (int d = 0; d < kDim; ++d) sum[d] += values[index[k] * kDim + d];
    }
    EXPECT_EQ(sum,
              std::vector<float>(expected.begin() + b * kDim, expected.begin() + (b + 1) * kDim))
        << "example " << b;
  }

  // No room on the device: pooled here, into the staging buffer.
  const InputStage::PoolOnDevice no_room = [](int64_t, const std::vector<int32_t>&,
                                              const std::vector<int32_t>&,
                                              const std::vector<StoredRows>&) {
    return absl::StatusOr<std::vector<PooledRows>*>(
        absl::ResourceExhaustedError("device 0: no room for the block"));
  };
  std::fill(staging.begin(), staging.end(), -1.f);
  ASSERT_TRUE(stage_->BeginEvalFeatures(test, 0, 0).ok());
  laid = stage_->EvalFeatures(test, staging.data(), &unused, no_room, &on_device);
  ASSERT_TRUE(laid.ok()) << laid.status();
  EXPECT_FALSE(on_device);
  EXPECT_EQ(staging, expected);

  // A block refused for another reason (even one that reads as a bad
  // argument) is the device's error.
  const InputStage::PoolOnDevice refusing = [](int64_t, const std::vector<int32_t>&,
                                               const std::vector<int32_t>&,
                                               const std::vector<StoredRows>&) {
    return absl::StatusOr<std::vector<PooledRows>*>(
        absl::InvalidArgumentError("pooled rows: 2 table sizes; the model has 1"));
  };
  ASSERT_TRUE(stage_->BeginEvalFeatures(test, 0, 0).ok());
  laid = stage_->EvalFeatures(test, staging.data(), &unused, refusing, &on_device);
  EXPECT_TRUE(absl::IsInternal(laid.status())) << laid.status();
  EXPECT_NE(laid.status().message().find("laying out a test batch's rows"), std::string::npos)
      << laid.status();
  stage_->EndEvaluation();
}

// A device with no room for the pooled block (ResourceExhausted) leaves the
// step pooled here, into the staging buffer, as without one; any other
// error of the block is the step's.
TEST_F(InputStageTest, ABlockTheDeviceHasNoRoomForIsPooledHere) {
  Host(0);
  const data::Batch batch = MakeBatch({{1}, {2}, {1, 2}, {3}});
  std::vector<float> staging(batch.size * model_->shape().input_size, -1.f);
  int asked = 0;
  const InputStage::PoolOnDevice no_room = [&](int64_t, const std::vector<int32_t>&,
                                               const std::vector<int32_t>&,
                                               const std::vector<StoredRows>&) {
    ++asked;
    return absl::StatusOr<std::vector<PooledRows>*>(
        absl::ResourceExhaustedError("device 0: no room for the block"));
  };
  absl::StatusOr<const float*> features =
      stage_->Features(0, batch, 0, 0, false, staging.data(), no_room);
  ASSERT_TRUE(features.ok()) << features.status();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(*features, staging.data());
  EXPECT_FALSE(stage_->pooled_on_device());
  const std::vector<float> pooled_here(staging);
  absl::StatusOr<const float*> again = stage_->Features(0, batch, 0, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(std::vector<float>(*again, *again + staging.size()), pooled_here);
  const InputStage::PoolOnDevice broken = [](int64_t, const std::vector<int32_t>&,
                                             const std::vector<int32_t>&,
                                             const std::vector<StoredRows>&) {
    return absl::StatusOr<std::vector<PooledRows>*>(absl::InternalError("block broken"));
  };
  EXPECT_EQ(stage_->Features(0, batch, 0, 0, false, staging.data(), broken).status(),
            absl::InternalError("block broken"));
}

TEST_F(InputStageTest, AStaleTableReadsRowsAtMostItsStalenessBehindAndPullsFewer) {
  Host(3);
  const std::vector<std::vector<float>> read = Train(12, /*evaluate=*/true);
  // Two ahead (every table is kept), each batch's input pooled here by
  // the task beside the step before it.
  EXPECT_EQ(stage_->plan_depth(), 2);
  EXPECT_EQ(stage_->ahead_seconds().taken, 11);
  EXPECT_EQ(stage_->ahead_seconds().pooled, 11);
  ASSERT_EQ(read.size(), 12u);
  int behind = 0;
  for (int64_t step = 0; step < 12; ++step) behind += ExpectWithin(read[step], step, 3);
  // Rows were read from the cache, some of them behind.
  EXPECT_GT(behind, 0);
  EXPECT_GT(stage_->rows_kept(), 0);
  // Each step reads 3 rows (1, 2 and a new one): 36 pulled without the
  // cache (and the rows of the batch after the last, prefetched).
  EXPECT_GE(stage_->rows_pulled() + stage_->rows_kept(), 36);
  EXPECT_LT(stage_->rows_pulled(), 30);
}

// A block in host memory standing in for the model's (Model::PooledStaging):
// laid out for what it is asked, each row's gradient `grad` in every column.
// A stored table's rows stay here by place between blocks, as on the
// device: Land() writes the block's fresh rows there, as a step does before
// pooling. Blocks numbered in `no_room` are refused (ResourceExhausted).
class FakeDeviceBlock {
 public:
  explicit FakeDeviceBlock(float grad, std::set<int> no_room = {})
      : grad_(grad), no_room_(std::move(no_room)) {}

  InputStage::PoolOnDevice Lay() {
    return
        [this](int64_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& ids,
               const std::vector<StoredRows>& stored) -> absl::StatusOr<std::vector<PooledRows>*> {
          if (no_room_.count(asked_++) > 0) return absl::ResourceExhaustedError("no room (test)");
          tables_.assign(rows.size(), Table());
          blocks_.assign(rows.size(), PooledRows());
          stores_.resize(rows.size());
          for (size_t t = 0; t < rows.size(); ++t) {
            Table& table = tables_[t];
            PooledRows& block = blocks_[t];
            table.grads.assign(rows[t] * kDim, grad_);
            table.offsets.assign(batch + 1, 0);
            table.index.assign(ids[t], 0);
            table.row_reads.assign(rows[t] + 1, 0);
            table.readers.assign(ids[t], 0);
            block = PooledRows{rows[t],
                               ids[t],
                               nullptr,
                               table.offsets.data(),
                               table.index.data(),
                               table.row_reads.data(),
                               table.readers.data(),
                               table.grads.data()};
            if (!stored.empty() && stored[t].places > 0) {
              ++stored_blocks_;
              if (static_cast<int64_t>(stores_[t].size()) < stored[t].places * kDim) {
                stores_[t].resize(stored[t].places * kDim);
              }
              table.places.assign(rows[t], -1);
              table.fresh_places.assign(stored[t].fresh, -1);
              table.fresh_values.assign(stored[t].fresh * kDim, 0.f);
              block.places = table.places.data();
              block.fresh = stored[t].fresh;
              block.fresh_places = table.fresh_places.data();
              block.fresh_values = table.fresh_values.data();
              rows_read_ += rows[t];
              rows_sent_ += stored[t].fresh;
            } else {
              table.values.assign(rows[t] * kDim, 0.f);
              block.values = table.values.data();
            }
          }
          return &blocks_;
        };
  }

  // The last block's fresh rows, written to their places.
  void Land() {
    for (size_t t = 0; t < blocks_.size(); ++t) {
      const PooledRows& block = blocks_[t];
      for (int32_t i = 0; i < block.fresh; ++i) {
        ASSERT_GE(block.fresh_places[i], 0);
        ASSERT_LE((block.fresh_places[i] + 1) * kDim, static_cast<int64_t>(stores_[t].size()));
        std::copy_n(block.fresh_values + i * kDim, kDim,
                    stores_[t].begin() + block.fresh_places[i] * kDim);
      }
    }
  }
  // The values of the first row example `example` reads from table 0, as
  // the device would pool them (after Land).
  std::vector<float> FirstRowOf(int64_t example) const {
    const PooledRows& block = blocks_[0];
    const int32_t row = block.index[block.offsets[example]];
    const float* values = block.places != nullptr ? stores_[0].data() + block.places[row] * kDim
                                                  : block.values + row * kDim;
    return {values, values + kDim};
  }
  int asked() const { return asked_; }
  // Blocks of stored tables, the rows they read and those sent with them.
  int stored_blocks() const { return stored_blocks_; }
  int64_t rows_read() const { return rows_read_; }
  int64_t rows_sent() const { return rows_sent_; }

 private:
  struct Table {
    std::vector<float> values, grads, fresh_values;
    std::vector<int32_t> offsets, index, row_reads, readers, places, fresh_places;
  };
  const float grad_;
  const std::set<int> no_room_;
  int asked_ = 0;
  int stored_blocks_ = 0;
  int64_t rows_read_ = 0, rows_sent_ = 0;
  std::vector<Table> tables_;
  std::vector<PooledRows> blocks_;
  std::vector<std::vector<float>> stores_;  // Per table, by place.
};

// Every table kept and the rows pooled on the device: the stage is given
// batches two ahead (as the trainer does), each step's rows are taken into
// the cache by the task of the batch after it and stay on the device,
// which is sent only the rows taken since the block before; they are at
// most the staleness behind. A block the device has no room for leaves
// that step and the ones after it pooled here, still within the staleness.
TEST_F(InputStageTest, EveryTableKeptPlansTwoAheadAndKeepsItsRowsOnTheDevice) {
  Host(3);
  constexpr int kSteps = 12, kNoRoom = 8;
  FakeDeviceBlock device(/*grad=*/0.25f, /*no_room=*/{kNoRoom});
  const InputStage::PoolOnDevice lay = device.Lay();
  const std::vector<data::Batch> batches = Batches(kSteps);
  std::vector<float> staging(4 * model_->shape().input_size);
  int behind = 0;
  int64_t planned = 0;  // The last step planned ahead.
  for (int step = 0; step < kSteps; ++step) {
    // The shards' rows between steps: the pushes so far applied.
    ASSERT_TRUE(stage_->Finish().ok());
    RecordVersion();
    absl::StatusOr<const float*> features =
        stage_->Features(step, batches[step], step, 0, false, staging.data(), lay);
    ASSERT_TRUE(features.ok()) << features.status();
    EXPECT_EQ(stage_->plan_depth(), 2);
    std::vector<float> read;
    if (step < kNoRoom) {
      EXPECT_EQ(*features, staging.data()) << "step " << step;
      ASSERT_TRUE(stage_->pooled_on_device()) << "step " << step;
      device.Land();
      read = device.FirstRowOf(0);
      const std::vector<float> second = device.FirstRowOf(1);
      read.insert(read.end(), second.begin(), second.end());
    } else {
      ASSERT_FALSE(stage_->pooled_on_device()) << "step " << step;
      read.assign(*features, *features + 2 * kDim);
      // The input gradient the push reads.
      ASSERT_TRUE(model_->TrainStep(*features, batches[step].labels.data(), 4, step).ok());
    }
    behind += ExpectWithin(read, step, 3);
    // Example 3's row is new every step (pulled ahead, at a place another
    // row may have left): as the shards hold it, no step has pushed it.
    const std::vector<float> fourth =
        step < kNoRoom ? device.FirstRowOf(3)
                       : std::vector<float>(*features + 3 * kDim, *features + 4 * kDim);
    EXPECT_EQ(fourth, ShardRow(3 + step)) << "step " << step;
    for (; planned < std::min<int64_t>(step + stage_->plan_depth(), kSteps); ++planned) {
      stage_->PlanAhead(planned + 1, &batches[planned + 1], planned + 1, 0);
    }
    ASSERT_TRUE(stage_->Exchange(step, *model_, &batches[step + 1], step + 1, 0).ok());
  }
  ASSERT_TRUE(stage_->Finish().ok());
  // Asked until it had no room; then the task before each step pooled it.
  EXPECT_EQ(device.asked(), kNoRoom + 1);
  EXPECT_EQ(device.stored_blocks(), kNoRoom);
  // Rows 1 and 2, read every step, went to the device only when pulled
  // again (at most every third step): fewer rows sent than read.
  EXPECT_LT(device.rows_sent(), device.rows_read() - kNoRoom);
  EXPECT_EQ(stage_->rows_to_device(), device.rows_sent());
  // Steps 1 to kSteps - 1 had their rows taken beside the step before.
  EXPECT_EQ(stage_->ahead_seconds().batches, kSteps);
  EXPECT_EQ(stage_->ahead_seconds().taken, kSteps - 1);
  EXPECT_EQ(stage_->ahead_seconds().pooled, kSteps - 1 - kNoRoom);
  EXPECT_GT(behind, 0);
  EXPECT_GT(stage_->rows_kept(), 0);
}

// Two ahead as the trainer drives it: nothing waited for between steps
// (each batch's pull still in flight when the next step's task takes it),
// each batch freed once its step has its input, the last step given no
// next batch (it takes its own rows).
TEST_F(InputStageTest, TwoAheadRunsToTheLastStepWithPullsInFlight) {
  Host(2);
  FakeDeviceBlock device(/*grad=*/0.5f);
  const InputStage::PoolOnDevice lay = device.Lay();
  constexpr int kSteps = 12;
  std::deque<std::unique_ptr<data::Batch>> ahead;
  auto batch_of = [](int64_t step) {
    return std::make_unique<data::Batch>(MakeBatch({{1}, {2}, {1, 2}, {3 + step}}));
  };
  std::vector<float> staging(4 * model_->shape().input_size);
  int64_t read = 0;  // Batches read: steps 0 .. read - 1.
  std::unique_ptr<data::Batch> current = batch_of(read++);
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) {
      current = std::move(ahead.front());
      ahead.pop_front();
    }
    absl::StatusOr<const float*> features =
        stage_->Features(step, *current, step, 0, false, staging.data(), lay);
    ASSERT_TRUE(features.ok()) << "step " << step << ": " << features.status();
    ASSERT_TRUE(stage_->pooled_on_device()) << "step " << step;
    while (static_cast<int64_t>(ahead.size()) < stage_->plan_depth() && read < kSteps) {
      ahead.push_back(batch_of(read));
      stage_->PlanAhead(read, ahead.back().get(), read, 0);
      ++read;
    }
    const data::Batch* next = step + 1 < kSteps ? ahead.front().get() : nullptr;
    ASSERT_TRUE(stage_->Exchange(step, *model_, next, step + 1, 0).ok()) << "step " << step;
  }
  ASSERT_TRUE(stage_->Finish().ok());
  EXPECT_EQ(stage_->plan_depth(), 2);
  EXPECT_EQ(device.asked(), kSteps);
  // Steps 1 .. kSteps - 2 taken beside the step before; 0 and the last by
  // their own step.
  EXPECT_EQ(stage_->ahead_seconds().batches, kSteps - 1);
  EXPECT_EQ(stage_->ahead_seconds().taken, kSteps - 2);
  EXPECT_GT(stage_->rows_kept(), 0);
  // Every step pushed its 3 rows' gradients once.
  EXPECT_EQ(stage_->rows_pushed(), 3 * kSteps);
}

// A store whose lone pulls (the prefetch lane's) can be made to fail, with
// an error not retried.
class FailablePulls : public ParameterShard {
 public:
  explicit FailablePulls(ParameterShard* shard) : shard_(shard) {}
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    return shard_->Push(request, payload);
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    if (fail.load()) return absl::FailedPreconditionError("shard refuses (test)");
    return shard_->Pull(request, deadline, payload);
  }
  // The push lane's calls go through (only the prefetch lane pulls alone).
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload) override {
    return shard_->PushPull(push, push_payload, pull, deadline, pull_payload);
  }
  std::atomic<bool> fail{false};

 private:
  ParameterShard* const shard_;
};

// Two ahead, a pull that fails beside the steps ends a later step with its
// error (no hang, no step trained on rows it lacks), and the stage still
// finishes and goes.
TEST_F(InputStageTest, TwoAheadAFailedPullEndsAStepWithItsError) {
  Host(3);
  std::vector<std::unique_ptr<FailablePulls>> failable;
  std::vector<ParameterShard*> shards;
  for (ParameterShard* shard : shards_) {
    failable.push_back(std::make_unique<FailablePulls>(shard));
    shards.push_back(failable.back().get());
  }
  auto stage = std::make_unique<InputStage>(model_->shape(), Options(), shards, kNever);
  FakeDeviceBlock device(/*grad=*/0.5f);
  const InputStage::PoolOnDevice lay = device.Lay();
  constexpr int kSteps = 12;
  const std::vector<data::Batch> batches = Batches(kSteps);
  std::vector<float> staging(4 * model_->shape().input_size);
  int64_t planned = 0;
  absl::Status failed;
  int step = 0;
  for (; step < kSteps && failed.ok(); ++step) {
    if (step == 4) {
      for (auto& shard : failable) shard->fail.store(true);
    }
    absl::StatusOr<const float*> features =
        stage->Features(step, batches[step], step, 0, false, staging.data(), lay);
    if (!features.ok()) {
      failed = features.status();
      break;
    }
    for (; planned < std::min<int64_t>(step + stage->plan_depth(), kSteps); ++planned) {
      stage->PlanAhead(planned + 1, &batches[planned + 1], planned + 1, 0);
    }
    failed = stage->Exchange(step, *model_, &batches[step + 1], step + 1, 0);
  }
  // From step 4 on, a step whose pull went out after the failure (the
  // planner's tasks may lag the steps: 4, 5 or 6) ends with it.
  EXPECT_GE(step, 4);
  EXPECT_LE(step, 6);
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << failed << " at step " << step;
  EXPECT_NE(failed.message().find("shard refuses"), std::string::npos) << failed;
  (void)stage->Finish();
  stage.reset();
}

}  // namespace
}  // namespace downpour
