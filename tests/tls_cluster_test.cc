// A cluster that lets no one in who doesn't belong, as an operator runs it:
// certificates from scripts/make-certs.sh, every daemon on mutual TLS, the
// coordinator authorizing by --auth_config. A job trains; a viewer cannot
// submit; a caller without credentials, a plaintext client and a node
// certificate claiming another node's name are turned away; a node not
// placed on a job cannot pull its parameters from a shard; the
// coordinator's certificate is rotated under a running job, which goes on;
// the coordinator's /metrics is HTTPS only; and daemons refuse to serve
// plaintext, or an open coordinator, where other machines can reach them.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/parameter_server.pb.h"
#include "rpc/remote_parameter_shard.h"
#include "rpc/security.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

using ::testing::HasSubstr;

class TlsClusterTest : public ClusterFixture {
 protected:
  static void SetUpTestSuite() {
    ClusterFixture::SetUpTestSuite();
    certs_ = new std::string(MakeTempDir("certs"));
    CommandResult made = RunCommand({Runfile("scripts/make-certs.sh"), *certs_, "coordinator",
                                     "node:ps0", "node:worker0", "node:worker1", "node:intruder",
                                     "user:alice:admin", "user:bob:viewer"});
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }

  void SetUp() override {
    LocalCluster::Options options;
    options.shards = 1;
    options.workers = 2;
    options.tls_dir = *certs_;
    options.ctl_flags = {absl::StrCat("--token_file=", *certs_, "/alice.token")};
    options.coordinator_flags = {"--tls_reload_s=1", "--metrics_tls"};
    StartCluster(options);
  }

  static std::string Cert(const std::string& name, const std::string& ext) {
    return absl::StrCat(*certs_, "/", name, ".", ext);
  }

  // The serial number of the certificate the coordinator presents now.
  std::string PresentedSerial() {
    CommandResult shown = RunCommand(
        {"/bin/sh", "-c",
         absl::StrCat("openssl s_client -connect ", cluster_->coordinator_address(),
                      " -alpn h2 -servername localhost </dev/null 2>/dev/null | openssl x509 "
                      "-noout -serial")});
    return std::string(absl::StripAsciiWhitespace(shown.out));
  }

  static std::string* certs_;
};

std::string* TlsClusterTest::certs_ = nullptr;

