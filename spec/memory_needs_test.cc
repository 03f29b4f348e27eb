#include "spec/memory_needs.h"

#include "gtest/gtest.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

// 8 -> 16 -> 3: 8*16 + 16 + 16*3 + 3 = 195 parameters.
constexpr int64_t kParams = 195;

std::vector<PartitionPlacement> Placed(const JobSpec& spec) {
  auto params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  auto placed = PlacePartitions(*params, spec.num_shards(), spec.partition_bytes());
  EXPECT_TRUE(placed.ok()) << placed.status();
  return *placed;
}

TEST(MemoryNeedsTest, AShardHoldsValuesSlotsCheckpointCopiesAndTheSyncSumAndPreviousValues) {
  JobSpec spec = SmallMlpJob(2, 2);
  ApplyJobDefaults(&spec);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  const std::vector<PartitionPlacement> placed = Placed(spec);
  auto plain = ShardMemoryNeeds(spec, placed, /*checkpoints=*/false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->size(), 2u);
  EXPECT_EQ((*plain)[0] + (*plain)[1], kParams * 3 * 4);  // Value, m, v.
  auto saved = ShardMemoryNeeds(spec, placed, /*checkpoints=*/true);
  EXPECT_EQ((*saved)[0] + (*saved)[1], kParams * 6 * 4);
  spec.mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  auto sync = ShardMemoryNeeds(spec, placed, /*checkpoints=*/true);
  // The step's sum and the previous version's values.
  EXPECT_EQ((*sync)[0] + (*sync)[1], kParams * 8 * 4);
  EXPECT_EQ(ShardPartitionBytes(placed, 0, 2, true, true), (*sync)[0]);
}

TEST(MemoryNeedsTest, OptimizerSlotsPerKind) {
  EXPECT_EQ(OptimizerSlots(OptimizerSpec::SGD), 0);
  EXPECT_EQ(OptimizerSlots(OptimizerSpec::MOMENTUM), 1);
  EXPECT_EQ(OptimizerSlots(OptimizerSpec::ADAGRAD), 1);
  EXPECT_EQ(OptimizerSlots(OptimizerSpec::ADAM), 2);
}

TEST(MemoryNeedsTest, AWorkerHoldsParametersGradientsAndItsBatchsActivations) {
  JobSpec spec = SmallMlpJob(1, 1);
  ApplyJobDefaults(&spec);
  auto shape = InferModel(spec.model());
  ASSERT_TRUE(shape.ok());
  // Per example: the input (8), dense 16, relu 16, dense 3, the loss (1).
  const int64_t per_example = 8 + 16 + 16 + 3 + 1;
  EXPECT_EQ(WorkerMemoryNeed(*shape, 32), 4 * (2 * kParams + 2 * 32 * per_example));
  // The issue that motivated it: a 784 -> 2,000,000 layer is 6.3 GB of
  // weights, some 12.5 GB on a worker.
  spec.mutable_model()->set_input_shape(0, 784);
  spec.mutable_model()->mutable_layer(0)->mutable_dense()->set_units(2000000);
  shape = InferModel(spec.model());
  ASSERT_TRUE(shape.ok());
  EXPECT_GT(WorkerMemoryNeed(*shape, 32), int64_t{12} << 30);
}

TEST(MemoryNeedsTest, ByteSizesReadAsSentences) {
  EXPECT_EQ(ByteSize(1536), "1.5 KiB");
  EXPECT_EQ(ByteSize(int64_t{3} << 20), "3.0 MiB");
  EXPECT_EQ(ByteSize(int64_t{13} << 29), "6.5 GiB");
}

}  // namespace
}  // namespace downpour
