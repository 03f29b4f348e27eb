// Sparse embedding tables on a parameter shard (ps/sparse_store.h), driven
// through ParameterStore as workers drive it: rows pushed and pulled beside
// (or without) the dense partitions, in each consistency mode, exactly once,
// within a memory budget.
#include "ps/sparse_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "common/work_pool.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/lr_schedule.h"
#include "ps/memory_budget.h"
#include "ps/parameter_store.h"
#include "ps/sparse_store_fixture.h"
#include "ps/sparse_table.h"
#include "spec/sparse_ids.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;
using namespace sparse_testing;  // NOLINT(build/namespaces): the fixture's helpers.

TEST_F(SparseStoreTest, DenseJobHasNoTables) {
  JobSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(model {
             input_shape: 2
             num_classes: 2
             layer {
               name: "fc"
               dense { units: 2 }
             }
             layer { softmax_cross_entropy {} }
           }
           num_shards: 1
           num_workers: 1)pb",
      &spec));
  auto store = SparseStore::Create(kJob, spec, 0, &budget_, [](const std::string&) {});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*store, nullptr);
}

TEST_F(SparseStoreTest, TablesTakeTheirOwnOptimizerOrTheJobs) {
  // MOMENTUM for the job: a table without an optimizer of its own cannot
  // run it.
  JobSpec spec = Spec(ConsistencySpec::ASYNC, 1, "optimizer { kind: ADAGRAD learning_rate: 0.25 }");
  spec.mutable_optimizer()->set_kind(OptimizerSpec::MOMENTUM);
  auto refused = SparseStore::Create(kJob, spec, 0, &budget_, [](const std::string&) {});
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("sparse table emb/table: MOMENTUM"));
  EXPECT_TRUE(absl::IsInvalidArgument(store_.AddJob(kJob, spec, 0, Placements(1))));

  // tags/table runs Adagrad at 0.25 (epsilon defaulted); emb/table SGD.
  Host(Spec(ConsistencySpec::ASYNC, 1, "optimizer { kind: ADAGRAD learning_rate: 0.25 }"));
  int64_t tag = 0;
  while (SparseShardOf(tag, kShards) != 0) ++tag;
  const std::vector<float> grad = {0.5f, -2.f};
  PushOk(MakePush(0, 1, 0, {{1, {tag}, grad}}));
  std::vector<float> expected = InitialRow(1, tag);
  std::vector<float> accumulator(2, 0.f);
  OptimizerSpec adagrad;
  adagrad.set_kind(OptimizerSpec::ADAGRAD);
  adagrad.set_learning_rate(0.25f);
  kernels::cpu::AdagradUpdate(HyperparamsAt(adagrad, 0, 1), grad.data(), 2, expected.data(),
                              accumulator.data());
  EXPECT_EQ(PullRows(1, {tag})[tag], expected);
}

