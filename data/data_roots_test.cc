// DataRoots: a record file is read only when its real path lies inside the
// worker's --data_dir or a --data_roots directory — a symlink that leads
// elsewhere, an absolute name and a ".." escape are refused, naming the file.
#include "data/data_roots.h"

#include <unistd.h>

#include <string>

#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace data {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class DataRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = testing::NewTempDir();
    outside_ = testing::NewTempDir();
    testing::WriteFileOrDie(data_dir_ + "/train-0", "records");
    testing::WriteFileOrDie(outside_ + "/secret", "not for jobs");
  }

  static void Link(const std::string& target, const std::string& link) {
    ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0) << link;
  }

  std::string data_dir_;
  std::string outside_;
};

TEST_F(DataRootsTest, FilesInsideTheDataDirectoryPass) {
  auto roots = DataRoots::Create(data_dir_);
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_TRUE(roots->Check("train-0").ok());
  // A link within the directory is fine too.
  Link(data_dir_ + "/train-0", data_dir_ + "/alias");
  EXPECT_TRUE(roots->Check("alias").ok());
  // The data directory may itself be reached through a link.
  const std::string via_link = testing::NewTempDir() + "/data";
  Link(data_dir_, via_link);
  auto linked = DataRoots::Create(via_link);
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_TRUE(linked->Check("train-0").ok());
}

TEST_F(DataRootsTest, ASymlinkThatLeadsOutsideIsRefused) {
  Link(outside_ + "/secret", data_dir_ + "/train-1");
  Link(outside_, data_dir_ + "/elsewhere");
  auto roots = DataRoots::Create(data_dir_);
  ASSERT_TRUE(roots.ok()) << roots.status();
  for (const char* name : {"train-1", "elsewhere/secret"}) {
    const absl::Status refused = roots->Check(name);
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << name;
    EXPECT_THAT(std::string(refused.message()), StartsWith(std::string("record file ") + name));
    EXPECT_THAT(std::string(refused.message()),
                HasSubstr("outside the worker's data directories (--data_dir=" + data_dir_ + ")"));
  }
  // The operator allows the other directory: the same links pass.
  auto allowed = DataRoots::Create(data_dir_, {outside_});
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(allowed->Check("train-1").ok());
  EXPECT_TRUE(allowed->Check("elsewhere/secret").ok());
  EXPECT_EQ(allowed->Describe(), "--data_dir=" + data_dir_ + ", --data_roots=" + outside_);
}

TEST_F(DataRootsTest, AbsoluteNamesAndParentEscapesAreRefused) {
  auto roots = DataRoots::Create(data_dir_);
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(roots->Check(outside_ + "/secret").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(roots->Check("/etc/passwd").code(), absl::StatusCode::kPermissionDenied);
  // outside_ and data_dir_ are siblings under the test's temp directory.
  const std::string escape = "../" + outside_.substr(outside_.rfind('/') + 1) + "/secret";
  const absl::Status refused = roots->Check(escape);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(std::string(refused.message()), StartsWith("record file " + escape + " leads to "));
}

TEST_F(DataRootsTest, MissingFilesAndBadRootsAreNamed) {
  auto roots = DataRoots::Create(data_dir_);
  ASSERT_TRUE(roots.ok()) << roots.status();
  const absl::Status missing = roots->Check("train-9");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), StartsWith("record file train-9 (--data_dir="));
  EXPECT_EQ(DataRoots::Create(data_dir_, {"relative/dir"}).status().message(),
            "--data_roots entry 'relative/dir' is not an absolute path");
  EXPECT_EQ(DataRoots::Create(data_dir_, {outside_ + "/nope"}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(DataRoots::Create(data_dir_, {outside_ + "/secret"}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(DataRoots::Create(data_dir_ + "/nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace data
}  // namespace downpour