TEST_F(TlsClusterTest, OnlyThoseWhoBelongGetIn) {
  // An admin (token) trains the demo job end to end over mutual TLS.
  CommandResult trained = cluster_->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 2, 1, 300)),
                                         "--job_id=demo", "--wait", "--timeout=120s"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err << cluster_->Logs();
  EXPECT_THAT(trained.out, HasSubstr("SUCCEEDED"));

  // The coordinator's /metrics speaks HTTPS only.
  const std::string metrics = cluster_->MetricsAddressOf("coordinator");
  auto fetch = [&](const std::string& url) {
    return RunCommand(
        {"/usr/bin/python3", "-c",
         absl::StrCat("import ssl, sys, urllib.request; "
                      "c = ssl.create_default_context(cafile='",
                      Cert("ca", "crt"), "'); sys.stdout.write(urllib.request.urlopen('", url,
                      "', context=c, timeout=5).read().decode())")});
  };
  CommandResult scraped = fetch("https://" + metrics + "/metrics");
  EXPECT_THAT(scraped.out, HasSubstr("downpour_build_info"))
      << metrics << " exit " << scraped.exit_code << " " << scraped.err;
  EXPECT_NE(fetch("http://" + metrics + "/metrics").exit_code, 0);

  // A viewer reads, but may not submit.
  const std::string viewer = absl::StrCat("--token_file=", Cert("bob", "token"));
  EXPECT_EQ(cluster_->Ctl({"list", viewer}).exit_code, 0);
  CommandResult refused =
      cluster_->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 1, 1, 10)), viewer});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("the coordinator refused: bob (role viewer) may not call "
                                     "SubmitJob: it needs role admin"));
  // An admin by client certificate alone.
  CommandResult by_cert =
      cluster_->Ctl({"list", "--token_file=", "--tls_cert=" + Cert("alice", "crt"),
                     "--tls_key=" + Cert("alice", "key")});
  EXPECT_EQ(by_cert.exit_code, 0) << by_cert.err;

  // No credentials; a token no one was given; plaintext.
  CommandResult anonymous =
      RunCommand({Runfile("client/downpourctl"), "--coordinator=" + cluster_->coordinator_address(),
                  "--tls_ca=" + Cert("ca", "crt"), "list"});
  EXPECT_EQ(anonymous.exit_code, 1);
  EXPECT_THAT(anonymous.err, HasSubstr("does not know who you are: no credentials"));
  CommandResult forged =
      RunCommand({"/usr/bin/env", "DOWNPOUR_TOKEN=forged", Runfile("client/downpourctl"),
                  "--coordinator=" + cluster_->coordinator_address(),
                  "--tls_ca=" + Cert("ca", "crt"), "list"});
  EXPECT_EQ(forged.exit_code, 1);
  EXPECT_THAT(forged.err, HasSubstr("the token matches no principal"));
  EXPECT_THAT(forged.err, ::testing::Not(HasSubstr("forged")));
  CommandResult plaintext =
      RunCommand({Runfile("client/downpourctl"), "--coordinator=" + cluster_->coordinator_address(),
                  "--connect_timeout=2s", "list"});
  EXPECT_NE(plaintext.exit_code, 0);
  EXPECT_THAT(plaintext.err, HasSubstr("cannot reach coordinator"));
  EXPECT_THAT(plaintext.err, HasSubstr("or it serves TLS: give --tls_ca"));

  // A node certificate cannot register as another node.
  auto impostor = Process::Spawn(
      {Runfile("worker/downpour-worker"), "--coordinator=" + cluster_->coordinator_address(),
       "--data_dir=" + *data_dir_, "--node_id=worker0", "--coordinator_timeout_ms=5000",
       "--tls_cert=" + Cert("intruder", "crt"), "--tls_key=" + Cert("intruder", "key"),
       "--tls_ca=" + Cert("ca", "crt")},
      cluster_->dir() + "/impostor.log");
  ASSERT_TRUE(impostor.ok());
  absl::StatusOr<int> impostor_exit = (*impostor)->Wait(absl::Seconds(20));
  ASSERT_TRUE(impostor_exit.ok());
  EXPECT_NE(*impostor_exit, 0);
  EXPECT_THAT((*impostor)->Log(), HasSubstr("may not call RegisterNode as node worker0"));

  // A long job: a node not placed on it cannot pull its parameters.
  ASSERT_EQ(
      cluster_->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 2, 1, 1000000)), "--job_id=long"})
          .exit_code,
      0);
  ASSERT_TRUE(AwaitJob("long", [](const JobStatus& j) { return j.step() >= 20; }))
      << cluster_->Logs();
  RemoteParameterShard::Options intruder;
  SecurityOptions intruder_tls;
  intruder_tls.tls = TlsFiles{Cert("intruder", "crt"), Cert("intruder", "key"), Cert("ca", "crt")};
  intruder.credentials = *MakeChannelCredentials(intruder_tls);
  auto shard = RemoteParameterShard::Create(cluster_->AddressOf("ps0"), intruder);
  PullRequest pull;
  pull.set_job_id("long");
  pull.set_worker_rank(0);
  Payload payload;
  absl::StatusOr<PullResponse> stolen =
      shard->Pull(pull, absl::Now() + absl::Seconds(10), &payload);
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  EXPECT_THAT(stolen.status().message(),
              HasSubstr("node intruder is not worker rank 0 of job long"));

  // The coordinator's certificate is rotated under the running job: new
  // connections get the new one, and the job goes on.
  const std::string before = PresentedSerial();
  ASSERT_THAT(before, HasSubstr("serial="));
  // A certificate file caught half-written is not served: the last good one
  // stays.
  const std::string good = ReadFile(Cert("coordinator", "crt"));
  std::ofstream(Cert("coordinator", "crt"), std::ios::trunc) << good.substr(0, good.size() / 2);
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(PresentedSerial(), before);
  EXPECT_THAT(ReadFile(cluster_->coordinator()->log_path()),
              HasSubstr("TLS files changed but not reloaded (the last good ones stay)"));
  CommandResult reissued = RunCommand({Runfile("scripts/make-certs.sh"), *certs_, "coordinator"});
  ASSERT_EQ(reissued.exit_code, 0) << reissued.err;
  const int64_t step_at_rotation = cluster_->GetJob("long").step();
  std::string after = before;
  for (int i = 0; i < 100 && after == before; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    after = PresentedSerial();
  }
  EXPECT_NE(after, before) << "the coordinator still presents the old certificate";
  EXPECT_THAT(ReadFile(cluster_->coordinator()->log_path()), HasSubstr("TLS files reloaded"));
  ASSERT_TRUE(AwaitJob("long", [&](const JobStatus& j) {
    return j.state() == RUNNING && j.step() >= step_at_rotation + 50;
  })) << cluster_->Logs();
  EXPECT_EQ(cluster_->Ctl({"stop", "long"}).exit_code, 0);
}

TEST_F(TlsClusterTest, DaemonsRefuseToServeOpenlyWhereOthersCanReach) {
  auto refuses = [&](const std::vector<std::string>& argv, const std::string& why) {
    CommandResult result = RunCommand(argv, absl::Seconds(30));
    EXPECT_NE(result.exit_code, 0) << argv[0];
    EXPECT_THAT(result.err, HasSubstr(why)) << argv[0];
  };
  refuses({Runfile("server/downpour-ps"), "--listen=0.0.0.0:0",
           "--coordinator=" + cluster_->coordinator_address()},
          "refusing to serve plaintext gRPC on 0.0.0.0:0");
  refuses({Runfile("coordinator/downpour-coordinator"), "--listen=0.0.0.0:0",
           "--state_dir=" + cluster_->dir() + "/open"},
          "refusing to serve plaintext gRPC on 0.0.0.0:0");
  refuses({Runfile("coordinator/downpour-coordinator"), "--listen=0.0.0.0:0",
           "--state_dir=" + cluster_->dir() + "/open", "--tls_cert=" + Cert("coordinator", "crt"),
           "--tls_key=" + Cert("coordinator", "key"), "--tls_ca=" + Cert("ca", "crt")},
          "refusing to let anyone who reaches 0.0.0.0:0 submit and stop jobs");
  refuses({Runfile("coordinator/downpour-coordinator"), "--listen=127.0.0.1:0",
           "--state_dir=" + cluster_->dir() + "/open", "--auth_config=" + Cert("auth", "pbtxt")},
          "--auth_config needs --tls_cert");
  refuses({Runfile("server/downpour-ps"), "--coordinator=" + cluster_->coordinator_address(),
           "--tls_cert=" + Cert("ps0", "crt"), "--tls_key=" + Cert("worker0", "key"),
           "--tls_ca=" + Cert("ca", "crt")},
          "is not the key of --tls_cert");
}

}  // namespace
}  // namespace testing
}  // namespace downpour