// SYNC: three workers' rows, pushed in every order, give the same bits: per
// row the mean over the contributing workers of their gradients summed in
// rank order (a row a worker did not touch gets nothing from it).
TEST_F(SparseStoreTest, SyncAppliesTheRankOrderedMeanWhateverTheArrivalOrder) {
  const std::vector<int64_t> ids = RowsOf(0, 3);
  const int64_t a = ids[0], b = ids[1], c = ids[2];
  // Row b's sum depends on the order of addition: (1e8 + 1) - 1e8 = 0 in
  // float, but (1e8 - 1e8) + 1 = 1.
  const std::vector<Rows> pushed[3] = {
      {{0, {a, b}, {1, 2, 3, 4, 1e8f, 1e8f, 1e8f, 1e8f}}},
      {{0, {b}, {1, 1, 1, 1}}},
      {{0, {c, b}, {-1, -2, -3, -4, -1e8f, -1e8f, -1e8f, -1e8f}}},
  };
  std::vector<int> order = {0, 1, 2};
  std::vector<std::map<int64_t, std::vector<float>>> results;
  int job = 0;
  do {
    MemoryBudget budget(0);
    ParameterStore store(&budget);
    ASSERT_TRUE(store.AddJob(kJob, Spec(ConsistencySpec::SYNC, 3), 0, Placements(1)).ok());
    for (int rank : order) {
      ASSERT_TRUE(store.Push(MakePush(rank, 1, 0, pushed[rank])).ok());
    }
    auto response = store.Pull(MakePull(0, {a, b, c}, /*min_version=*/1), Soon());
    ASSERT_TRUE(response.ok()) << response.status();
    results.push_back(RowsIn(*response));
    ++job;
  } while (std::next_permutation(order.begin(), order.end()));
  ASSERT_EQ(job, 6);
  for (const auto& result : results) EXPECT_EQ(result, results[0]);

  const float third = 1.f / 3.f;
  auto mean = [third](std::vector<float> sum) {
    for (float& v : sum) v *= third;
    return sum;
  };
  std::vector<float> sum_b(4);
  for (int k = 0; k < 4; ++k) sum_b[k] = (1e8f + 1.f) + -1e8f;  // Rank order.
  EXPECT_EQ(results[0].at(a), AfterSgd(InitialRow(0, a), {mean({1, 2, 3, 4})}));
  EXPECT_EQ(results[0].at(b), AfterSgd(InitialRow(0, b), {mean(sum_b)}));
  EXPECT_EQ(results[0].at(c), AfterSgd(InitialRow(0, c), {mean({-1, -2, -3, -4})}));
}

// Three ranks push overlapping rows of both tables for ten steps; each
// step's rows are pulled (both tables in one request). Returns the pulled
// bytes of a store in `mode` on `pool` (null: the request's thread alone).
std::string PushAndPullTenSteps(ConsistencySpec::Mode mode, WorkPool* pool) {
  const std::vector<int64_t> rows = RowsOf(0, 12);
  const std::vector<int64_t> tags = RowsOf(0, 6);
  MemoryBudget budget(0);
  ParameterStore store(&budget, pool);
  EXPECT_TRUE(store.AddJob(kJob, Spec(mode, 3), 0, Placements(1)).ok());
  std::string pulled;
  for (int64_t step = 0; step < 10; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      Rows emb{0, {}, {}}, tag{1, {}, {}};
      for (int i = 0; i < 5; ++i) {
        emb.ids.push_back(rows[(step + rank * 3 + i) % rows.size()]);
        for (int k = 0; k < kDim[0]; ++k) emb.grads.push_back(0.01f * (rank + 1) * (i - k) + step);
      }
      for (int i = 0; i < 3; ++i) {
        tag.ids.push_back(tags[(step + rank + i) % tags.size()]);
        for (int k = 0; k < kDim[1]; ++k) tag.grads.push_back(0.1f * (rank - i) + 0.01f * k);
      }
      EXPECT_TRUE(store.Push(MakePush(rank, step + 1, step, {emb, tag})).ok());
    }
    PullRequest pull =
        MakePull(0, rows, /*min_version=*/mode == ConsistencySpec::SYNC ? step + 1 : 0);
    SparseRows* more = pull.add_sparse();
    more->set_table(1);
    more->mutable_ids()->Assign(tags.begin(), tags.end());
    absl::StatusOr<PullResponse> response = store.Pull(pull, Soon());
    EXPECT_TRUE(response.ok()) << response.status();
    if (response.ok()) pulled += response->payload();
  }
  return pulled;
}

TEST_F(SparseStoreTest, SyncStepsCompletedTableByTableOnAPoolGiveTheSameBits) {
  // A store whose steps and pulls run table by table on a pool's threads
  // answers the same bytes as one that runs them on the request's thread.
  const std::string alone = PushAndPullTenSteps(ConsistencySpec::SYNC, nullptr);
  WorkPool pool(3);
  EXPECT_FALSE(alone.empty());
  EXPECT_EQ(PushAndPullTenSteps(ConsistencySpec::SYNC, &pool), alone);
}

