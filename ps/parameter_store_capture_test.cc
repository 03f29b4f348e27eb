// ParameterStore's checkpoint captures: a capture holds every partition at
// its step (SYNC) or version (ASYNC) however pushes race the writer, and a
// store restored from one continues exactly as the original.
#include <atomic>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "ps/lr_schedule.h"
#include "ps/memory_budget.h"
#include "ps/parameter_store.h"
#include "ps/parameter_store_fixture.h"
#include "ps/request_dedup.h"

namespace downpour {
namespace store_test {
namespace {

// Captures the store hands its checkpoint sink, kept (their arrays lent)
// until Release.
class SnapshotSink {
 public:
  ParameterStore::CheckpointSink sink() {
    return [this](ShardCapture c) {
      absl::MutexLock lock(&mu_);
      captures_.push_back(std::move(c));
    };
  }
  // What the captures hold now, copied.
  std::vector<ShardSnapshot> snapshots() {
    absl::MutexLock lock(&mu_);
    std::vector<ShardSnapshot> out;
    for (const ShardCapture& c : captures_) out.push_back(c.Copy());
    return out;
  }
  // What the writer does first with each capture.
  void Detach() {
    absl::MutexLock lock(&mu_);
    for (ShardCapture& c : captures_) c.Detach();
  }
  // Drops the captures, as the writer does once it has written them.
  void Release() {
    std::vector<ShardCapture> dropped;
    absl::MutexLock lock(&mu_);
    dropped.swap(captures_);
  }

