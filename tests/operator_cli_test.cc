// The operator's CLI against the real daemons, as an operator drives it:
// logs and describe of a running job, delete, a drain that moves a job off
// a worker, retention of ended jobs, rejected input exiting 2, and the
// coordinator picked from the environment or a config file's context.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class OperatorCliTest : public ClusterFixture {
 protected:
  void Start(int shards, int workers, std::vector<std::string> coordinator_flags = {}) {
    LocalCluster::Options options;
    options.shards = shards;
    options.workers = workers;
    options.coordinator_flags = std::move(coordinator_flags);
    StartCluster(options);
  }

  JobStatus GetJob(const std::string& id) { return cluster_->GetJob(id); }

  // downpourctl with no --coordinator: it finds it by itself.
  CommandResult CtlWithout(const std::vector<std::string>& env,
                           const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "DOWNPOUR_COORDINATOR",
                                     absl::StrCat("HOME=", cluster_->dir())};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(Runfile("client/downpourctl"));
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, absl::Seconds(60));
  }
};

TEST_F(OperatorCliTest, LogsDescribeDrainAndDeleteARunningJob) {
  Start(1, 2);
  ASSERT_EQ(
      cluster_->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 1, 1, 100000)), "--job_id=t"})
          .exit_code,
      0);
  ASSERT_TRUE(AwaitJob("t", [](const JobStatus& j) { return j.step() >= 20; })) << cluster_->Logs();
  const std::string first = GetJob("t").placement().worker_nodes(0);

  // The worker's and the shard's lines come through the coordinator, with
  // the coordinator's own.
  ASSERT_TRUE(AwaitJob("t", [&](const JobStatus&) {
    CommandResult logs = cluster_->Ctl({"logs", "t"});
    return absl::StrContains(logs.out, "starting as worker rank 0") &&
           absl::StrContains(logs.out, "hosting shard 0");
  })) << cluster_->Ctl({"logs", "t"}).out;
  CommandResult logs = cluster_->Ctl({"logs", "t"});
  EXPECT_THAT(logs.out, HasSubstr("coordinator  started on 1 workers"));
  EXPECT_THAT(logs.out, HasSubstr(first + "  starting as worker rank 0"));
  CommandResult json_logs = cluster_->Ctl({"-o", "json", "logs", "t", "--tail=1"});
  ASSERT_EQ(json_logs.exit_code, 0) << json_logs.err;
  EXPECT_THAT(json_logs.out, HasSubstr("\"job_id\": \"t\""));

  CommandResult described = cluster_->Ctl({"describe", "t"});
  ASSERT_EQ(described.exit_code, 0) << described.err;
  EXPECT_THAT(described.out, HasSubstr("workers:        1 [" + first + "]"));
  EXPECT_THAT(described.out, HasSubstr("progress:"));
  EXPECT_THAT(described.out, HasSubstr("spec:"));
  EXPECT_THAT(described.out, HasSubstr("mode: ASYNC"));
  CommandResult yaml = cluster_->Ctl({"-o", "yaml", "describe", "t"});
  EXPECT_THAT(yaml.out, HasSubstr("job:\n  id: \"t\"\n"));

  // A running job cannot be deleted.
  CommandResult refused = cluster_->Ctl({"delete", "t"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("stop it first"));

  // Draining its worker moves the job to the free one.
  CommandResult drained = cluster_->Ctl({"nodes", "drain", first});
  ASSERT_EQ(drained.exit_code, 0) << drained.err;
  ASSERT_TRUE(AwaitJob("t", [&](const JobStatus& j) {
    return j.placement().worker_nodes(0) != first && !j.placement().worker_nodes(0).empty() &&
           !j.workers(0).lost();
  })) << Events(GetJob("t"));
  const int64_t moved_at = GetJob("t").workers(0).step();
  ASSERT_TRUE(AwaitJob("t", [&](const JobStatus& j) { return j.workers(0).step() > moved_at; }))
      << cluster_->Logs();
  EXPECT_TRUE(HasEvent(GetJob("t"), "drained by operator")) << Events(GetJob("t"));
  CommandResult nodes = cluster_->Ctl({"nodes"});
  EXPECT_THAT(nodes.out, HasSubstr("cordoned"));
  CommandResult wide = cluster_->Ctl({"-o", "wide", "nodes"});
  EXPECT_THAT(wide.out, HasSubstr("INCARNATION"));
  EXPECT_EQ(cluster_->Ctl({"nodes", "uncordon", first}).exit_code, 0);
  EXPECT_THAT(cluster_->Ctl({"nodes"}).out, Not(HasSubstr("cordoned")));

  // logs -f follows until the job ends.
  ASSERT_EQ(cluster_->Ctl({"stop", "t"}).exit_code, 0);
  CommandResult followed = cluster_->Ctl({"logs", "t", "-f"}, absl::Seconds(60));
  EXPECT_EQ(followed.exit_code, 0) << followed.err;
  EXPECT_THAT(followed.out, HasSubstr("STOPPED"));

  // This cluster keeps no checkpoints: none to remove, said, and the job kept.
  CommandResult no_files = cluster_->Ctl({"delete", "t", "--with_checkpoints"});
  EXPECT_EQ(no_files.exit_code, 1);
  EXPECT_THAT(no_files.err, HasSubstr("no --checkpoint_root"));
  EXPECT_EQ(cluster_->Ctl({"get", "t"}).exit_code, 0);
  CommandResult deleted = cluster_->Ctl({"delete", "t"});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_EQ(cluster_->Ctl({"get", "t"}).exit_code, 1);
  EXPECT_THAT(cluster_->Ctl({"list"}).out, Not(HasSubstr("t  ")));
}

