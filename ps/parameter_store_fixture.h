// The fixture and helpers of ParameterStore's tests: a two-tensor model
// placed over two shards, pushes and pulls built by hand, and a store to
// run them against. Test-only.
#ifndef DOWNPOUR_PS_PARAMETER_STORE_FIXTURE_H_
#define DOWNPOUR_PS_PARAMETER_STORE_FIXTURE_H_

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/lr_schedule.h"
#include "ps/parameter_store.h"
#include "ps/request_dedup.h"
#include "spec/model_shape.h"

namespace downpour {
namespace store_test {

using ::testing::HasSubstr;
using Key = std::pair<int32_t, int32_t>;

constexpr char kJob[] = "job-1";

// The model of Spec(): tensor 0 is dense0/weight, 6 elements (He uniform,
// fan_in 2), in partitions 0/0 [0, 3) and 0/1 [3, 6), both on shard 0;
// tensor 1 is bn/gamma, 3 elements (ones), 1/0 [0, 2) on shard 0 and 1/1
// [2, 3) on shard 1.
constexpr char kModel[] = R"pb(
  input_shape: 2
  num_classes: 3
  layer {
    name: "dense0"
    dense { units: 3 no_bias: true }
  }
  layer {
    name: "bn"
    batch_norm {}
  }
  layer { softmax_cross_entropy {} }
)pb";

inline std::vector<ParamInfo> Params() {
  ModelSpec model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kModel, &model));
  return InferModel(model).value().params;
}

inline std::vector<PartitionPlacement> Placements() {
  auto make = [](int32_t t, int32_t p, int64_t offset, int64_t n, int32_t shard) {
    PartitionPlacement placement;
    placement.set_tensor_id(t);
    placement.set_partition(p);
    placement.set_offset(offset);
    placement.set_num_elements(n);
    placement.set_shard(shard);
    return placement;
  };
  return {make(0, 0, 0, 3, 0), make(0, 1, 3, 3, 0), make(1, 0, 0, 2, 0), make(1, 1, 2, 1, 1)};
}

inline JobSpec Spec(ConsistencySpec::Mode mode, int num_workers, int backup_workers = 0,
                    OptimizerSpec::Kind optimizer = OptimizerSpec::SGD) {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kModel, spec.mutable_model()));
  spec.mutable_dataset()->set_train_files("train-*");
  spec.mutable_dataset()->set_test_files("test-*");
  spec.mutable_dataset()->set_batch_size(4);
  spec.set_num_shards(2);
  spec.set_steps(100);
  spec.set_num_workers(num_workers);
  spec.set_seed(7);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_consistency()->set_backup_workers(backup_workers);
  spec.mutable_optimizer()->set_kind(optimizer);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  return spec;
}

inline std::vector<float> Initial(int32_t tensor_id, int64_t offset, int64_t n) {
  std::vector<float> values(n);
  InitParamRange(Params()[tensor_id], 7, offset, n, values.data());
  return values;
}

struct Grad {
  Key key;
  std::vector<float> values;
};

// Shard 0's partitions of the model of Spec().
inline const std::vector<Key> kShardZero = {{0, 0}, {0, 1}, {1, 0}};

// Gradients for `keys` (of kShardZero): element i of each is scale (i + 1).
inline std::vector<Grad> ShardZeroGrads(const std::vector<Key>& keys, float scale) {
  const std::map<Key, int64_t> sizes = {{{0, 0}, 3}, {{0, 1}, 3}, {{1, 0}, 2}};
  std::vector<Grad> grads;
  for (const Key& key : keys) {
    std::vector<float> values(sizes.at(key));
    for (size_t i = 0; i < values.size(); ++i) values[i] = scale * static_cast<float>(i + 1);
    grads.push_back({key, std::move(values)});
  }
  return grads;
}

inline PushRequest MakePush(int rank, int64_t sequence, int64_t step,
                            const std::vector<Grad>& grads, const std::string& worker_id = "",
                            int64_t incarnation = 1) {
  PushRequest request;
  request.set_job_id(kJob);
  request.set_worker_rank(rank);
  request.mutable_request_id()->set_worker_id(worker_id.empty() ? absl::StrCat("w", rank)
                                                                : worker_id);
  request.mutable_request_id()->set_incarnation(incarnation);
  request.mutable_request_id()->set_sequence(sequence);
  request.set_step(step);
  for (const Grad& g : grads) {
    PartitionHeader* header = request.add_partitions();
    header->mutable_key()->set_tensor_id(g.key.first);
    header->mutable_key()->set_partition(g.key.second);
    header->set_dtype(FLOAT32);
    header->set_num_elements(g.values.size());
    request.mutable_payload()->append(reinterpret_cast<const char*>(g.values.data()),
                                      g.values.size() * sizeof(float));
  }
  return request;
}

inline PullRequest MakePull(std::vector<Key> keys, int64_t min_version = 0, int64_t min_steps = 0) {
  PullRequest request;
  request.set_job_id(kJob);
  for (const Key& k : keys) {
    PartitionKey* key = request.add_keys();
    key->set_tensor_id(k.first);
    key->set_partition(k.second);
  }
  request.set_min_version(min_version);
  request.set_min_worker_steps(min_steps);
  request.set_dtype(FLOAT32);
  return request;
}

struct Pulled {
  std::vector<float> values;
  int64_t version = 0;
};

inline std::map<Key, Pulled> Decode(const PullResponse& response) {
  std::map<Key, Pulled> out;
  size_t offset = 0;
  for (const PartitionHeader& header : response.partitions()) {
    Pulled& p = out[{header.key().tensor_id(), header.key().partition()}];
    EXPECT_EQ(header.dtype(), FLOAT32);
    p.version = header.version();
    p.values.resize(header.num_elements());
    std::memcpy(p.values.data(), response.payload().data() + offset,
                header.num_elements() * sizeof(float));
    offset += header.num_elements() * sizeof(float);
  }
  EXPECT_EQ(offset, response.payload().size());
  return out;
}

inline absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

class ParameterStoreTest : public ::testing::Test {
 protected:
  void AddJob(const JobSpec& spec) {
    absl::Status added = store_.AddJob(kJob, spec, 0, Placements());
    ASSERT_TRUE(added.ok()) << added;
  }
  Pulled PullOne(Key key, int64_t min_version = 0) {
    absl::StatusOr<PullResponse> response = store_.Pull(MakePull({key}, min_version), Soon());
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    return Decode(*response)[key];
  }
  // Starts `request` on a thread of its own, which expects it to succeed and
  // then notifies `done`.
  std::thread PullInBackground(PullRequest request, absl::Notification* done) {
    return std::thread([this, request = std::move(request), done] {
      absl::StatusOr<PullResponse> r = store_.Pull(request, Soon());
      EXPECT_TRUE(r.ok()) << r.status();
      done->Notify();
    });
  }
  PushResponse PushOk(const PushRequest& request) {
    absl::StatusOr<PushResponse> response = store_.Push(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : PushResponse();
  }

  ParameterStore store_;
};

inline void ExpectNear(const std::vector<float>& actual, const std::vector<float>& expected,
                       double tolerance = 1e-6) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tolerance) << "element " << i;
  }
}

}  // namespace store_test
}  // namespace downpour

#endif  // DOWNPOUR_PS_PARAMETER_STORE_FIXTURE_H_