TEST_F(SparseStoreTest, AsyncPushesAppliedTableByTableOnAPoolGiveTheSameBits) {
  const std::string alone = PushAndPullTenSteps(ConsistencySpec::ASYNC, nullptr);
  WorkPool pool(3);
  EXPECT_FALSE(alone.empty());
  EXPECT_EQ(PushAndPullTenSteps(ConsistencySpec::ASYNC, &pool), alone);
  EXPECT_NE(PushAndPullTenSteps(ConsistencySpec::SYNC, &pool), alone);
}

TEST_F(SparseStoreTest, SyncPullWaitsForTheStepAndTimesOutSayingWhy) {
  Host(Spec(ConsistencySpec::SYNC, 2));
  const int64_t id = RowsOf(0, 1)[0];
  // Step 0 is the rows as created.
  EXPECT_EQ(PullRows(0, {id})[id], InitialRow(0, id));
  PushOk(MakePush(0, 1, 0, {{0, {id}, {1, 1, 1, 1}}}));

  auto timed_out =
      store_.Pull(MakePull(0, {id}, /*min_version=*/1), absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(absl::IsDeadlineExceeded(timed_out.status())) << timed_out.status();
  EXPECT_THAT(
      timed_out.status().message(),
      HasSubstr("the sparse tables still at version 0 < 1 (step 0 waits for worker rank 1)"));

  // A step ahead of the tables is refused, whole.
  auto ahead = store_.Push(MakePush(1, 1, 1, {{0, {id}, {1, 1, 1, 1}}}));
  EXPECT_TRUE(absl::IsFailedPrecondition(ahead.status())) << ahead.status();
  EXPECT_THAT(ahead.status().message(), HasSubstr("pull version 1 first"));

  std::map<int64_t, std::vector<float>> pulled;
  std::thread waiter([&] { pulled = PullRows(0, {id}, /*min_version=*/1); });
  absl::SleepFor(absl::Milliseconds(20));
  PushOk(MakePush(1, 2, 0, {{0, {id}, {3, 3, 3, 3}}}));
  waiter.join();
  EXPECT_EQ(pulled[id], AfterSgd(InitialRow(0, id), {{2, 2, 2, 2}}));

  // Dropping the job ends a waiting pull.
  std::thread dropper([&] {
    absl::SleepFor(absl::Milliseconds(20));
    store_.DropJob(kJob);
  });
  auto aborted = store_.Pull(MakePull(0, {id}, /*min_version=*/2), Soon());
  dropper.join();
  EXPECT_TRUE(absl::IsAborted(aborted.status())) << aborted.status();
}

TEST_F(SparseStoreTest, SyncLatePushesAreDroppedAndCounted) {
  JobSpec spec = Spec(ConsistencySpec::SYNC, 3);
  spec.mutable_consistency()->set_backup_workers(1);
  Host(spec);
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(0, 1, 0, {{0, {id}, {2, 2, 2, 2}}}));
  PushOk(MakePush(2, 1, 0, {{0, {id}, {4, 4, 4, 4}}}));  // Two of three: complete.
  const std::vector<float> after = PullRows(0, {id}, 1)[id];
  EXPECT_EQ(after, AfterSgd(InitialRow(0, id), {{3, 3, 3, 3}}));
  PushOk(MakePush(1, 1, 0, {{0, {id}, {100, 100, 100, 100}}}));  // The straggler.
  EXPECT_EQ(PullRows(0, {id}, 1)[id], after);
  EXPECT_EQ(store_.LatePushes(kJob), (std::vector<int64_t>{0, 1, 0}));
}

