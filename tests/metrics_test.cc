// The metrics every daemon exports, read from live daemons on loopback the
// way Prometheus scrapes them: `promtool check metrics` (Debian's prometheus
// package) finds nothing wrong with any of them, and the series the
// dashboards and alerts in deploy/ read are there, during a job and after it.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health_service.grpc.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

// The promtool on PATH (or Debian's), or "" when there is none.
std::string FindPromtool() {
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path != nullptr ? path : "", ':');
  dirs.push_back("/usr/bin");
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/promtool";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

class MetricsTest : public ClusterFixture {
 protected:
  void SetUp() override {
    promtool_ = FindPromtool();
    if (promtool_.empty()) {
      GTEST_SKIP() << "promtool not found on PATH or in /usr/bin: install Debian's prometheus "
                      "package (scripts/install-deps.sh does) to check the daemons' metrics";
    }
  }

  std::string Scrape(const std::string& daemon) {
    auto body = HttpGet(cluster_->MetricsAddressOf(daemon), "/metrics");
    EXPECT_TRUE(body.ok()) << daemon << ": " << body.status();
    return body.ok() ? *body : "";
  }

  // Runs `promtool check metrics` over `daemon`'s exposition; fails the test
  // with promtool's complaints, and the exposition, if it finds any.
  std::string ScrapeAndCheck(const std::string& daemon) {
    const std::string text = Scrape(daemon);
    const std::string file = absl::StrCat(cluster_->dir(), "/", daemon, "-", ++scrapes_, ".prom");
    std::ofstream(file) << text;
    CommandResult checked = RunCommand(
        {"/bin/sh", "-c", absl::StrCat("exec '", promtool_, "' check metrics < '", file, "'")},
        absl::Seconds(60));
    EXPECT_EQ(checked.exit_code, 0) << daemon << ":\n"
                                    << checked.out << checked.err << "\n"
                                    << text;
    EXPECT_EQ(checked.out + checked.err, "") << daemon << ":\n" << text;
    return text;
  }

  // Calls grpc.health.v1.Health/Check on `daemon`, so its RPC series exist.
  void CheckHealth(const std::string& daemon) {
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(cluster_->AddressOf(daemon), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << daemon;
  }

  // Polls `daemon`'s metrics until they contain `text`.
  bool AwaitSeries(const std::string& daemon, const std::string& text) {
    for (int i = 0; i < 200; ++i) {
      if (Scrape(daemon).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::string promtool_;
  int scrapes_ = 0;
};

void ExpectSeries(const std::string& daemon, const std::string& text,
                  const std::vector<std::string>& wanted) {
  for (const std::string& series : wanted) {
    EXPECT_NE(text.find(series), std::string::npos) << daemon << " lacks " << series << " in\n"
                                                    << text;
  }
}

// What every daemon exports about itself.
void ExpectProcessAndBuildSeries(const std::string& daemon, const std::string& binary,
                                 const std::string& text) {
  ExpectSeries(daemon, text,
               {"\nprocess_cpu_seconds_total ", "\nprocess_resident_memory_bytes ",
                "\nprocess_virtual_memory_bytes ", "\nprocess_open_fds ", "\nprocess_max_fds ",
                "\nprocess_start_time_seconds ", "downpour_build_info{commit=\"",
                absl::StrCat("daemon=\"", binary, "\",version=\""),
                "downpour_rpc_server_handled_total{code=\"OK\","
                "method=\"grpc.health.v1.Health/Check\"} ",
                "downpour_rpc_server_handling_seconds_bucket{le=\"+Inf\","
                "method=\"grpc.health.v1.Health/Check\"} ",
                "# TYPE downpour_rpc_server_handling_seconds histogram\n"});
}

TEST_F(MetricsTest, EveryDaemonsMetricsPassPromtoolDuringAndAfterAJob) {
  LocalCluster::Options options;
  options.shards = 2;
  options.workers = 1;
  StartCluster(options);
  const std::vector<std::string> daemons = {"coordinator", "ps0", "ps1", "worker0"};
  for (const std::string& daemon : daemons) CheckHealth(daemon);

  // A job running: every per-job series is live.
  ASSERT_EQ(
      cluster_
          ->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 1, 2, 100000)), "--job_id=running"})
          .exit_code,
      0);
  ASSERT_TRUE(AwaitJob("running", [](const JobStatus& j) { return j.step() >= 30; }))
      << cluster_->Logs();
  ASSERT_TRUE(AwaitSeries("coordinator", "downpour_job_loss{job=\"running\"} "));

