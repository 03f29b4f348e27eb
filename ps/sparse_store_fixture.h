// What the tests of a job's sparse tables on a shard share (sparse_store_test,
// sparse_checkpoint_test): a job with two tables, pushes and pulls of rows
// as workers make them, the rows to expect, and a store hosting the job as
// shard 0 of 2.
#ifndef DOWNPOUR_PS_SPARSE_STORE_FIXTURE_H_
#define DOWNPOUR_PS_SPARSE_STORE_FIXTURE_H_

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/memory_budget.h"
#include "ps/parameter_store.h"
#include "ps/sparse_table.h"
#include "spec/sparse_ids.h"

namespace downpour {
namespace sparse_testing {

inline constexpr char kJob[] = "job-s";
inline constexpr int kShards = 2;
inline constexpr uint64_t kSeed = 11;
inline constexpr float kLearningRate = 0.5f;

// Two dense features and two sparse tables joined into one dense layer:
// table 0 "emb/table" (dim 4, vocab 1000, the job's SGD) and table 1
// "tags/table" (dim 2, vocab 50, `tags` fields). Parameters: fc/weight [8, 2]
// (tensor 0) and fc/bias [2] (tensor 1).
inline JobSpec Spec(ConsistencySpec::Mode mode, int num_workers, const std::string& tags = "") {
  constexpr char kSpec[] = R"pb(
    model {
      num_classes: 2
      inputs {
        name: "x"
        features: [ "a", "b" ]
      }
      inputs { name: "c" kind: SPARSE }
      inputs { name: "t" kind: SPARSE }
      layer {
        name: "emb"
        inputs: "c"
        embedding { sparse: true vocab_size: 1000 dim: 4 }
      }
      layer {
        name: "tags"
        inputs: "t"
        embedding { sparse: true vocab_size: 50 dim: 2 }
      }
      layer {
        name: "joined"
        inputs: [ "x", "emb", "tags" ]
        concat {}
      }
      layer {
        name: "fc"
        dense { units: 2 }
      }
      layer { softmax_cross_entropy {} }
    }
    dataset { train_files: "train-*" test_files: "test-*" batch_size: 4 }
    steps: 100
  )pb";
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kSpec, &spec));
  EXPECT_TRUE(google::protobuf::TextFormat::MergeFromString(
      tags, spec.mutable_model()->mutable_layer(1)->mutable_embedding()));
  spec.set_num_shards(kShards);
  spec.set_num_workers(num_workers);
  spec.set_seed(kSeed);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(kLearningRate);
  return spec;
}

// fc/weight (16 elements) and fc/bias (2), on `shard`.
inline std::vector<PartitionPlacement> Placements(int shard) {
  std::vector<PartitionPlacement> out(2);
  for (int t = 0; t < 2; ++t) {
    out[t].set_tensor_id(t);
    out[t].set_partition(0);
    out[t].set_num_elements(t == 0 ? 16 : 2);
    out[t].set_shard(shard);
  }
  return out;
}

inline constexpr int64_t kDim[] = {4, 2};
inline const char* const kTableName[] = {"emb/table", "tags/table"};

// The first `n` rows of table 0 held by shard `shard`, from `from`.
inline std::vector<int64_t> RowsOf(int shard, int n, int64_t from = 0) {
  std::vector<int64_t> rows;
  for (int64_t row = from; static_cast<int>(rows.size()) < n; ++row) {
    if (SparseShardOf(row, kShards) == shard) rows.push_back(row);
  }
  return rows;
}

inline std::vector<float> InitialRow(int table, int64_t id) {
  std::vector<float> row(kDim[table]);
  InitSparseRow(kSeed, kTableName[table], id, 1.f / std::sqrt(static_cast<float>(kDim[table])),
                kDim[table], row.data());
  return row;
}

struct Rows {
  int table = 0;
  std::vector<int64_t> ids;
  std::vector<float> grads;  // ids.size() * dim.
};

