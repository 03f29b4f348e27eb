// Deadlines on the parameter traffic: a frozen shard (SIGSTOP) becomes a clear
// job failure naming the shard within the worker's configured push/pull
// timeouts, never a hang.
#include <signal.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

TEST(TransportFaultTest, FrozenShardFailsTheJobWithinTheDeadline) {
  const std::string data_dir = MakeTempDir("data");
  ASSERT_TRUE(ImportFashionMnist(data_dir, 2000).ok());
  LocalCluster::Options options;
  options.shards = 2;
  options.workers = 1;
  options.data_dir = data_dir;
  // The heartbeat timeout is far longer than the transport's, so the failure
  // seen is the worker's deadline, not the coordinator's failure detector.
  options.node_timeout_ms = 60000;
  options.worker_flags = {"--pull_timeout_ms=3000", "--push_timeout_ms=3000"};
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok()) << cluster.Logs();
  const std::string spec = cluster.dir() + "/spec.pbtxt";
  // No restarts: the failure the worker's deadline causes is the job's end.
  std::ofstream(spec) << FashionMlpSpec("ASYNC", 1, 2, 1000000, /*units=*/64, /*batch_size=*/32)
                      << "restart { max_restarts: -1 }\n";
  ASSERT_EQ(cluster.Ctl({"submit", spec, "--job_id=frozen"}).exit_code, 0) << cluster.Logs();

  // Let it train a little, then freeze a shard.
  const absl::Time started = absl::Now();
  while (cluster.GetJob("frozen").step() < 10) {
    ASSERT_LT(absl::Now() - started, absl::Seconds(60)) << cluster.Logs();
    absl::SleepFor(absl::Milliseconds(100));
  }
  cluster.shard(1)->Signal(SIGSTOP);
  const absl::Time frozen = absl::Now();
  JobStatus job;
  while (true) {
    job = cluster.GetJob("frozen");
    if (job.state() == FAILED) break;
    ASSERT_LT(absl::Now() - frozen, absl::Seconds(30))
        << "job still " << JobState_Name(job.state()) << cluster.Logs();
    absl::SleepFor(absl::Milliseconds(100));
  }
  const absl::Duration took = absl::Now() - frozen;
  EXPECT_LT(took, absl::Seconds(15));
  EXPECT_NE(job.message().find("shard"), std::string::npos) << job.message();
  EXPECT_NE(job.message().find("eadline"), std::string::npos) << job.message();
  cluster.shard(1)->Signal(SIGCONT);
  std::printf("frozen shard -> job FAILED after %s: %s\n", absl::FormatDuration(took).c_str(),
              job.message().c_str());
}

}  // namespace
}  // namespace testing
}  // namespace downpour