// ASYNC: each push applies at once, at the learning rate of the job's
// progress: the pushes received times push_every over num_workers.
TEST_F(SparseStoreTest, AsyncAppliesAtOnceAtTheScheduledRate) {
  JobSpec spec = Spec(ConsistencySpec::ASYNC, 2);
  spec.mutable_optimizer()->mutable_schedule()->set_warmup_steps(4);
  Host(spec);
  const int64_t id = RowsOf(0, 1)[0];
  const std::vector<float> g = {1, 2, 3, 4};
  std::vector<float> expected = InitialRow(0, id);
  // Progress 0, 0 (1 push / 2 workers), 1: warmup rates 1/4, 1/4, 2/4.
  const float rates[] = {kLearningRate / 4, kLearningRate / 4, kLearningRate * 2 / 4};
  for (int push = 0; push < 3; ++push) {
    PushOk(MakePush(push % 2, push + 1, push, {{0, {id}, g}}));
    expected = AfterSgd(expected, {g}, rates[push]);
    EXPECT_EQ(PullRows(0, {id})[id], expected) << "after push " << push;
  }
}

// SSP: a worker's pull waits until every worker has pushed the steps the
// bound asks for; a push of rows alone (no partition here) counts as the
// worker's step.
TEST_F(SparseStoreTest, SspBoundCountsPushesWithoutPartitions) {
  JobSpec spec = Spec(ConsistencySpec::SSP, 2);
  spec.mutable_consistency()->set_staleness(1);
  Host(spec);
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(0, 1, 0, {{0, {id}, {1, 1, 1, 1}}}));
  PushOk(MakePush(0, 2, 1, {{0, {}, {}}}));
  PullRequest pull = MakePull(0, {id});
  pull.set_min_worker_steps(1);  // Rank 0 at step 2, staleness 1.
  auto waited = store_.Pull(pull, absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(absl::IsDeadlineExceeded(waited.status())) << waited.status();
  EXPECT_THAT(waited.status().message(), HasSubstr("worker 1 has pushed 0 steps < 1"));
  PushOk(MakePush(1, 1, 0, {{0, {}, {}}}));
  EXPECT_TRUE(store_.Pull(pull, Soon()).ok());
}

TEST_F(SparseStoreTest, RetriedRequestAppliesOnce) {
  Host(Spec(ConsistencySpec::ASYNC, 1));
  const int64_t id = RowsOf(0, 1)[0];
  const PushRequest push = MakePush(0, 7, 0, {{0, {id}, {1, 1, 1, 1}}});
  EXPECT_FALSE(PushOk(push).duplicate());
  EXPECT_TRUE(PushOk(push).duplicate());
  EXPECT_EQ(PullRows(0, {id})[id], AfterSgd(InitialRow(0, id), {{1, 1, 1, 1}}));
}

TEST_F(SparseStoreTest, SkippedPushCountsButAddsNothing) {
  Host(Spec(ConsistencySpec::SYNC, 2));
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(0, 1, 0, {{0, {id}, {2, 4, 6, 8}}}));
  PushRequest skipped = MakePush(1, 1, 0, {{0, {id}, {}}});
  skipped.set_skipped(true);
  PushOk(skipped);
  // The mean over the one worker that brought a gradient.
  EXPECT_EQ(PullRows(0, {id}, 1)[id], AfterSgd(InitialRow(0, id), {{2, 4, 6, 8}}));
}

TEST_F(SparseStoreTest, AbsentRanksCompleteTheStep) {
  Host(Spec(ConsistencySpec::SYNC, 3));
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(0, 1, 0, {{0, {id}, {1, 1, 1, 1}}}));
  PushOk(MakePush(1, 1, 0, {{0, {id}, {3, 3, 3, 3}}}));
  auto waiting = store_.Pull(MakePull(0, {id}, 1), absl::Now() + absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waiting.status())) << waiting.status();
  store_.SetWorkers(kJob, {2}, /*rank_nodes=*/{});
  EXPECT_EQ(PullRows(0, {id}, 1)[id], AfterSgd(InitialRow(0, id), {{2, 2, 2, 2}}));
  // Its pushes bring nothing while it is absent.
  PushOk(MakePush(0, 2, 1, {{0, {id}, {1, 1, 1, 1}}}));
  PushOk(MakePush(2, 1, 1, {{0, {id}, {100, 100, 100, 100}}}));
  PushOk(MakePush(1, 2, 1, {{0, {id}, {1, 1, 1, 1}}}));
  EXPECT_EQ(PullRows(0, {id}, 2)[id], AfterSgd(InitialRow(0, id), {{2, 2, 2, 2}, {1, 1, 1, 1}}));
}

