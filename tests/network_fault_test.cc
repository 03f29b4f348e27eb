// Network faults between hosts: every shard and worker in a network
// namespace of its own, on a bridge the coordinator listens on, with links
// the test cuts and throttles (tc tbf; this kernel has no netem). A cut
// shorter than the node timeout heals; a longer one loses the worker's rank
// (the job goes on, and the worker takes its rank back when its link
// returns) or the shard (the job continues from its checkpoint on a spare);
// a throttled worker in SYNC with a backup worker is a straggler the steps
// do not wait for, and the shard's metrics name it. Skipped, with the
// reason, where network namespaces cannot be made (not root).
#include <algorithm>
#include <functional>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

class NetworkFaultTest : public ClusterFixture {
 protected:
  void SetUp() override {
    const std::string why = LocalCluster::NetworkNamespacesUnavailable();
    if (!why.empty()) GTEST_SKIP() << "network namespaces unavailable: " << why;
  }

  void StartCluster(int shards, int workers, bool checkpoints = false,
                    bool wildcard_listen = false) {
    LocalCluster::Options options;
    options.shards = shards;
    options.workers = workers;
    options.network_namespaces = true;
    options.wildcard_listen = wildcard_listen;
    if (checkpoints) options.checkpoint_root = MakeTempDir("checkpoints");
    ClusterFixture::StartCluster(options);
  }

  // Submits `spec` as `id` and waits until its slowest worker passes `step`.
  void SubmitAndAwaitStep(const std::string& spec, const std::string& id, int64_t step) {
    CommandResult submitted = cluster_->Ctl({"submit", WriteSpec(spec), "--job_id=" + id});
    ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
    ASSERT_TRUE(AwaitJob(id, [step](const JobStatus& job) {
      return job.state() == RUNNING && job.step() >= step;
    })) << cluster_->Logs();
  }

  // Waits for the job to end and expects SUCCEEDED.
  JobStatus ExpectSucceeds(const std::string& id) {
    CommandResult waited = cluster_->Ctl({"wait", id}, absl::Minutes(3));
    const JobStatus job = cluster_->GetJob(id);
    std::cout << "events:" << Events(job) << std::endl;
    EXPECT_EQ(waited.exit_code, 0) << waited.out << waited.err << cluster_->Logs();
    EXPECT_EQ(job.state(), SUCCEEDED) << job.message();
    return job;
  }
};

