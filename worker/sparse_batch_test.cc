#include "worker/sparse_batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/work_pool.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "spec/sparse_ids.h"

namespace downpour {
namespace {

ModelShape Shape() {
  ModelSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kTwoSparseTablesSpec, &spec));
  auto shape = InferModel(spec);
  EXPECT_TRUE(shape.ok()) << shape.status();
  return *shape;
}

// Three examples: ids {5, 7, 5}, {}, {7, 9}; dense values 0.1 .. 0.6.
std::vector<data::InputBatch> Inputs() {
  std::vector<data::InputBatch> inputs(2);
  inputs[0].values = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  inputs[1].ids = {5, 7, 5, 7, 9};
  inputs[1].offsets = {0, 3, 3, 5};
  return inputs;
}

// Distinct pseudo-random values for every (table, row).
float RowValue(int table, int64_t row, int64_t d) {
  return std::sin(0.37f * static_cast<float>(row) + 1.3f * static_cast<float>(table) +
                  0.71f * static_cast<float>(d));
}

struct Pulled {
  std::vector<std::vector<std::vector<float>>> storage;  // [table][shard]
  std::vector<std::vector<const float*>> pointers;
};

Pulled Pull(const SparseBatch& plan, const ModelShape& shape) {
  Pulled p;
  p.storage.resize(plan.num_tables());
  p.pointers.resize(plan.num_tables());
  for (int t = 0; t < plan.num_tables(); ++t) {
    const int64_t dim = shape.sparse_tables[t].dim;
    for (int s = 0; s < plan.num_shards(); ++s) {
      std::vector<float> v;
      for (int64_t row : plan.rows(t, s)) {
        for (int64_t d = 0; d < dim; ++d) v.push_back(RowValue(t, row, d));
      }
      p.storage[t].push_back(std::move(v));
    }
    for (const auto& v : p.storage[t]) p.pointers[t].push_back(v.data());
  }
  return p;
}