// A rank whose last push is in and which then finishes (absent from then
// on) does not complete the step alone: the step waits for the rank that
// still counts and sums both. (It completed with the finished rank's rows
// only, and the other's last push came late and was dropped: a SYNC click
// job whose rank 0 was slower at the end ended 6.9e-6 of AUC off.)
TEST_F(SparseStoreTest, ARankThatFinishesAfterItsLastPushWaitsForTheOthers) {
  Host(Spec(ConsistencySpec::SYNC, 2));
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(1, 1, 0, {{0, {id}, {3, 3, 3, 3}}}));
  store_.SetWorkers(kJob, {1}, /*rank_nodes=*/{});
  auto waiting = store_.Pull(MakePull(0, {id}, 1), absl::Now() + absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waiting.status())) << waiting.status();
  PushOk(MakePush(0, 1, 0, {{0, {id}, {1, 1, 1, 1}}}));
  EXPECT_EQ(PullRows(0, {id}, 1)[id], AfterSgd(InitialRow(0, id), {{2, 2, 2, 2}}));
}

// An evaluation's pull (sparse_read_only) answers rows the table does not
// hold with their initial values, creating, touching and evicting none.
TEST_F(SparseStoreTest, ReadOnlyPullChangesNothing) {
  JobSpec spec = Spec(ConsistencySpec::SYNC, 1);
  spec.mutable_model()->mutable_layer(0)->mutable_embedding()->set_max_rows(10);  // 5 here.
  Host(spec);
  const std::vector<int64_t> held = RowsOf(0, 5);
  const std::vector<int64_t> missing = RowsOf(0, 3, held.back() + 1);
  PullRows(0, held);
  std::vector<float> grads;
  std::map<int64_t, std::vector<float>> trained;
  for (size_t k = 0; k < held.size(); ++k) {
    const std::vector<float> g(4, static_cast<float>(k + 1));
    grads.insert(grads.end(), g.begin(), g.end());
    trained[held[k]] = AfterSgd(InitialRow(0, held[k]), {g});
  }
  PushOk(MakePush(0, 1, 0, {{0, held, grads}}));
  const int64_t used = budget_.used();

  auto read_only = [this](const std::vector<int64_t>& ids) {
    PullRequest pull = MakePull(0, ids, 1);
    pull.set_sparse_read_only(true);
    absl::StatusOr<PullResponse> response = store_.Pull(pull, Soon());
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? RowsIn(*response) : std::map<int64_t, std::vector<float>>();
  };
  std::map<int64_t, std::vector<float>> rows =
      read_only({missing[0], held[0], missing[1], missing[2], held[1]});
  EXPECT_EQ(rows[held[0]], trained[held[0]]);
  EXPECT_EQ(rows[held[1]], trained[held[1]]);
  for (int64_t id : missing) EXPECT_EQ(rows[id], InitialRow(0, id)) << id;
  std::vector<SparseTableStats> tables = store_.SparseTables(kJob);
  EXPECT_EQ(tables[0].rows, 5);
  EXPECT_EQ(tables[0].evictions, 0);
  EXPECT_EQ(budget_.used(), used);

  // The rows it read were not touched: held[0], the least recently touched
  // before the read, is the one a new row evicts.
  PullRows(0, {missing[0]});
  EXPECT_EQ(store_.SparseTables(kJob)[0].evictions, 1);
  rows = read_only({held[0], held[1]});
  EXPECT_EQ(rows[held[0]], InitialRow(0, held[0]));
  EXPECT_EQ(rows[held[1]], trained[held[1]]);
}

