// SYNC steps sum the workers' gradients in increasing rank order, whatever
// order they arrive in (issue 10: a SYNC job is deterministic). Float
// addition is not associative, so each test pushes gradients whose sum
// depends on the order of addition, in many arrival orders, and checks the
// pulled parameters bit for bit against the rank-order sum.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/payload.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/lr_schedule.h"
#include "ps/parameter_store.h"
#include "ps/parameter_store_fixture.h"
#include "spec/proto_dtype.h"

namespace downpour {
namespace store_test {
namespace {

constexpr int kWorkers = 4;

// Shard 0's partitions (ps/parameter_store_fixture.h) and their sizes.
std::vector<Key> Keys() { return {{0, 0}, {0, 1}, {1, 0}}; }
int64_t Size(const Key& key) { return key.first == 0 ? 3 : 2; }

using Values = std::map<Key, std::vector<float>>;  // By partition.

Values InitialValues() {
  return {{{0, 0}, Initial(0, 0, 3)}, {{0, 1}, Initial(0, 3, 3)}, {{1, 0}, Initial(1, 0, 2)}};
}

std::string Bits(const Values& values) {
  std::string bits;
  for (const auto& [key, v] : values) {
    bits.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  return bits;
}

std::string Print(const std::vector<float>& v) {
  return absl::StrJoin(v, ", ",
                       [](std::string* out, float x) { absl::StrAppendFormat(out, "%.9g", x); });
}

void ExpectSameBits(const Values& actual, const Values& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (const auto& [key, want] : expected) {
    auto it = actual.find(key);
    ASSERT_NE(it, actual.end()) << what;
    const std::vector<float>& got = it->second;
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << what << ", partition " << key.first << "/" << key.second << ": pulled {" << Print(got)
        << "}, the rank-order sum gives {" << Print(want) << "}";
  }
}

// How a push's bytes travel.
struct Wire {
  DType dtype = FLOAT32;
  size_t piece_bytes = 0;  // The payload in pieces of this many bytes (0: one).
};

// Per rank, gradients whose float sum depends on the order of addition: in
// the first four elements the ranks bring `big`, `small`, -`big` and
// 3.14159 in turn (rotated), so (big + small) - big loses the small term
// that big - big + small keeps; the others are random, of both signs and
// magnitudes from 1e-3 up. Rounded to what `dtype` carries.
std::vector<Values> OrderSensitiveGradients(uint32_t seed, DType dtype) {
  const WireDtype wire = WireDtypeOf(dtype).value();
  const bool half = wire == WireDtype::kFloat16;  // Tops out at 65504.
  const float big = half ? 6e4f : 1e8f;
  const float small = half ? 1e-3f : 1.f;
  const float pattern[4] = {big, small, -big, 3.14159f};
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> exponent(-3.f, std::log10(big) - 1);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::vector<Values> grads(kWorkers);
  for (int rank = 0; rank < kWorkers; ++rank) {
    int element = 0;
    for (const Key& key : Keys()) {
      std::vector<float>& g = grads[rank][key];
      g.resize(Size(key));
      for (float& x : g) {
        x = element < 4 ? pattern[(rank + element) % 4]
                        : unit(random) * std::pow(10.f, exponent(random));
        ++element;
      }
      std::vector<char> bytes(WireBytes(wire, static_cast<int64_t>(g.size())));
      EncodeFloats(wire, g.data(), g.size(), bytes.data());
      DecodeFloats(wire, bytes.data(), g.size(), g.data());
    }
  }
  return grads;
}

// `values` after one SGD step of the gradients of `ranks`, added in the order
// listed (the first copied), the sum then scaled by 1 / contributors as the
// store scales it. No contributor: no update.
Values Apply(const JobSpec& spec, Values values, const std::vector<Values>& grads,
             const std::vector<int>& ranks, int64_t progress, int64_t update) {
  if (ranks.empty()) return values;
  for (auto& [key, param] : values) {
    std::vector<float> sum = grads[ranks[0]].at(key);
    for (size_t k = 1; k < ranks.size(); ++k) {
      const std::vector<float>& g = grads[ranks[k]].at(key);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
    }
    const float scale = 1.f / static_cast<float>(ranks.size());
    for (float& x : sum) x *= scale;
    kernels::cpu::ApplyOptimizer(OptimizerKind::kSgd,
                                 HyperparamsAt(spec.optimizer(), progress, update), sum.data(),
                                 static_cast<int64_t>(sum.size()), param.data(), nullptr);
  }
  return values;
}

// Worker `rank`'s push of step `step`, every partition of shard 0 in one
// request, its bytes as `wire` says (none when `skipped`).
absl::StatusOr<PushResponse> Push(ParameterStore& store, int rank, int64_t step,
                                  const Values& grads, const Wire& wire = {},
                                  bool skipped = false) {
  std::vector<Grad> list;
  for (const Key& key : Keys()) list.push_back({key, grads.at(key)});
  PushRequest request = MakePush(rank, step + 1, step, list);
  request.clear_payload();
  if (skipped) {
    request.set_skipped(true);
    return store.Push(request, Payload());
  }
  const WireDtype dtype = WireDtypeOf(wire.dtype).value();
  std::string bytes;
  for (PartitionHeader& header : *request.mutable_partitions()) {
    header.set_dtype(wire.dtype);
    const std::vector<float>& g = grads.at({header.key().tensor_id(), header.key().partition()});
    std::string encoded(WireBytes(dtype, static_cast<int64_t>(g.size())), '\0');
    EncodeFloats(dtype, g.data(), g.size(), encoded.data());
    bytes += encoded;
  }
  Payload payload;
  const size_t piece = wire.piece_bytes == 0 ? bytes.size() : wire.piece_bytes;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    payload.Append(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return store.Push(request, payload);
}

Values PullAll(ParameterStore& store, int64_t version) {
  absl::StatusOr<PullResponse> response = store.Pull(MakePull(Keys(), version), Soon());
  EXPECT_TRUE(response.ok()) << response.status();
  Values values;
  if (!response.ok()) return values;
  for (auto& [key, pulled] : Decode(*response)) {
    EXPECT_EQ(pulled.version, version);
    values[key] = std::move(pulled.values);
  }
  return values;
}

std::unique_ptr<ParameterStore> NewStore(const JobSpec& spec) {
  auto store = std::make_unique<ParameterStore>();
  absl::Status added = store->AddJob(kJob, spec, 0, Placements());
  EXPECT_TRUE(added.ok()) << added;
  return store;
}

std::vector<std::vector<int>> AllOrders(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::vector<int>> orders;
  do {
    orders.push_back(ranks);
  } while (std::next_permutation(ranks.begin(), ranks.end()));
  return orders;
}

std::string Named(const std::vector<int>& order) {
  return absl::StrCat("arrival order ", absl::StrJoin(order, ","));
}

class SyncSumOrderTest : public ::testing::TestWithParam<Wire> {};

TEST_P(SyncSumOrderTest, EveryArrivalOrderGivesTheRankOrderSum) {
  const Wire wire = GetParam();
  const JobSpec spec = Spec(ConsistencySpec::SYNC, kWorkers);
  const std::vector<Values> grads = OrderSensitiveGradients(1, wire.dtype);
  const Values expected = Apply(spec, InitialValues(), grads, {0, 1, 2, 3}, 0, 1);
  std::set<std::string> arrival_order_sums;
  for (const std::vector<int>& order : AllOrders({0, 1, 2, 3})) {
    std::unique_ptr<ParameterStore> store = NewStore(spec);
    for (int rank : order) ASSERT_TRUE(Push(*store, rank, 0, grads[rank], wire).ok());
    ExpectSameBits(PullAll(*store, 1), expected, Named(order));
    arrival_order_sums.insert(Bits(Apply(spec, InitialValues(), grads, order, 0, 1)));
  }
  // The test means something: summed as they arrive, the orders differ.
  EXPECT_GT(arrival_order_sums.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Wires, SyncSumOrderTest,
                         ::testing::Values(Wire{FLOAT32, 0},
                                           // Several aligned runs of whole elements per gradient.
                                           Wire{FLOAT32, 8},
                                           // Unaligned pieces, elements split across them.
                                           Wire{FLOAT32, 5}, Wire{BFLOAT16, 3}, Wire{FLOAT16, 0}));

TEST(SyncSumOrder, ASkippedRankIsNoTermOfTheSum) {
  const JobSpec spec = Spec(ConsistencySpec::SYNC, kWorkers);
  const std::vector<Values> grads = OrderSensitiveGradients(2, FLOAT32);
  for (int skipped = 0; skipped < kWorkers; ++skipped) {
    std::vector<int> contributors;
    for (int rank = 0; rank < kWorkers; ++rank) {
      if (rank != skipped) contributors.push_back(rank);
    }
    const Values expected = Apply(spec, InitialValues(), grads, contributors, 0, 1);
    for (const std::vector<int>& order : AllOrders({0, 1, 2, 3})) {
      std::unique_ptr<ParameterStore> store = NewStore(spec);
      for (int rank : order) {
        ASSERT_TRUE(Push(*store, rank, 0, grads[rank], {}, rank == skipped).ok());
      }
      ExpectSameBits(PullAll(*store, 1), expected,
                     absl::StrCat(Named(order), ", rank ", skipped, " skipped"));
    }
  }
}

TEST(SyncSumOrder, BackupWorkersQuorumSumsTheFirstArrivalsInRankOrder) {
  const std::vector<Values> grads = OrderSensitiveGradients(3, FLOAT32);
  for (int backups = 1; backups <= 2; ++backups) {
    const JobSpec spec = Spec(ConsistencySpec::SYNC, kWorkers, backups);
    const int quorum = kWorkers - backups;
    for (const std::vector<int>& order : AllOrders({0, 1, 2, 3})) {
      std::vector<int> contributors(order.begin(), order.begin() + quorum);
      std::sort(contributors.begin(), contributors.end());
      std::unique_ptr<ParameterStore> store = NewStore(spec);
      for (int rank : order) ASSERT_TRUE(Push(*store, rank, 0, grads[rank]).ok());
      const std::string what = absl::StrCat(Named(order), ", ", backups, " backup workers");
      ExpectSameBits(PullAll(*store, 1), Apply(spec, InitialValues(), grads, contributors, 0, 1),
                     what);
      // The stragglers' pushes came after the step and changed nothing.
      const std::vector<int64_t> late = store->LatePushes(kJob);
      for (int k = 0; k < kWorkers; ++k) EXPECT_EQ(late[order[k]], k < quorum ? 0 : 1) << what;
    }
  }
}

// A rank found absent before the step (its pushes, if any, bring nothing),
// or once the others have arrived (the step completes then, with what was
// held back for the missing rank).
TEST(SyncSumOrder, AStepWithoutAnAbsentRankSumsTheOthersInRankOrder) {
  const JobSpec spec = Spec(ConsistencySpec::SYNC, kWorkers);
  const std::vector<Values> grads = OrderSensitiveGradients(4, FLOAT32);
  for (int absent = 0; absent < kWorkers; ++absent) {
    std::vector<int> others;
    for (int rank = 0; rank < kWorkers; ++rank) {
      if (rank != absent) others.push_back(rank);
    }
    const Values expected = Apply(spec, InitialValues(), grads, others, 0, 1);
    for (const std::vector<int>& order : AllOrders({0, 1, 2, 3})) {
      for (bool absent_first : {true, false}) {
        const std::string what = absl::StrCat(Named(order), ", rank ", absent, " absent ",
                                              absent_first ? "first" : "last");
        std::unique_ptr<ParameterStore> store = NewStore(spec);
        if (absent_first) store->SetWorkers(kJob, {absent}, /*rank_nodes=*/{});
        for (int rank : order) {
          if (rank == absent && !absent_first) continue;
          ASSERT_TRUE(Push(*store, rank, 0, grads[rank]).ok()) << what;
        }
        if (!absent_first) store->SetWorkers(kJob, {absent}, /*rank_nodes=*/{});
        ExpectSameBits(PullAll(*store, 1), expected, what);
      }
    }
  }
}

// One store through many steps, each in another arrival order, some with a
// skipped rank or with none bringing a gradient: each step starts afresh.
TEST(SyncSumOrder, EveryStepOfALongRunSumsInRankOrder) {
  const JobSpec spec = Spec(ConsistencySpec::SYNC, kWorkers);
  const std::vector<std::vector<int>> orders = AllOrders({0, 1, 2, 3});
  std::unique_ptr<ParameterStore> store = NewStore(spec);
  Values expected = InitialValues();
  int64_t updates = 0;
  for (int step = 0; step < 30; ++step) {
    const std::vector<Values> grads = OrderSensitiveGradients(100 + step, FLOAT32);
    const std::vector<int>& order = orders[(step * 7) % orders.size()];
    auto skips = [step](int rank) { return step % 10 == 9 || (step % 3 == 0 && rank == step % 4); };
    std::vector<int> contributors;
    for (int rank = 0; rank < kWorkers; ++rank) {
      if (!skips(rank)) contributors.push_back(rank);
    }
    for (int rank : order) ASSERT_TRUE(Push(*store, rank, step, grads[rank], {}, skips(rank)).ok());
    if (!contributors.empty()) ++updates;
    expected = Apply(spec, std::move(expected), grads, contributors, step, updates);
    ExpectSameBits(PullAll(*store, step + 1), expected,
                   absl::StrCat("step ", step, ", ", Named(order)));
  }
}

// Workers pushing from threads of their own, in whatever order they come.
TEST(SyncSumOrder, ConcurrentPushesSumInRankOrder) {
  const JobSpec spec = Spec(ConsistencySpec::SYNC, kWorkers);
  constexpr int kSteps = 50;
  std::vector<std::vector<Values>> grads;
  for (int step = 0; step < kSteps; ++step) grads.push_back(OrderSensitiveGradients(step, FLOAT32));
  std::unique_ptr<ParameterStore> store = NewStore(spec);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < kWorkers; ++rank) {
    workers.emplace_back([&, rank] {
      for (int step = 0; step < kSteps; ++step) {
        ASSERT_TRUE(store->Pull(MakePull(Keys(), step), Soon()).ok());
        ASSERT_TRUE(Push(*store, rank, step, grads[step][rank]).ok());
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  Values expected = InitialValues();
  for (int step = 0; step < kSteps; ++step) {
    expected = Apply(spec, std::move(expected), grads[step], {0, 1, 2, 3}, step, step + 1);
  }
  ExpectSameBits(PullAll(*store, kSteps), expected, "concurrent pushes");
}

}  // namespace
}  // namespace store_test
}  // namespace downpour