TEST(SparseBatchTest, RowsAreDistinctAndOnTheirShards) {
  const ModelShape shape = Shape();
  auto plan = SparseBatch::Plan(shape, Inputs(), 3, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ids_read(), 10);
  EXPECT_EQ(plan->distinct_rows(), 6);  // {5, 7, 9} in each table.
  for (int t = 0; t < 2; ++t) {
    std::vector<int64_t> all;
    for (int s = 0; s < 3; ++s) {
      for (int64_t row : plan->rows(t, s)) {
        EXPECT_EQ(SparseShardOf(row, 3), s);
        all.push_back(row);
      }
    }
    std::vector<int64_t> expected;
    for (int64_t id : {5, 7, 9}) expected.push_back(*SparseRowOf(shape.sparse_tables[t], id));
    std::sort(all.begin(), all.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(all, expected);
  }
}

TEST(SparseBatchTest, PoolsBySumAndMean) {
  const ModelShape shape = Shape();
  auto plan = SparseBatch::Plan(shape, Inputs(), 3, 2);
  ASSERT_TRUE(plan.ok());
  const Pulled pulled = Pull(*plan, shape);
  std::vector<float> features(3 * shape.input_size, -1.f);
  PackDenseInputs(shape, Inputs(), 3, features.data());
  plan->Pool(pulled.pointers, features.data());
  // Slots: d [2] at 0, sum [3] at 2, mean [2] at 5; slot-major.
  EXPECT_EQ(features[0], 0.1f);
  EXPECT_EQ(features[5], 0.6f);
  const int64_t row9 = *SparseRowOf(shape.sparse_tables[1], 9);
  const int64_t row7 = *SparseRowOf(shape.sparse_tables[1], 7);
  for (int d = 0; d < 3; ++d) {
    EXPECT_FLOAT_EQ(features[3 * 2 + 0 * 3 + d], 2 * RowValue(0, 5, d) + RowValue(0, 7, d));
    EXPECT_EQ(features[3 * 2 + 1 * 3 + d], 0.f);  // No ids.
    EXPECT_FLOAT_EQ(features[3 * 2 + 2 * 3 + d], RowValue(0, 7, d) + RowValue(0, 9, d));
  }
  for (int d = 0; d < 2; ++d) {
    EXPECT_FLOAT_EQ(features[3 * 5 + 2 * 2 + d], (RowValue(1, row7, d) + RowValue(1, row9, d)) / 2);
  }
}

TEST(SparseBatchTest, TableByTableOnAPoolGivesTheSameBits) {
  // Planning, pooling and row gradients run per table on a pool's threads
  // (the trainer's, on a machine with cores to spare) as on one thread.
  const ModelShape shape = Shape();
  std::vector<float> input_grad(3 * shape.input_size);
  for (size_t i = 0; i < input_grad.size(); ++i) input_grad[i] = std::cos(0.3f * i);
  auto run = [&](WorkPool* pool) {
    auto plan = SparseBatch::Plan(shape, Inputs(), 3, 2, pool);
    EXPECT_TRUE(plan.ok());
    const Pulled pulled = Pull(*plan, shape);
    std::vector<float> features(3 * shape.input_size, -1.f);
    PackDenseInputs(shape, Inputs(), 3, features.data());
    plan->Pool(pulled.pointers, features.data(), pool);
    std::vector<std::vector<std::vector<float>>> grads;
    plan->RowGradients(input_grad.data(), &grads, pool);
    std::vector<std::vector<int64_t>> rows;
    for (int t = 0; t < plan->num_tables(); ++t) {
      for (int s = 0; s < plan->num_shards(); ++s) rows.push_back(plan->rows(t, s));
    }
    return std::make_tuple(rows, features, grads);
  };
  WorkPool pool(3);
  EXPECT_EQ(run(&pool), run(nullptr));
}

TEST(SparseBatchTest, OutsideAnExactVocabularyIsRefused) {
  std::vector<data::InputBatch> inputs = Inputs();
  inputs[1].ids[3] = 100;
  auto plan = SparseBatch::Plan(Shape(), inputs, 3, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("id 100 is outside table sum/table"), std::string::npos);
}

// The rows' gradients a model step gives through RowGradients match central
// finite differences of the loss in each row value.
TEST(SparseBatchTest, RowGradientsMatchFiniteDifferences) {
  const ModelShape shape = Shape();
  ModelSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kTwoSparseTablesSpec, &spec));
  auto created = Model::Create(spec, 5);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  const std::vector<data::InputBatch> inputs = Inputs();
  auto plan = SparseBatch::Plan(shape, inputs, 3, 2);
  ASSERT_TRUE(plan.ok());
  Pulled pulled = Pull(*plan, shape);
  const std::vector<int32_t> labels = {1, 0, 0};
  std::vector<float> features(3 * shape.input_size);
  auto fill = [&] {
    PackDenseInputs(shape, inputs, 3, features.data());
    plan->Pool(pulled.pointers, features.data());
  };
  fill();
  ASSERT_TRUE(model.TrainStep(features.data(), labels.data(), 3, 0).ok());
  std::vector<std::vector<std::vector<float>>> grads;
  plan->RowGradients(model.input_grad(), &grads);
  auto loss = [&] {
    fill();
    auto r = model.Evaluate(features.data(), labels.data(), 3);
    EXPECT_TRUE(r.ok());
    return r->loss_sum / 3;
  };
  int checked = 0;
  for (int t = 0; t < 2; ++t) {
    for (int s = 0; s < 2; ++s) {
      std::vector<float>& values = pulled.storage[t][s];
      ASSERT_EQ(grads[t][s].size(), values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        const float saved = values[i], eps = 1e-3f;
        values[i] = saved + eps;
        const double plus = loss();
        values[i] = saved - eps;
        const double minus = loss();
        values[i] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        const double a = grads[t][s][i];
        EXPECT_LT(std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1e-2}), 1e-2)
            << "table " << t << " shard " << s << " element " << i << ": " << a << " vs "
            << numeric;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 3 * 3 + 3 * 2);
}

// A larger batch of both tables (an exact and a hashed vocabulary, SUM and
// MEAN; examples of none to nine ids, rows read many times) over 3 shards.
std::vector<data::InputBatch> RandomInputs(int64_t batch) {
  std::mt19937 rng(7);
  std::vector<data::InputBatch> inputs(2);
  inputs[0].values.resize(batch * 2, 0.5f);
  inputs[1].offsets.push_back(0);
  for (int64_t b = 0; b < batch; ++b) {
    const int n = static_cast<int>(rng() % 10);
    for (int k = 0; k < n; ++k) inputs[1].ids.push_back(static_cast<int64_t>(rng() % 40));
    inputs[1].offsets.push_back(static_cast<int64_t>(inputs[1].ids.size()));
  }
  return inputs;
}

