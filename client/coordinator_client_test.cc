#include "client/coordinator_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  std::ofstream out(path);
  out << contents;
  return path;
}

// A loopback port nobody listens on: bound, then closed.
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(LoadJobSpecTest, ReadsTextFormat) {
  const std::string path = WriteFile("good.pbtxt", R"(
name: "mnist"
num_workers: 2
steps: 100
model { input_shape: 784 num_classes: 10 layer { dense { units: 10 } } }
)");
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "mnist");
  EXPECT_EQ(spec->num_workers(), 2);
  EXPECT_EQ(spec->model().layer(0).dense().units(), 10);
}

TEST(LoadJobSpecTest, ParseErrorNamesFileLineAndColumn) {
  const std::string path = WriteFile("bad.pbtxt", "name: \"x\"\nsteps: 10\n  bogus_field: 3\n");
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path + ":3:14: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("bogus_field"));
}

TEST(LoadJobSpecTest, BadValueNamesFileLineAndColumn) {
  const std::string path = WriteFile("bad_value.pbtxt", "steps: \"many\"\n");
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path + ":1:8: "));
}

TEST(LoadJobSpecTest, MissingFileIsNotFoundNamingIt) {
  const std::string path = TempPath("no_such_spec.pbtxt");
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));
}

TEST(LoadJobSpecTest, DirectoryIsRejected) {
  absl::StatusOr<JobSpec> spec = LoadJobSpec(TempPath(""));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("is a directory"));
}

TEST(ConnectTest, UnusedLoopbackPortFailsQuicklyNamingTheAddress) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedPort());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect(address, absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("cannot reach coordinator at " + address));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("within 2s"));
  EXPECT_LT(took, absl::Seconds(4));
}

TEST(ConnectTest, EmptyAddressIsInvalid) {
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect("");
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace downpour