TEST_F(SparseStoreTest, SyncExactPullReadsTheRowsAsTheStepBeforeReadThem) {
  // What a worker taking over a rank lost between its sparse push and its
  // dense push reads: the step the lost worker computed, from the rows it
  // read then, though the tables have applied that step since.
  Host(Spec(ConsistencySpec::SYNC, 1));
  const std::vector<int64_t> ids = RowsOf(0, 3);
  const int64_t a = ids[0], b = ids[1], never = ids[2];
  PullRows(0, {a, b});
  const std::vector<float> g0 = {1, 2, 3, 4}, g1 = {-4, 3, -2, 1};
  const std::vector<float> a1 = AfterSgd(InitialRow(0, a), {g0});
  const std::vector<float> b2 = AfterSgd(InitialRow(0, b), {g1});
  auto exact = [this](const std::vector<int64_t>& rows, int64_t version) {
    PullRequest pull = MakePull(0, rows, version);
    pull.set_exact_version(true);
    return store_.Pull(pull, Soon());
  };
  auto rows_of = [](const absl::StatusOr<PullResponse>& response) {
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return std::map<int64_t, std::vector<float>>();
    for (const SparseRows& rows : response->sparse()) EXPECT_EQ(rows.version(), 0);
    return RowsIn(*response);
  };

  PushOk(MakePush(0, 1, 0, {{0, {a}, g0}}));  // Step 0 changes a.
  std::map<int64_t, std::vector<float>> at0 = rows_of(exact({a, b, never}, 0));
  EXPECT_EQ(at0[a], InitialRow(0, a));
  EXPECT_EQ(at0[b], InitialRow(0, b));
  EXPECT_EQ(at0[never], InitialRow(0, never));
  absl::StatusOr<PullResponse> at1 = exact({a, b}, 1);  // The current version.
  ASSERT_TRUE(at1.ok()) << at1.status();
  EXPECT_EQ(RowsIn(*at1)[a], a1);
  EXPECT_EQ(at1->sparse(0).version(), 1);

  PullRows(0, {b}, /*min_version=*/1);
  PushOk(MakePush(0, 2, 1, {{0, {b}, g1}}));  // Step 1 changes b.
  at1 = exact({a, b}, 1);
  ASSERT_TRUE(at1.ok()) << at1.status();
  EXPECT_EQ(RowsIn(*at1)[a], a1);
  EXPECT_EQ(RowsIn(*at1)[b], InitialRow(0, b));
  EXPECT_EQ(PullRows(0, {a, b}, 2)[b], b2);  // A plain pull: the current rows.

  absl::StatusOr<PullResponse> gone = exact({a}, 0);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition) << gone.status();
  EXPECT_THAT(gone.status().message(), HasSubstr("no longer keep their rows of version 0"));
}

TEST_F(SparseStoreTest, AnExactPullIsForSyncJobs) {
  Host(Spec(ConsistencySpec::ASYNC, 1));
  PullRequest pull = MakePull(0, RowsOf(0, 1), 0);
  pull.set_exact_version(true);
  absl::StatusOr<PullResponse> response = store_.Pull(pull, Soon());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
}

TEST_F(SparseStoreTest, RefusesRowsOfOtherShardsAndMalformedRows) {
  Host(Spec(ConsistencySpec::ASYNC, 1));
  const int64_t mine = RowsOf(0, 1)[0], theirs = RowsOf(1, 1)[0];
  auto push = [this](const PushRequest& request) { return store_.Push(request).status(); };
  absl::Status status = push(MakePush(0, 1, 0, {{0, {mine, theirs}, std::vector<float>(8)}}));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("push to job job-s: row ", theirs,
                                     " of table emb/table belongs to shard 1, not 0")));
  status = store_.Pull(MakePull(0, {theirs}), Soon()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("pull from job job-s: row"));

  status = push(MakePush(0, 2, 0, {{0, {mine, mine}, std::vector<float>(8)}}));
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("table emb/table: row ", mine, " is listed twice")));
  status = push(MakePush(0, 3, 0, {{0, {-4}, std::vector<float>(4)}}));
  EXPECT_THAT(status.message(), HasSubstr("table emb/table has no row -4"));
  status = push(MakePush(0, 4, 0, {{5, {mine}, std::vector<float>(4)}}));
  EXPECT_THAT(status.message(), HasSubstr("sparse table 5 is outside the job's 2"));
  // Bytes short of the rows, and bytes beyond them.
  status = push(MakePush(0, 5, 0, {{0, {mine}, std::vector<float>(3)}}));
  EXPECT_THAT(status.message(), HasSubstr("fewer than the 1 rows of 4 elements need"));
  status = push(MakePush(0, 6, 0, {{0, {mine}, std::vector<float>(5)}}));
  EXPECT_THAT(status.message(), HasSubstr("payload has 20 bytes, the headers describe 16"));
  // None of them changed a row.
  EXPECT_EQ(PullRows(0, {mine})[mine], InitialRow(0, mine));
}