// A push of rows (no partitions unless `dense` is given: fc/bias's gradient).
inline PushRequest MakePush(int rank, int64_t sequence, int64_t step, const std::vector<Rows>& rows,
                            const std::vector<float>& dense = {}) {
  PushRequest request;
  request.set_job_id(kJob);
  request.set_worker_rank(rank);
  request.mutable_request_id()->set_worker_id(absl::StrCat("w", rank));
  request.mutable_request_id()->set_incarnation(1);
  request.mutable_request_id()->set_sequence(sequence);
  request.set_step(step);
  if (!dense.empty()) {
    PartitionHeader* header = request.add_partitions();
    header->mutable_key()->set_tensor_id(1);
    header->set_dtype(FLOAT32);
    header->set_num_elements(dense.size());
    request.mutable_payload()->append(reinterpret_cast<const char*>(dense.data()),
                                      dense.size() * sizeof(float));
  }
  for (const Rows& r : rows) {
    SparseRows* sparse = request.add_sparse();
    sparse->set_table(r.table);
    sparse->set_dtype(FLOAT32);
    for (int64_t id : r.ids) sparse->add_ids(id);
    request.mutable_payload()->append(reinterpret_cast<const char*>(r.grads.data()),
                                      r.grads.size() * sizeof(float));
  }
  return request;
}

inline PullRequest MakePull(int table, const std::vector<int64_t>& ids, int64_t min_version = 0) {
  PullRequest request;
  request.set_job_id(kJob);
  request.set_min_version(min_version);
  SparseRows* rows = request.add_sparse();
  rows->set_table(table);
  for (int64_t id : ids) rows->add_ids(id);
  return request;
}

// The rows of a pull's response, by id (the pull asked for one table).
inline std::map<int64_t, std::vector<float>> RowsIn(const PullResponse& response,
                                                    size_t offset = 0) {
  std::map<int64_t, std::vector<float>> out;
  const std::string& bytes = response.payload();
  for (const SparseRows& rows : response.sparse()) {
    EXPECT_EQ(rows.dtype(), FLOAT32);
    const int64_t dim = kDim[rows.table()];
    for (int64_t id : rows.ids()) {
      std::vector<float>& row = out[id];
      row.resize(dim);
      std::memcpy(row.data(), bytes.data() + offset, dim * sizeof(float));
      offset += dim * sizeof(float);
    }
  }
  EXPECT_EQ(offset, bytes.size());
  return out;
}

inline absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// The row after SGD steps with gradients `grads` at learning rate
// kLearningRate (the reference update the tables run).
inline std::vector<float> AfterSgd(std::vector<float> row,
                                   const std::vector<std::vector<float>>& grads,
                                   float learning_rate = kLearningRate) {
  OptimizerHyperparams hp;
  hp.learning_rate = learning_rate;
  for (const std::vector<float>& g : grads) {
    kernels::cpu::SgdUpdate(hp, g.data(), static_cast<int64_t>(row.size()), row.data());
  }
  return row;
}

class SparseStoreTest : public ::testing::Test {
 protected:
  // Hosts the job as shard 0 of 2, with the dense partitions on `dense_shard`.
  void Host(const JobSpec& spec, int dense_shard = 1) {
    absl::Status added = store_.AddJob(kJob, spec, 0, Placements(dense_shard));
    ASSERT_TRUE(added.ok()) << added;
  }
  PushResponse PushOk(const PushRequest& request) {
    absl::StatusOr<PushResponse> response = store_.Push(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : PushResponse();
  }
  std::map<int64_t, std::vector<float>> PullRows(int table, const std::vector<int64_t>& ids,
                                                 int64_t min_version = 0) {
    absl::StatusOr<PullResponse> response = store_.Pull(MakePull(table, ids, min_version), Soon());
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    EXPECT_EQ(response->partitions_size(), 0);
    return RowsIn(*response);
  }

  MemoryBudget budget_{0};
  ParameterStore store_{&budget_};
};

}  // namespace sparse_testing
}  // namespace downpour

#endif  // DOWNPOUR_PS_SPARSE_STORE_FIXTURE_H_
