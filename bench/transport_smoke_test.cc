// The transport benchmark's small configuration as a correctness test: real
// coordinator and downpour-ps processes, every method runs with one and two
// workers, and with one worker the pushed updates arrive exactly (compared
// with a replay on in-process shards; with two, ASYNC interleaving makes the
// result order-dependent, so worker/param_exchange_test covers exactness
// there). No timing assertions.
#include "bench/transport_bench.h"
#include "gtest/gtest.h"

namespace downpour {
namespace bench {
namespace {

TEST(TransportSmokeTest, SmallConfigurationsRunAndAreExact) {
  TransportBench::Options options;
  options.max_workers = 2;
  options.max_shards = 2;
  auto bench = TransportBench::Start(options);
  ASSERT_TRUE(bench.ok()) << bench.status();
  for (int workers : {1, 2}) {
    BenchConfig config;
    config.size_bytes = 1 << 20;
    config.workers = workers;
    config.shards = 2;
    config.steps = 5;
    auto result = (*bench)->Run(config);
    ASSERT_TRUE(result.ok()) << result.status() << (*bench)->Logs();
    EXPECT_GT(result->raw_tcp_gbps, 0);
    EXPECT_GT(result->naive_grpc_gbps, 0);
    EXPECT_GT(result->downpour_gbps, 0);
    EXPECT_GT(result->rtt_p50_us, 0);
    // Measured over the wire, then through shared memory.
    EXPECT_EQ(result->transport, "shared_memory");
    EXPECT_GT(result->signalled, 0);  // Through the segments' doorbells.
    EXPECT_GT(result->wire_gbps, 0);
    if (workers == 1) {
      EXPECT_EQ(result->max_abs_diff_vs_local, 0) << ToJson(*result);
    }
  }
}

TEST(TransportSmokeTest, ApplyBandwidthIsMeasured) {
  auto apply = MeasureApply(8 << 20);
  ASSERT_TRUE(apply.ok()) << apply.status();
  EXPECT_GT(apply->apply_gbps, 0);
  EXPECT_GT(apply->memcpy_gbps, 0);
}

}  // namespace
}  // namespace bench
}  // namespace downpour