// The rows' bytes follow the partitions' in a push and in a pull's answer.
TEST_F(SparseStoreTest, RowsFollowThePartitionsBytes) {
  Host(Spec(ConsistencySpec::ASYNC, 1), /*dense_shard=*/0);
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(0, 1, 0, {{0, {id}, {1, 1, 1, 1}}}, /*dense=*/{2, 2}));
  PullRequest pull = MakePull(0, {id});
  pull.add_keys()->set_tensor_id(1);
  auto response = store_.Pull(pull, Soon());
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->partitions_size(), 1);
  std::vector<float> bias(2);
  std::memcpy(bias.data(), response->payload().data(), sizeof(float) * 2);
  EXPECT_EQ(bias, (std::vector<float>{-kLearningRate * 2, -kLearningRate * 2}));
  EXPECT_EQ(RowsIn(*response, 2 * sizeof(float))[id], AfterSgd(InitialRow(0, id), {{1, 1, 1, 1}}));
  // Rows alone: no partition.
  EXPECT_EQ(PullRows(0, {id}).size(), 1u);
}

// bf16 gradients decode through common/wire_dtype.h.
TEST_F(SparseStoreTest, DecodesNarrowGradients) {
  Host(Spec(ConsistencySpec::ASYNC, 1));
  const int64_t id = RowsOf(0, 1)[0];
  PushRequest push = MakePush(0, 1, 0, {{0, {id}, {}}});
  const std::vector<float> g = {0.5f, -1.f, 2.f, 0.25f};  // Exact in bf16.
  std::string bytes(g.size() * 2, '\0');
  EncodeFloats(WireDtype::kBfloat16, g.data(), g.size(), bytes.data());
  push.mutable_sparse(0)->set_dtype(BFLOAT16);
  push.set_payload(bytes);
  PushOk(push);
  EXPECT_EQ(PullRows(0, {id})[id], AfterSgd(InitialRow(0, id), {g}));
}

TEST_F(SparseStoreTest, MemoryIsCountedAndFreedWithTheJob) {
  Host(Spec(ConsistencySpec::ASYNC, 1), /*dense_shard=*/0);
  const int64_t dense_bytes = budget_.used();  // Partitions and the tables' fixed parts.
  PullRows(0, RowsOf(0, 100));
  EXPECT_GT(budget_.used(), dense_bytes);
  const std::vector<SparseTableStats> tables = store_.SparseTables(kJob);
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables[0].name, "emb/table");
  EXPECT_EQ(tables[0].rows, 100);
  EXPECT_EQ(tables[1].rows, 0);
  EXPECT_GE(store_.MemoryBytes(kJob), tables[0].bytes + tables[1].bytes + 18 * 4);
  store_.DropJob(kJob);
  EXPECT_EQ(budget_.used(), 0);
}

TEST_F(SparseStoreTest, EvictsPastTheShardsShareOfMaxRows) {
  // max_rows 10 over 2 shards: 5 here.
  JobSpec spec = Spec(ConsistencySpec::ASYNC, 1);
  spec.mutable_model()->mutable_layer(0)->mutable_embedding()->set_max_rows(10);
  Host(spec);
  for (int64_t id : RowsOf(0, 20)) PullRows(0, {id});
  const std::vector<SparseTableStats> tables = store_.SparseTables(kJob);
  EXPECT_EQ(tables[0].rows, 5);
  EXPECT_EQ(tables[0].evictions, 15);
}