TEST_F(OperatorCliTest, FinishedJobsBeyondTheRetentionLeaveTheStore) {
  Start(1, 1, {"--job_retention_count=1"});
  const std::string spec = WriteSpec(FashionMlpSpec("SYNC", 1, 1, 20));
  ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=old", "--wait"}).exit_code, 0);
  ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=new", "--wait"}).exit_code, 0);
  ASSERT_TRUE(AwaitJob("old", [&](const JobStatus&) {
    return cluster_->Ctl({"get", "old"}).exit_code != 0;
  })) << cluster_->Ctl({"list"}).out;
  EXPECT_EQ(GetJob("new").state(), SUCCEEDED);
  // Durably: a restarted coordinator does not bring it back.
  ASSERT_TRUE(cluster_->RestartCoordinator().ok()) << cluster_->Logs();
  EXPECT_NE(cluster_->Ctl({"get", "old"}).exit_code, 0);
  EXPECT_EQ(GetJob("new").state(), SUCCEEDED);
  EXPECT_THAT(ReadFile(cluster_->coordinator()->log_path()), HasSubstr("job old removed"));
}

TEST_F(OperatorCliTest, RejectedInputExits2AndTheCoordinatorIsFoundByItself) {
  Start(1, 1);
  const std::string spec = WriteSpec(FashionMlpSpec("SYNC", 1, 1, 20));
  ASSERT_EQ(cluster_->Ctl({"submit", spec, "--job_id=same"}).exit_code, 0);
  CommandResult duplicate = cluster_->Ctl({"submit", spec, "--job_id=same"});
  EXPECT_EQ(duplicate.exit_code, 2);
  EXPECT_THAT(duplicate.err, HasSubstr("already exists"));
  EXPECT_EQ(cluster_->Ctl({"list", "--no_such_flag"}).exit_code, 2);
  EXPECT_EQ(cluster_->Ctl({"export", "same", "--checkpoint=abc"}).exit_code, 2);
  CommandResult waited = cluster_->Ctl({"wait", "same"});
  EXPECT_EQ(waited.exit_code, 0) << waited.err;
  EXPECT_THAT(waited.out, HasSubstr("test_accuracy="));

  // DOWNPOUR_COORDINATOR, then a context of the config file.
  const std::string address = cluster_->coordinator_address();
  CommandResult from_env = CtlWithout({"DOWNPOUR_COORDINATOR=" + address}, {"list"});
  EXPECT_EQ(from_env.exit_code, 0) << from_env.err;
  EXPECT_THAT(from_env.out, HasSubstr("same"));
  ASSERT_EQ(CtlWithout({}, {"config", "set-context", "here", "--coordinator=" + address}).exit_code,
            0);
  ASSERT_EQ(
      CtlWithout({}, {"config", "set-context", "elsewhere", "--coordinator=127.0.0.1:1"}).exit_code,
      0);
  ASSERT_EQ(CtlWithout({}, {"config", "use-context", "here"}).exit_code, 0);
  CommandResult contexts = CtlWithout({}, {"config", "get-contexts"});
  EXPECT_THAT(contexts.out, HasSubstr("*        here"));
  CommandResult from_context = CtlWithout({}, {"list"});
  EXPECT_EQ(from_context.exit_code, 0) << from_context.err;
  EXPECT_THAT(from_context.out, HasSubstr("same"));
  CommandResult version = CtlWithout({}, {"version"});
  EXPECT_THAT(version.out, HasSubstr("from context here"));
  EXPECT_EQ(CtlWithout({}, {"--context=nowhere", "list"}).exit_code, 2);
  CommandResult completion = CtlWithout({}, {"completion", "bash"});
  EXPECT_THAT(completion.out, HasSubstr("complete -F _downpourctl downpourctl"));
}

}  // namespace
}  // namespace testing
}  // namespace downpour