  const std::string coordinator = ScrapeAndCheck("coordinator");
  ExpectProcessAndBuildSeries("coordinator", "downpour-coordinator", coordinator);
  ExpectSeries("coordinator", coordinator,
               {"downpour_job_state{job=\"running\",state=\"RUNNING\"} 1\n",
                "downpour_job_state{job=\"running\",state=\"SUCCEEDED\"} 0\n",
                "downpour_job_step{job=\"running\"} ", "downpour_job_loss{job=\"running\"} ",
                "downpour_job_examples_per_second{job=\"running\"} ",
                "downpour_job_last_progress_timestamp_seconds{job=\"running\"} ",
                "downpour_jobs{state=\"RUNNING\"} 1\n", "downpour_nodes_alive{role=\"shard\"} 2\n",
                "downpour_rpc_server_handled_total{code=\"OK\","
                "method=\"downpour.Coordinator/Heartbeat\"} "});

  for (const std::string shard : {"ps0", "ps1"}) {
    const std::string text = ScrapeAndCheck(shard);
    ExpectProcessAndBuildSeries(shard, "downpour-ps", text);
    ExpectSeries(shard, text,
                 {"downpour_ps_apply_seconds_bucket{job=\"running\",le=\"0.0001\"} ",
                  "downpour_ps_apply_seconds_count{job=\"running\"} ",
                  "downpour_ps_received_bytes_total{job=\"running\"} ",
                  "downpour_ps_sent_bytes_total{job=\"running\"} ",
                  "downpour_ps_deduplicated_pushes_total{job=\"running\"} ",
                  "downpour_ps_memory_bytes{job=\"running\"} ",
                  // The worker is on this host: its streams carry the
                  // tensor bytes in shared memory.
                  "downpour_rpc_server_handling_seconds_count{"
                  "method=\"downpour.ParameterServer/PushPullSharedMemoryStream\"} "});
  }

  const std::string worker = ScrapeAndCheck("worker0");
  ExpectProcessAndBuildSeries("worker0", "downpour-worker", worker);
  std::vector<std::string> worker_series = {
      "downpour_worker_steps_total{job=\"running\"} ",
      "downpour_worker_examples_total{job=\"running\"} ",
      "downpour_worker_loss{job=\"running\",rank=\"",
      "downpour_worker_examples_per_second{job=\"running\",rank=\"",
      "downpour_worker_exchange_window{job=\"running\",rank=\"",
      "downpour_worker_devices{device=\"cpu\"} 1\n"};
  for (const char* histogram : {"step", "compute", "exchange", "input_wait"}) {
    worker_series.push_back(
        absl::StrCat("# TYPE downpour_worker_", histogram, "_seconds histogram\n"));
    worker_series.push_back(
        absl::StrCat("downpour_worker_", histogram, "_seconds_sum{job=\"running\"} "));
  }
  for (const char* shard : {"0", "1"}) {
    const std::string labels = absl::StrCat("{job=\"running\",shard=\"", shard, "\"} ");
    for (const char* series :
         {"downpour_worker_push_seconds_count", "downpour_worker_pull_seconds_count",
          "downpour_worker_pushed_bytes_total", "downpour_worker_pulled_bytes_total",
          "downpour_worker_rpc_retries_total"}) {
      worker_series.push_back(series + labels);
    }
  }
  ExpectSeries("worker0", worker, worker_series);
  // The worker measures its steps at a few windows and says which it keeps.
  const absl::Time give_up = absl::Now() + absl::Minutes(2);
  while (!absl::StrContains(cluster_->worker(0)->Log(), "exchange messages in flight") &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(absl::StrContains(cluster_->worker(0)->Log(), "job running: rank 0 keeps "))
      << cluster_->worker(0)->Log();
  ASSERT_EQ(cluster_->Ctl({"stop", "running"}).exit_code, 0);

  // A job run to its end: its last values stay, on the coordinator as long
  // as the job is in its store, on the worker for its grace (10 minutes by
  // default).
  CommandResult done = cluster_->Ctl(
      {"submit", WriteSpec(FashionMlpSpec("ASYNC", 1, 2, 60)), "--job_id=done", "--wait"});
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err << cluster_->Logs();
  ASSERT_TRUE(
      AwaitSeries("coordinator", "downpour_job_state{job=\"done\",state=\"SUCCEEDED\"} 1\n"))
      << Scrape("coordinator");
  const std::string after = ScrapeAndCheck("coordinator");
  ExpectSeries("coordinator", after,
               {"downpour_job_step{job=\"done\"} 60\n", "downpour_job_test_accuracy{job=\"done\"} ",
                "downpour_job_loss{job=\"done\"} ",
                "downpour_job_state{job=\"running\",state=\"STOPPED\"} 1\n"});
  const std::string worker_after = ScrapeAndCheck("worker0");
  ExpectSeries("worker0", worker_after,
               {"downpour_worker_steps_total{job=\"done\"} 60\n",
                "downpour_worker_step_seconds_count{job=\"done\"} 60\n",
                "downpour_worker_test_accuracy{job=\"done\"} "});
  ScrapeAndCheck("ps0");
}

}  // namespace
}  // namespace testing
}  // namespace downpour