// Every daemon, the coordinator too, on a host of its own, listening on
// every interface (--listen=0.0.0.0:0) as on a real cluster, shards and
// workers advertising their host's address: they register it (not a
// loopback or wildcard one), find one another through it, and train.
TEST_F(NetworkFaultTest, DaemonsListeningEverywhereRegisterTheirAdvertisedAddresses) {
  StartCluster(2, 2, /*checkpoints=*/false, /*wildcard_listen=*/true);
  CommandResult nodes = cluster_->Ctl({"nodes"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.err;
  EXPECT_TRUE(absl::StartsWith(cluster_->coordinator_address(), "10."))
      << "the coordinator is reached at " << cluster_->coordinator_address();
  for (const std::string name : {"ps0", "ps1", "worker0", "worker1"}) {
    const std::string address = cluster_->AddressOf(name);
    EXPECT_TRUE(absl::StartsWith(address, "10.")) << name << " advertised " << address;
    EXPECT_NE(nodes.out.find(address), std::string::npos) << name << ":\n" << nodes.out;
    const std::string metrics = cluster_->MetricsAddressOf(name);
    EXPECT_EQ(metrics.substr(0, metrics.rfind(':')), address.substr(0, address.rfind(':')))
        << name << "'s metrics on " << metrics;
  }
  EXPECT_EQ(nodes.out.find("127.0.0.1"), std::string::npos) << nodes.out;
  EXPECT_EQ(nodes.out.find("0.0.0.0"), std::string::npos) << nodes.out;
  ASSERT_EQ(cluster_->Ctl({"submit", WriteSpec(FashionMlpSpec("SYNC", 2, 2, 300)), "--job_id=j"})
                .exit_code,
            0);
  const JobStatus job = ExpectSucceeds("j");
  EXPECT_GT(job.test_accuracy(), 0.7);
}

TEST_F(NetworkFaultTest, AWorkerCutOffForLessThanTheNodeTimeoutHeals) {
  StartCluster(1, 2);
  SubmitAndAwaitStep(FashionMlpSpec("SYNC", 2, 1, 1500), "j", 100);
  ASSERT_TRUE(cluster_->SetLink("worker1", false).ok());
  absl::SleepFor(absl::Seconds(2));  // Half the node timeout (4 s).
  ASSERT_TRUE(cluster_->SetLink("worker1", true).ok());
  const JobStatus job = ExpectSucceeds("j");
  EXPECT_FALSE(HasEvent(job, "lost")) << Events(job);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_GT(job.test_accuracy(), 0.75);
}

TEST_F(NetworkFaultTest, AWorkerCutOffForLongerLosesItsRankUntilItsLinkReturns) {
  StartCluster(1, 2);
  SubmitAndAwaitStep(FashionMlpSpec("SYNC", 2, 1, 3000), "j", 100);
  ASSERT_TRUE(cluster_->SetLink("worker1", false).ok());
  ASSERT_TRUE(AwaitJob("j", [](const JobStatus& job) { return LostRank(job) >= 0; }))
      << cluster_->Logs();
  // SYNC steps wait for the rank: one without it would skip its batch.
  const int64_t step = cluster_->GetJob("j").step();
  absl::SleepFor(absl::Seconds(2));
  EXPECT_LT(cluster_->GetJob("j").step(), step + 5) << cluster_->Logs();
  // Back on the network, the same worker (same incarnation) is free, and
  // takes its rank back where it was.
  ASSERT_TRUE(cluster_->SetLink("worker1", true).ok());
  const JobStatus job = ExpectSucceeds("j");
  EXPECT_TRUE(HasEvent(job, "stopped heartbeating")) << Events(job);
  EXPECT_TRUE(HasEvent(job, "taken over by worker node")) << Events(job);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_GT(job.test_accuracy(), 0.75);
}

TEST_F(NetworkFaultTest, AShardCutOffForLongerIsReplacedFromTheCheckpoint) {
  StartCluster(2, 2, /*checkpoints=*/true);
  ASSERT_TRUE(cluster_->AddShard().ok()) << cluster_->Logs();  // The spare.
  const std::string spec =
      absl::StrCat(FashionMlpSpec("SYNC", 2, 2, 1500), "checkpoint { every_steps: 100 }\n");
  SubmitAndAwaitStep(spec, "j", 250);
  // The checkpoint at step 200 complete (on a loaded machine it can still
  // be writing at step 250): the replacement must resume from it.
  ASSERT_TRUE(AwaitJob("j", [](const JobStatus& job) {
    return !job.checkpoints().empty() && job.checkpoints().rbegin()->step() >= 200;
  })) << cluster_->Logs();
  // Which two shards the job is on is the scheduler's choice: cut the
  // first of its placement.
  const JobStatus running = cluster_->GetJob("j");
  std::string victim;
  for (const std::string name : {"ps0", "ps1", "ps2"}) {
    if (absl::StrContains(running.placement().shard_nodes(0), cluster_->AddressOf(name))) {
      victim = name;
    }
  }
  ASSERT_FALSE(victim.empty()) << running.placement().DebugString();
  ASSERT_TRUE(cluster_->SetLink(victim, false).ok());
  const JobStatus job = ExpectSucceeds("j");
  EXPECT_TRUE(HasEvent(job, "stopped heartbeating")) << Events(job);
  EXPECT_GE(job.resumed_from_step(), 200) << Events(job);
  EXPECT_GT(job.test_accuracy(), 0.75);
  // The workers' runs of the first attempt ended as the job started again
  // (stopped, their calls to the cut-off shard cancelled, or failed on the
  // live shard that dropped the job): before the job's second attempt
  // finished, not when the cut-off shard's link returns (nor at a push's
  // 30 s deadline), with the worker's exit waiting on them.
  for (int i = 0; i < 2; ++i) {
    const std::string log = cluster_->worker(i)->Log();
    const size_t ended =
        std::min(log.find("this worker stops its run"), log.find("job j was dropped"));
    EXPECT_LT(ended, log.find("job j: finished")) << log;
  }
  // The cut-off shard finds its job gone once its link returns (and then
  // stops at once on SIGTERM: it holds nothing to drain).
  ASSERT_TRUE(cluster_->SetLink(victim, true).ok());
  Process* shard = cluster_->shard(victim.back() - '0');
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!absl::StrContains(shard->Log(), "job j: ended, partitions dropped") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(absl::StrContains(shard->Log(), "job j: ended, partitions dropped")) << shard->Log();
}

TEST_F(NetworkFaultTest, AThrottledWorkerIsAStragglerTheStepsDoNotWaitFor) {
  StartCluster(1, 3);
  // A model whose push and pull take ~0.1 s each at 20 Mbit/s.
  const std::string spec = absl::StrReplaceAll(FashionMlpSpec("SYNC", 3, 1, 100000, /*units=*/256),
                                               {{"mode: SYNC", "mode: SYNC backup_workers: 1"}});
  SubmitAndAwaitStep(spec, "j", 20);
  ASSERT_TRUE(cluster_->Throttle("worker2", "20mbit").ok());
  const absl::Time throttled = absl::Now();
  const int64_t step = cluster_->GetJob("j").step();
  absl::SleepFor(absl::Seconds(8));
  const JobStatus job = cluster_->GetJob("j");
  EXPECT_EQ(job.state(), RUNNING) << job.message();
  // The two fast workers keep stepping: had the steps waited for the
  // straggler's ~0.2 s exchange, 8 s would make about 40.
  int64_t fastest = 0;
  for (const WorkerProgress& w : job.workers()) fastest = std::max(fastest, w.step());
  std::cout << "in " << absl::ToDoubleSeconds(absl::Now() - throttled)
            << " s throttled: fastest worker +" << fastest - step << " steps" << std::endl;
  EXPECT_GT(fastest - step, 160);
  // The shard's metrics name the straggler: the rank whose pushes came
  // late (it joins the partitions' step after each, JobTrainer::CatchUp,
  // rather than fall further behind).
  absl::StatusOr<std::string> metrics = HttpGet(cluster_->MetricsAddressOf("ps0"), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  int straggler = -1;
  for (int rank = 0; rank < job.placement().worker_nodes_size(); ++rank) {
    if (absl::StrContains(job.placement().worker_nodes(rank), cluster_->AddressOf("worker2"))) {
      straggler = rank;
    }
  }
  ASSERT_GE(straggler, 0) << job.placement().DebugString();
  const std::string series =
      absl::StrCat("downpour_ps_late_pushes_total{job=\"j\",rank=\"", straggler, "\"}");
  EXPECT_TRUE(absl::StrContains(*metrics, series)) << *metrics;
  ASSERT_TRUE(cluster_->Throttle("worker2", "").ok());
  ASSERT_EQ(cluster_->Ctl({"stop", "j"}).exit_code, 0);
}

}  // namespace
}  // namespace testing
}  // namespace downpour
