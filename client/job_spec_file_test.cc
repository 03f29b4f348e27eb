#include "client/job_spec_file.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace downpour
