// What operators get wrong when starting daemons: each mistake ends in one
// clear sentence naming the thing and a non-zero exit, within seconds.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

struct Case {
  std::string binary;
  std::vector<std::string> flags;
  std::string expected;  // In stderr.
};

class DaemonFlagsTest : public ::testing::TestWithParam<Case> {};

TEST_P(DaemonFlagsTest, FailsWithOneClearSentence) {
  const Case& c = GetParam();
  std::vector<std::string> argv = {Runfile(c.binary)};
  argv.insert(argv.end(), c.flags.begin(), c.flags.end());
  const absl::Time start = absl::Now();
  CommandResult result = RunCommand(argv, absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_NE(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find(c.expected), std::string::npos)
      << "expected \"" << c.expected << "\" in: " << result.err;
}

std::string Dir() { return MakeTempDir("flags"); }

INSTANTIATE_TEST_SUITE_P(
    Daemons, DaemonFlagsTest,
    ::testing::Values(
        Case{"coordinator/downpour-coordinator", {"--listen=127.0.0.1:0"}, "--state_dir"},
        Case{"coordinator/downpour-coordinator",
             {"--listen=nonsense", "--state_dir=" + Dir()},
             "\"nonsense\""},
        Case{"coordinator/downpour-coordinator",
             {"--listen=127.0.0.1:0", "--state_dir=/proc/forbidden/state"},
             "/proc/forbidden/state"},
        Case{"server/downpour-ps", {"--listen=127.0.0.1:0"}, "--coordinator"},
        Case{"server/downpour-ps",
             {"--coordinator=127.0.0.1:1", "--drain_timeout_s=-1"},
             "--drain_timeout_s must not be negative"},
        Case{"worker/downpour-worker", {"--listen=127.0.0.1:0"}, "--coordinator"},
        Case{"server/downpour-ps",
             {"--listen=127.0.0.1:0", "--coordinator=127.0.0.1:1", "--coordinator_timeout_ms=1000"},
             "cannot register with coordinator at 127.0.0.1:1"},
        Case{"worker/downpour-worker",
             {"--listen=127.0.0.1:0", "--coordinator=127.0.0.1:1", "--coordinator_timeout_ms=1000"},
             "cannot register with coordinator at 127.0.0.1:1"},
        Case{"worker/downpour-worker",
             {"--coordinator=127.0.0.1:1", "--data_dir=/no/such/dir"},
             "/no/such/dir"},
        Case{"worker/downpour-worker",
             {"--coordinator=127.0.0.1:1", "--metrics_listen=300.1.1.1:99999"},
             "300.1.1.1:99999"}));

TEST(DaemonTest, ListenAddressInUseIsReported) {
  const std::string dir = MakeTempDir("inuse");
  auto first = Process::Spawn({Runfile("coordinator/downpour-coordinator"), "--listen=127.0.0.1:0",
                               "--state_dir=" + dir + "/a", "--port_file=" + dir + "/port"},
                              dir + "/first.log");
  ASSERT_TRUE(first.ok());
  std::string address;
  for (int i = 0; i < 500 && address.empty(); ++i) {
    address = ReadFile(dir + "/port");
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_FALSE(address.empty());
  address = address.substr(0, address.find('\n'));
  const absl::Time start = absl::Now();
  CommandResult second = RunCommand({Runfile("coordinator/downpour-coordinator"),
                                     "--listen=" + address, "--state_dir=" + dir + "/b"},
                                    absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("cannot listen on " + address), std::string::npos) << second.err;
  EXPECT_EQ((*first)->Stop(), 0);
}

// --help lists the daemon's own flags (its main's and rpc/'s shared ones),
// not only --helpfull.
TEST(DaemonTest, HelpListsEachDaemonsOwnFlags) {
  const struct {
    std::string binary;
    std::vector<std::string> flags;
  } daemons[] = {
      {"coordinator/downpour-coordinator", {"--state_dir", "--job_retention_count", "--listen"}},
      {"server/downpour-ps", {"--coordinator", "--listen", "--drain_timeout_s"}},
      {"worker/downpour-worker", {"--coordinator", "--data_dir", "--advertise"}},
  };
  for (const auto& daemon : daemons) {
    CommandResult help = RunCommand({Runfile(daemon.binary), "--help"}, absl::Seconds(20));
    const std::string text = help.out + help.err;
    for (const std::string& flag : daemon.flags) {
      EXPECT_NE(text.find(flag + " ("), std::string::npos) << daemon.binary << " --help: " << text;
    }
    // absl's own flags are left to --helpfull.
    EXPECT_EQ(text.find("--flagfile ("), std::string::npos) << daemon.binary;
  }
}

}  // namespace
}  // namespace testing
}  // namespace downpour
