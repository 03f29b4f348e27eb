// What a client sends is bounded at the coordinator's door, against the
// real daemons: `downpourctl submit` of a spec with an oversized field, or
// with a dataset path that would leave the workers' --data_dir, exits 2
// with one line naming the field; the cluster keeps training another job
// meanwhile, and `list` stays small.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

using ::testing::HasSubstr;

class InputLimitsTest : public ClusterFixture {};

TEST_F(InputLimitsTest, OversizedOrEscapingSpecsExitTwoWhileTheClusterTrains) {
  LocalCluster::Options options;
  options.shards = 1;
  options.workers = 1;
  StartCluster(options);
  ASSERT_EQ(
      cluster_
          ->Ctl({"submit", WriteSpec(FashionMlpSpec("ASYNC", 1, 1, 1000000)), "--job_id=steady"})
          .exit_code,
      0);
  ASSERT_TRUE(AwaitJob("steady", [](const JobStatus& j) { return j.step() >= 20; }))
      << cluster_->Logs();

  const std::string spec = FashionMlpSpec("SYNC", 1, 1, 10);
  const std::string train = "fashion-mnist/train-*.tfrecord";
  const std::string huge(1 << 20, 'x');
  struct Case {
    std::string spec;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {absl::StrReplaceAll(spec, {{train, huge}}),
       "dataset.train_files is 1048576 bytes; the limit is 4096 bytes (4 KiB)"},
      {absl::StrReplaceAll(spec, {{"name: \"mlp\"", absl::StrCat("name: \"", huge, "\"")}}),
       "name is 1048576 bytes; the limit is 128 bytes"},
      {absl::StrReplaceAll(spec, {{"layer { flatten {} }",
                                   absl::StrCat("layer { name: \"", huge, "\" flatten {} }")}}),
       "model.layer[0].name is 1048576 bytes; the limit is 128 bytes"},
      {absl::StrReplaceAll(spec, {{train, "/etc/*"}}),
       "dataset.train_files \"/etc/*\" is an absolute path; record files are named relative to "
       "each worker's --data_dir"},
      {absl::StrReplaceAll(spec, {{train, "../x"}}),
       "dataset.train_files \"../x\" has the component \"..\", which can name the parent "
       "directory; record files must stay inside each worker's --data_dir"},
  };
  for (const Case& c : cases) {
    ASSERT_NE(c.spec, spec) << c.expected;
    const CommandResult result = cluster_->Ctl({"submit", WriteSpec(c.spec)});
    EXPECT_EQ(result.exit_code, 2) << c.expected << "\n" << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.expected));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_LT(result.err.size(), 1000u) << "the error echoes the oversized field";
  }
  // An over-long job id in any command is refused as such, without an echo.
  const CommandResult get = cluster_->Ctl({"get", std::string(100000, 'j')});
  EXPECT_EQ(get.exit_code, 2) << get.err;
  EXPECT_THAT(get.err, HasSubstr("job_id is 100000 bytes; the limit is 64 bytes"));
  EXPECT_LT(get.err.size(), 1000u);

  // The cluster went on training, and only the running job is listed.
  const int64_t step = cluster_->GetJob("steady").step();
  ASSERT_TRUE(AwaitJob("steady", [&](const JobStatus& j) { return j.step() >= step + 20; }))
      << cluster_->Logs();
  const CommandResult list = cluster_->Ctl({"-o", "json", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("\"id\": \"steady\""));
  EXPECT_LT(list.out.size(), 16u << 10) << list.out.substr(0, 2000);
  EXPECT_EQ(cluster_->Ctl({"stop", "steady"}).exit_code, 0);
}

}  // namespace
}  // namespace testing
}  // namespace downpour