 private:
  absl::Mutex mu_;
  std::vector<ShardCapture> captures_ ABSL_GUARDED_BY(mu_);
};

PushRequest WithCheckpoint(PushRequest request, int64_t step) {
  request.set_checkpoint_step(step);
  return request;
}

TEST_F(ParameterStoreTest, SyncCheckpointCapturesEveryPartitionAtItsStep) {
  SnapshotSink sink;
  store_.SetCheckpointSink(sink.sink());
  AddJob(Spec(ConsistencySpec::SYNC, 2, 0, OptimizerSpec::MOMENTUM));
  const std::vector<Grad> grads = {{{0, 0}, {1, 2, 3}}, {{0, 1}, {1, 1, 1}}, {{1, 0}, {2, 2}}};
  // Rank 0 marks its push of step 0 for a checkpoint at step 1: nothing is
  // captured until every partition reaches version 1.
  PushOk(WithCheckpoint(MakePush(0, 1, 0, grads), 1));
  EXPECT_TRUE(sink.snapshots().empty());
  PushOk(MakePush(1, 1, 0, grads));
  ASSERT_EQ(sink.snapshots().size(), 1u);
  const ShardSnapshot snapshot = sink.snapshots()[0];
  EXPECT_TRUE(snapshot.error.empty()) << snapshot.error;
  EXPECT_EQ(snapshot.job_id, kJob);
  EXPECT_EQ(snapshot.shard, 0);
  EXPECT_EQ(snapshot.step, 1);
  ASSERT_EQ(snapshot.partitions.size(), 3u);
  for (const PartitionSnapshot& p : snapshot.partitions) {
    EXPECT_EQ(p.version, 1);
    EXPECT_EQ(p.updates, 1);
    ASSERT_EQ(p.slots.size(), 1u);  // Momentum's velocity.
    ExpectNear(p.values, PullOne({p.tensor_id, p.partition}, 1).values, 0);
  }
  EXPECT_EQ(snapshot.worker_steps, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(snapshot.requests.size(), 2u);
  // Step 1's updates come after the capture; the snapshot keeps step 1.
  PushOk(MakePush(0, 2, 1, grads));
  PushOk(MakePush(1, 2, 1, grads));
  EXPECT_EQ(sink.snapshots().size(), 1u);
  EXPECT_EQ(sink.snapshots()[0].partitions[0].version, 1);
}

TEST_F(ParameterStoreTest, CheckpointPastItsStepIsAnError) {
  SnapshotSink sink;
  store_.SetCheckpointSink(sink.sink());
  AddJob(Spec(ConsistencySpec::SYNC, 1));
  PushOk(MakePush(0, 1, 0, {{{0, 0}, {1, 1, 1}}}));
  PushOk(MakePush(0, 2, 1, {{{0, 0}, {1, 1, 1}}}));  // Partition 0/0 at version 2.
  PushOk(WithCheckpoint(MakePush(0, 3, 0, {{{0, 1}, {1, 1, 1}}}), 1));
  ASSERT_EQ(sink.snapshots().size(), 1u);
  EXPECT_THAT(sink.snapshots()[0].error,
              HasSubstr("partition 0/0 is already at version 2, past the checkpoint's step 1"));
  // The failed capture is over: a later one can start.
  PushOk(WithCheckpoint(MakePush(0, 4, 1, {{{0, 1}, {1, 1, 1}}}), 2));
  PushOk(MakePush(0, 5, 0, {{{1, 0}, {1, 1}}}));
  ASSERT_EQ(sink.snapshots().size(), 1u);  // 1/0 is not at version 2 yet.
  PushOk(MakePush(0, 6, 1, {{{1, 0}, {1, 1}}}));
  ASSERT_EQ(sink.snapshots().size(), 2u);
  EXPECT_TRUE(sink.snapshots()[1].error.empty()) << sink.snapshots()[1].error;
  EXPECT_EQ(sink.snapshots()[1].step, 2);
}

TEST_F(ParameterStoreTest, AsyncCheckpointCapturesAtOnceAtEachPartitionsVersion) {
  SnapshotSink sink;
  store_.SetCheckpointSink(sink.sink());
  AddJob(Spec(ConsistencySpec::ASYNC, 2));
  PushOk(MakePush(0, 1, 0, {{{0, 0}, {1, 1, 1}}}));
  PushOk(MakePush(1, 1, 0, {{{0, 0}, {1, 1, 1}}}));
  PushOk(WithCheckpoint(MakePush(0, 2, 1, {{{1, 0}, {1, 1}}}), 2));
  const std::vector<ShardSnapshot> snapshots = sink.snapshots();
  ASSERT_EQ(snapshots.size(), 1u);
  const ShardSnapshot& snapshot = snapshots[0];
  EXPECT_TRUE(snapshot.error.empty());
  EXPECT_FALSE(snapshot.sync);
  // Captured before this push's own update: 0/0 at 2, the others at 0.
  EXPECT_EQ(snapshot.partitions[0].version, 2);
  EXPECT_EQ(snapshot.partitions[2].version, 0);
}

// A capture copies nothing on the push path: pushes that update its
// partitions before it is written leave it at its step, and compute what
// they would have without it, while it is held, after it is released and at
// the next capture; whether the writer detached it (copied the partitions no
// push had reached yet) before those pushes, after one that reached a single
// partition, or never.
TEST_F(ParameterStoreTest, PushesWhileACaptureIsHeldLeaveItAtItsStep) {
  for (const auto& [mode, detach] :
       std::vector<std::pair<ConsistencySpec::Mode, int>>{{ConsistencySpec::SYNC, -1},
                                                          {ConsistencySpec::SYNC, 0},
                                                          {ConsistencySpec::SYNC, 1},
                                                          {ConsistencySpec::ASYNC, -1},
                                                          {ConsistencySpec::ASYNC, 0},
                                                          {ConsistencySpec::ASYNC, 1}}) {
    SCOPED_TRACE(absl::StrCat(ConsistencySpec::Mode_Name(mode), " detach ", detach));
    SnapshotSink sink;
    ParameterStore store, reference;
    store.SetCheckpointSink(sink.sink());
    const JobSpec spec = Spec(mode, 1, 0, OptimizerSpec::ADAM);
    ASSERT_TRUE(store.AddJob(kJob, spec, 0, Placements()).ok());
    ASSERT_TRUE(reference.AddJob(kJob, spec, 0, Placements()).ok());
    const std::vector<Grad> grads = {{{0, 0}, {1, -2, 3}}, {{0, 1}, {.5f, 1, 1}}, {{1, 0}, {2, 2}}};
    auto push = [&](int64_t step, int64_t checkpoint_step) {
      PushRequest request = MakePush(0, step + 1, step, grads);
      ASSERT_TRUE(reference.Push(request).ok());
      request.set_checkpoint_step(checkpoint_step);
      ASSERT_TRUE(store.Push(request).ok());
    };
    auto expect_same_as_reference = [&] {
      auto ours = store.Pull(MakePull({}), Soon());
      auto theirs = reference.Pull(MakePull({}), Soon());
      ASSERT_TRUE(ours.ok() && theirs.ok());
      EXPECT_EQ(ours->SerializeAsString(), theirs->SerializeAsString());
    };
    push(0, 0);
    std::map<Key, Pulled> expected = Decode(*reference.Pull(MakePull({}), Soon()));
    push(1, 2);  // SYNC: captured after this push's update; ASYNC: before.
    if (mode == ConsistencySpec::SYNC) expected = Decode(*reference.Pull(MakePull({}), Soon()));
    ASSERT_EQ(sink.snapshots().size(), 1u);
    const ShardSnapshot at_capture = sink.snapshots()[0];
    const int64_t version = mode == ConsistencySpec::SYNC ? 2 : 1;
    if (detach == 0) sink.Detach();
    if (detach == 1) {
      const PushRequest one = MakePush(0, 100, 2, {grads[0]});  // Partition 0/0 alone.
      ASSERT_TRUE(reference.Push(one).ok());
      ASSERT_TRUE(store.Push(one).ok());
      sink.Detach();
    }
    for (int64_t step = 2; step < 5; ++step) push(step, 0);
    expect_same_as_reference();
    const ShardSnapshot held = sink.snapshots()[0];
    for (size_t i = 0; i < held.partitions.size(); ++i) {
      const PartitionSnapshot& p = held.partitions[i];
      EXPECT_EQ(p.version, version);
      EXPECT_EQ(p.values, at_capture.partitions[i].values);
      EXPECT_EQ(p.slots, at_capture.partitions[i].slots);
      EXPECT_EQ(p.values, (expected[{p.tensor_id, p.partition}].values));
    }
    sink.Release();
    push(5, 0);
    push(6, 8);
    push(7, 0);  // SYNC: captures step 8 here.
    push(8, 0);
    expect_same_as_reference();
    ASSERT_EQ(sink.snapshots().size(), 1u);
    EXPECT_EQ(sink.snapshots()[0].step, 8);
    sink.Release();
    push(9, 0);
    expect_same_as_reference();
  }
}

// Checkpoint writing goes on beside pushes: captures read and dropped on
// another thread hold their step's values whatever the pushes do meanwhile,
// and never change what the pushes compute.
TEST_F(ParameterStoreTest, CapturesReadConcurrentlyWithPushes) {
  ParameterStore reference;
  absl::Mutex mu;
  std::vector<ShardCapture> queue;
  std::map<int64_t, std::map<Key, Pulled>> expected;  // By checkpoint step.
  bool done = false;
  absl::CondVar more;
  store_.SetCheckpointSink([&](ShardCapture c) {
    absl::MutexLock lock(&mu);
    queue.push_back(std::move(c));
    more.Signal();
  });
  const JobSpec spec = Spec(ConsistencySpec::SYNC, 1, 0, OptimizerSpec::ADAM);
  AddJob(spec);
  ASSERT_TRUE(reference.AddJob(kJob, spec, 0, Placements()).ok());
  int checked = 0;
  std::thread writer([&] {
    while (true) {
      std::vector<ShardCapture> taken;
      {
        absl::MutexLock lock(&mu);
        while (!done && queue.empty()) more.Wait(&mu);
        if (queue.empty()) return;
        taken.swap(queue);
      }
      for (const ShardCapture& c : taken) {
        const ShardSnapshot s = c.Copy();
        std::map<Key, Pulled> want;
        {
          absl::MutexLock lock(&mu);
          want = expected[s.step];
        }
        for (const PartitionSnapshot& p : s.partitions) {
          EXPECT_EQ(p.version, s.step);
          EXPECT_EQ(p.values, (want[{p.tensor_id, p.partition}].values)) << "step " << s.step;
        }
        ++checked;
      }
    }
  });
  const std::vector<Grad> grads = {{{0, 0}, {1, -2, 3}}, {{0, 1}, {.5f, 1, 1}}, {{1, 0}, {2, 2}}};
  for (int64_t step = 0; step < 300; ++step) {
    PushRequest request = MakePush(0, step + 1, step, grads);
    ASSERT_TRUE(reference.Push(request).ok());
    if (step % 3 == 0) {
      request.set_checkpoint_step(step + 1);
      absl::MutexLock lock(&mu);
      expected[step + 1] = Decode(*reference.Pull(MakePull({}), Soon()));
    }
    PushOk(request);
  }
  {
    absl::MutexLock lock(&mu);
    done = true;
    more.Signal();
  }
  writer.join();
  EXPECT_EQ(checked, 100);
  auto ours = store_.Pull(MakePull({}), Soon());
  auto theirs = reference.Pull(MakePull({}), Soon());
  ASSERT_TRUE(ours.ok() && theirs.ok());
  EXPECT_EQ(ours->SerializeAsString(), theirs->SerializeAsString());
}

// A store restored from another's snapshot continues exactly as the other:
// values, optimizer slots, versions, Adam's step count, the workers' steps
// and the exactly-once windows; one hosting the job with its snapshot
// serves nothing from before the restore.
TEST_F(ParameterStoreTest, RestoredStoreContinuesExactlyAsTheOriginal) {
  SnapshotSink sink;
  store_.SetCheckpointSink(sink.sink());
  const JobSpec spec = Spec(ConsistencySpec::SYNC, 1, 0, OptimizerSpec::ADAM);
  AddJob(spec);
  const std::vector<Grad> grads = {{{0, 0}, {1, -2, 3}}, {{0, 1}, {0.5f, 1, 1}}, {{1, 0}, {2, 2}}};
  PushOk(MakePush(0, 1, 0, grads));
  PushOk(WithCheckpoint(MakePush(0, 2, 1, grads), 2));
  ASSERT_EQ(sink.snapshots().size(), 1u);

  ParameterStore restored;
  ASSERT_TRUE(restored.AddJob(kJob, spec, 0, Placements()).ok());
  ASSERT_TRUE(restored.Restore(kJob, sink.snapshots()[0]).ok());
  // Hosted with the checkpoint at once (AddJob's `restore`), a job is found
  // restored by its very first pull.
  MemoryBudget budget(1 << 20);
  ParameterStore hosted(&budget);
  ASSERT_TRUE(hosted.AddJob(kJob, spec, 0, Placements(), 0, &sink.snapshots()[0]).ok());
  auto first = hosted.Pull(MakePull({}, 0), Soon());
  auto after_restore = restored.Pull(MakePull({}, 0), Soon());
  ASSERT_TRUE(first.ok() && after_restore.ok());
  EXPECT_EQ(first->SerializeAsString(), after_restore->SerializeAsString());
  // The pushes in the checkpoint are not applied again: the first is a
  // duplicate by its id, the one that completed the checkpoint's step is
  // late for the restored version.
  EXPECT_TRUE(restored.Push(MakePush(0, 1, 0, grads))->duplicate());
  ASSERT_TRUE(restored.Push(MakePush(0, 2, 1, grads)).ok());
  for (ParameterStore* s : {&store_, &restored}) {
    ASSERT_TRUE(s->Push(MakePush(0, 3, 2, grads)).ok());
  }
  auto original = store_.Pull(MakePull({}, 3), Soon());
  auto copy = restored.Pull(MakePull({}, 3), Soon());
  ASSERT_TRUE(original.ok() && copy.ok());
  EXPECT_EQ(original->SerializeAsString(), copy->SerializeAsString());

  ShardSnapshot wrong = sink.snapshots()[0];
  wrong.partitions[0].values.pop_back();
  EXPECT_THAT(restored.Restore(kJob, wrong).message(), HasSubstr("partition 0/0 does not match"));
  // One that does not fit is not hosted at all, its memory given back.
  ParameterStore refused(&budget);
  EXPECT_THAT(refused.AddJob(kJob, spec, 0, Placements(), 0, &wrong).message(),
              HasSubstr("partition 0/0 does not match"));
  EXPECT_TRUE(absl::IsNotFound(refused.Pull(MakePull({}, 0), Soon()).status()));
  hosted.DropJob(kJob);
  EXPECT_EQ(budget.used(), 0);
}

// Every optimizer through the store in SYNC mode with two workers and a
// schedule, against the kernel applied by hand to the averaged gradients.
}  // namespace
}  // namespace store_test
}  // namespace downpour
