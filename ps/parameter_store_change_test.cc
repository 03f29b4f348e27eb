// Pulls of INT8 changes (PullRequest.change_dtype): the shard's published
// copy, what each worker is sent of it, and int8 gradient pushes.
#include <cstring>
#include <map>
#include <vector>

#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "ps/parameter_store_fixture.h"

namespace downpour {
namespace store_test {
namespace {

// What a worker holds of shard 0's partitions: the copy and its name.
struct Held {
  std::map<Key, std::vector<float>> values;
  std::map<Key, std::pair<uint64_t, int64_t>> copy;
};

PullRequest ChangePull(const Held& held, int64_t min_version) {
  PullRequest request = MakePull(kShardZero, min_version);
  request.set_change_dtype(INT8);
  for (const Key& key : kShardZero) {
    auto it = held.copy.find(key);
    request.add_held_lineage(it == held.copy.end() ? 0 : it->second.first);
    request.add_held_version(it == held.copy.end() ? -1 : it->second.second);
  }
  return request;
}

// Applies a change pull's answer to `held` as a worker does; returns how
// many partitions came as changes.
int Apply(const PullResponse& response, Held* held) {
  int changes = 0;
  size_t offset = 0;
  for (const PartitionHeader& header : response.partitions()) {
    const Key key(header.key().tensor_id(), header.key().partition());
    const int64_t n = header.num_elements();
    std::vector<float>& values = held->values[key];
    EXPECT_NE(header.lineage(), 0u);
    if (header.change()) {
      EXPECT_EQ(header.dtype(), INT8);
      EXPECT_EQ(header.lineage(), held->copy[key].first);
      EXPECT_EQ(header.base_version(), held->copy[key].second);
      AddInt8(response.payload().data() + offset, n, values.data());
      offset += WireBytes(WireDtype::kInt8, n);
      ++changes;
    } else {
      EXPECT_EQ(header.dtype(), FLOAT32);
      values.resize(n);
      std::memcpy(values.data(), response.payload().data() + offset, n * sizeof(float));
      offset += n * sizeof(float);
    }
    held->copy[key] = {header.lineage(), header.version()};
  }
  EXPECT_EQ(offset, response.payload().size());
  return changes;
}

// A spec of the fixture's pulled as INT8 changes.
JobSpec Int8Spec(int num_workers, OptimizerSpec::Kind optimizer = OptimizerSpec::SGD) {
  JobSpec spec = Spec(ConsistencySpec::SYNC, num_workers, 0, optimizer);
  spec.set_parameter_wire_dtype(INT8);
  return spec;
}

class ChangePullTest : public ParameterStoreTest {
 protected:
  PullResponse PullOk(const PullRequest& request) {
    absl::StatusOr<PullResponse> response = store_.Pull(request, Soon());
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : PullResponse();
  }
};

TEST_F(ChangePullTest, WorkersHoldingTheCopyGetTheSameChangeAndStayEqual) {
  AddJob(Int8Spec(2, OptimizerSpec::ADAM));
  Held a, b;
  // First pulls: the copy whole, the values as they are.
  EXPECT_EQ(Apply(PullOk(ChangePull(a, 0)), &a), 0);
  EXPECT_EQ(Apply(PullOk(ChangePull(b, 0)), &b), 0);
  for (const Key& key : kShardZero) EXPECT_EQ(a.values[key], PullOne(key).values);
  for (int step = 0; step < 5; ++step) {
    PushOk(MakePush(0, step + 1, step, ShardZeroGrads(kShardZero, 0.1f * (step + 1))));
    PushOk(MakePush(1, step + 1, step, ShardZeroGrads(kShardZero, -0.03f)));
    const PullRequest request_a = ChangePull(a, step + 1);
    const PullResponse answer_a = PullOk(request_a);
    const PullResponse answer_b = PullOk(ChangePull(b, step + 1));
    // One change a version, the same bytes for every worker; a retried
    // pull (the answer lost) gets them again.
    EXPECT_EQ(answer_a.payload(), answer_b.payload());
    EXPECT_EQ(PullOk(request_a).payload(), answer_a.payload());
    EXPECT_LT(answer_a.payload().size(), 8 * sizeof(float));
    EXPECT_EQ(Apply(answer_a, &a), 3);
    EXPECT_EQ(Apply(answer_b, &b), 3);
    for (const Key& key : kShardZero) {
      EXPECT_EQ(a.values[key], b.values[key]);
      EXPECT_EQ(a.copy[key].second, step + 1);
      // The copy trails the values by one change's rounding.
      ExpectNear(a.values[key], PullOne(key).values, 0.01);
    }
  }
  // A worker holding an older copy (or none, or another lineage) gets it
  // whole: exactly what the others hold.
  Held stale = a;
  for (auto& [key, copy] : stale.copy) copy.second -= 2;
  Held other = a;
  for (auto& [key, copy] : other.copy) copy.first ^= 1;
  for (Held* held : {&stale, &other}) {
    EXPECT_EQ(Apply(PullOk(ChangePull(*held, 5)), held), 0);
    for (const Key& key : kShardZero) EXPECT_EQ(held->values[key], a.values[key]);
  }
}

TEST_F(ChangePullTest, ARestoreStartsANewCopy) {
  AddJob(Int8Spec(1));
  Held held;
  Apply(PullOk(ChangePull(held, 0)), &held);
  PushOk(MakePush(0, 1, 0, ShardZeroGrads(kShardZero, 0.1f)));
  ShardSnapshot snapshot;
  snapshot.step = 1;
  snapshot.sync = true;
  for (const Key& key : kShardZero) {
    PartitionSnapshot partition;
    partition.tensor_id = key.first;
    partition.partition = key.second;
    partition.offset = key == Key(0, 1) ? 3 : 0;
    partition.version = 1;
    partition.values = PullOne(key).values;
    for (float& v : partition.values) v += 1.f;
    snapshot.partitions.push_back(partition);
  }
  ASSERT_TRUE(store_.Restore(kJob, snapshot).ok());
  const Held before = held;
  EXPECT_EQ(Apply(PullOk(ChangePull(held, 1)), &held), 0);
  for (const Key& key : kShardZero) {
    EXPECT_NE(held.copy[key].first, before.copy.at(key).first);
    EXPECT_EQ(held.values[key], PullOne(key).values);
  }
}

TEST_F(ChangePullTest, ChangesAreForPullsOfTheValuesAsTheyAre) {
  AddJob(Int8Spec(1));
  auto code = [&](const PullRequest& request) { return store_.Pull(request, Soon()).status(); };
  PullRequest exact = ChangePull(Held(), 0);
  exact.set_exact_version(true);
  EXPECT_EQ(code(exact).code(), absl::StatusCode::kInvalidArgument) << code(exact);
  PullRequest reduced = ChangePull(Held(), 0);
  reduced.add_reduced_tensor_ids(0);
  reduced.set_reduced_dtype(BFLOAT16);
  EXPECT_EQ(code(reduced).code(), absl::StatusCode::kInvalidArgument);
  PullRequest uneven = ChangePull(Held(), 0);
  uneven.add_held_version(3);
  EXPECT_EQ(code(uneven).code(), absl::StatusCode::kInvalidArgument);
  PullRequest bf16 = ChangePull(Held(), 0);
  bf16.set_change_dtype(BFLOAT16);
  EXPECT_EQ(code(bf16).code(), absl::StatusCode::kInvalidArgument);
  PullRequest with_rows = ChangePull(Held(), 0);
  with_rows.add_sparse()->set_table(0);
  EXPECT_EQ(code(with_rows).code(), absl::StatusCode::kInvalidArgument);
  PullRequest narrow_int8 = MakePull({{0, 0}});
  narrow_int8.add_reduced_tensor_ids(0);
  narrow_int8.set_reduced_dtype(INT8);
  EXPECT_EQ(code(narrow_int8).code(), absl::StatusCode::kInvalidArgument);
}

// Only a job pulled as INT8 has the copy's memory reserved; ASYNC and SSP
// jobs cannot be one.
TEST_F(ChangePullTest, OnlyAJobPulledAsInt8HasChanges) {
  AddJob(Spec(ConsistencySpec::SYNC, 2));
  absl::Status refused = store_.Pull(ChangePull(Held(), 0), Soon()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("parameter_wire_dtype is INT8"));
  JobSpec async = Spec(ConsistencySpec::ASYNC, 2);
  async.set_parameter_wire_dtype(INT8);
  absl::Status added = store_.AddJob("async-int8", async, 0, Placements());
  EXPECT_EQ(added.code(), absl::StatusCode::kInvalidArgument) << added;
  EXPECT_THAT(added.message(), HasSubstr("SYNC"));
}

TEST_F(ChangePullTest, AnInt8PushAppliesWhatItDecodesTo) {
  // SGD, one worker: the step applies the decoded gradient.
  AddJob(Spec(ConsistencySpec::SYNC, 1));
  std::vector<Grad> grads = ShardZeroGrads(kShardZero, 0.37f);
  PushRequest request = MakePush(0, 1, 0, grads);
  request.clear_payload();
  for (int k = 0; k < request.partitions_size(); ++k) {
    PartitionHeader* header = request.mutable_partitions(k);
    header->set_dtype(INT8);
    std::string bytes(WireBytes(WireDtype::kInt8, grads[k].values.size()), '\0');
    EncodeFloats(WireDtype::kInt8, grads[k].values.data(), grads[k].values.size(), bytes.data());
    request.mutable_payload()->append(bytes);
    DecodeFloats(WireDtype::kInt8, bytes.data(), grads[k].values.size(), grads[k].values.data());
  }
  PushOk(request);
  const std::map<Key, int64_t> offsets = {{{0, 0}, 0}, {{0, 1}, 3}, {{1, 0}, 0}};
  for (const Grad& g : grads) {
    std::vector<float> expected = Initial(g.key.first, offsets.at(g.key), g.values.size());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] -= 0.1f * g.values[i];
    EXPECT_EQ(PullOne(g.key).values, expected);
  }
}

}  // namespace
}  // namespace store_test
}  // namespace downpour