TEST_F(SparseStoreTest, RowsPastTheMemoryLimitAreRefused) {
  // What the job takes before any row, then room for a few blocks of rows.
  int64_t base = 0;
  {
    MemoryBudget probe(0);
    ParameterStore store(&probe);
    ASSERT_TRUE(store.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements(1)).ok());
    base = probe.used();
  }
  MemoryBudget budget(base + 4096);
  ParameterStore store(&budget);
  ASSERT_TRUE(store.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements(1)).ok());
  auto pulled = store.Pull(MakePull(0, RowsOf(0, 400)), Soon());
  ASSERT_TRUE(absl::IsResourceExhausted(pulled.status())) << pulled.status();
  EXPECT_THAT(pulled.status().message(), HasSubstr("pull from job job-s: shard memory limit of"));
  EXPECT_THAT(pulled.status().message(), HasSubstr("--memory_limit"));
  EXPECT_GT(budget.refusals(), 0);
  // A push that cannot create its rows fails the job's later requests too.
  const std::vector<int64_t> ids = RowsOf(0, 400);
  auto pushed = store.Push(MakePush(0, 1, 0, {{0, ids, std::vector<float>(ids.size() * 4)}}));
  ASSERT_TRUE(absl::IsResourceExhausted(pushed.status())) << pushed.status();
  auto later = store.Pull(MakePull(0, {ids[0]}), Soon());
  EXPECT_TRUE(absl::IsResourceExhausted(later.status())) << later.status();
  EXPECT_EQ(later.status().message(), pushed.status().message());
}

TEST_F(SparseStoreTest, PartitionsPastTheMemoryLimitRefuseTheJob) {
  MemoryBudget budget(40);  // fc/weight and fc/bias take 72 bytes.
  ParameterStore store(&budget);
  absl::Status added = store.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements(0));
  ASSERT_TRUE(absl::IsResourceExhausted(added)) << added;
  EXPECT_EQ(added.message(),
            "job job-s: its partitions need 72 bytes on this shard, more than the 40 left of its "
            "memory limit of 40 bytes (raise --memory_limit or add shards)");
  EXPECT_EQ(budget.used(), 0);
}

TEST_F(SparseStoreTest, NonFiniteGradientsFailTheJob) {
  Host(Spec(ConsistencySpec::ASYNC, 1));
  const int64_t id = RowsOf(0, 1)[0];
  PushOk(MakePush(0, 1, 3, {{0, {id}, {1, NAN, 1, 1}}}));
  auto pulled = store_.Pull(MakePull(0, {id}), Soon());
  EXPECT_TRUE(absl::IsFailedPrecondition(pulled.status())) << pulled.status();
  EXPECT_THAT(pulled.status().message(),
              HasSubstr("training diverged at step 3: worker rank 0's gradient for sparse table "
                        "emb/table is not finite"));
  EXPECT_TRUE(IsDiverged(pulled.status()));
}

TEST_F(SparseStoreTest, AnAsyncPushAppliedOnAPoolNamesItsFirstNonFiniteTable) {
  WorkPool pool(2);
  MemoryBudget budget(0);
  ParameterStore store(&budget, &pool);
  ASSERT_TRUE(store.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements(1)).ok());
  const int64_t id = RowsOf(0, 1)[0];
  const int64_t tag = RowsOf(0, 1)[0];
  ASSERT_TRUE(
      store.Push(MakePush(0, 1, 3, {{0, {id}, {1, 1, NAN, 1}}, {1, {tag}, {NAN, 1}}})).ok());
  auto pulled = store.Pull(MakePull(0, {id}), Soon());
  EXPECT_TRUE(IsDiverged(pulled.status())) << pulled.status();
  EXPECT_THAT(pulled.status().message(),
              HasSubstr("worker rank 0's gradient for sparse table emb/table is not finite"));
}

}  // namespace
}  // namespace downpour