// WritePooled's block read as kernels::PooledTable says (each example's
// ids name their rows; each row's readers are the examples reading it, in
// id order), summed in that order, gives Pool's features and, through
// RowGradientsFrom, RowGradients' row gradients bit for bit: the block
// means what kernels::PooledTable says (the kernels' own tests pin them).
TEST(SparseBatchTest, ThePooledBlockGivesTheHostsBits) {
  const ModelShape shape = Shape();
  constexpr int64_t kBatch = 64;
  const std::vector<data::InputBatch> inputs = RandomInputs(kBatch);
  WorkPool pool(2);
  auto plan = SparseBatch::Plan(shape, inputs, kBatch, 3, &pool);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Pulled pulled = Pull(*plan, shape);
  std::vector<float> input_grad(kBatch * shape.input_size);
  for (size_t i = 0; i < input_grad.size(); ++i) input_grad[i] = std::cos(0.3f * i);
  std::vector<float> expected(kBatch * shape.input_size, 0.f);
  plan->Pool(pulled.pointers, expected.data());
  std::vector<std::vector<std::vector<float>>> expected_grads;
  plan->RowGradients(input_grad.data(), &expected_grads);

  const std::vector<int32_t> rows = plan->table_rows(), ids = plan->table_ids();
  const int tables = plan->num_tables();
  EXPECT_EQ(std::accumulate(rows.begin(), rows.end(), int64_t{0}), plan->distinct_rows());
  EXPECT_EQ(std::accumulate(ids.begin(), ids.end(), int64_t{0}), plan->ids_read());
  std::vector<std::vector<float>> values(tables), grads(tables);
  std::vector<std::vector<int32_t>> offsets(tables), index(tables), row_reads(tables),
      readers(tables);
  std::vector<PooledRows> pooled(tables);
  for (int t = 0; t < tables; ++t) {
    const int64_t dim = shape.sparse_tables[t].dim;
    values[t].resize(rows[t] * dim);
    offsets[t].resize(kBatch + 1);
    index[t].resize(ids[t]);
    row_reads[t].resize(rows[t] + 1);
    readers[t].resize(ids[t]);
    pooled[t] = {rows[t],           ids[t],          values[t].data(),
                 offsets[t].data(), index[t].data(), row_reads[t].data(),
                 readers[t].data()};
  }
  WorkPool::ForEach(&pool, plan->num_tables(),
                    [&](int t) { plan->WritePooled(t, pulled.pointers[t], &pooled[t]); });
  std::vector<float> features(kBatch * shape.input_size, 0.f);
  for (int t = 0; t < tables; ++t) {
    const int64_t dim = shape.sparse_tables[t].dim;
    const bool mean = shape.sparse_tables[t].mean;
    const int64_t slot = kBatch * shape.input_slots[shape.sparse_tables[t].slot].offset;
    const auto scale = [&](int64_t b) {
      const int32_t n = offsets[t][b + 1] - offsets[t][b];
      return mean && n > 1 ? 1.f / static_cast<float>(n) : 1.f;
    };
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t d = 0; d < dim; ++d) {
        float sum = 0.f;
        for (int32_t k = offsets[t][b]; k < offsets[t][b + 1]; ++k) {
          sum += values[t][index[t][k] * dim + d];
        }
        features[slot + b * dim + d] = scale(b) != 1.f ? sum * scale(b) : sum;
      }
    }
    grads[t].resize(rows[t] * dim);
    for (int32_t r = 0; r < rows[t]; ++r) {
      for (int64_t d = 0; d < dim; ++d) {
        float sum = 0.f;
        for (int32_t k = row_reads[t][r]; k < row_reads[t][r + 1]; ++k) {
          const int32_t b = readers[t][k];
          sum += scale(b) * input_grad[slot + b * dim + d];
        }
        grads[t][r * dim + d] = sum;
      }
    }
    pooled[t].grads = grads[t].data();
  }
  EXPECT_EQ(features, expected);
  std::vector<std::vector<std::vector<float>>> got;
  plan->RowGradientsFrom(pooled, &got, &pool);
  EXPECT_EQ(got, expected_grads);
}

}  // namespace
}  // namespace downpour
