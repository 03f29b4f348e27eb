#include "common/file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/file_test_", name);
  EXPECT_TRUE(RemoveAll(dir).ok());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

TEST(AtomicFileTest, NothingAppearsUntilCommitThenAllOfIt) {
  const std::string dir = TempDir("commit");
  const std::string path = dir + "/f";
  auto file = AtomicFile::Create(path, "test file");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string big(3 << 20, 'x');  // Larger than the write buffer.
  ASSERT_TRUE((*file)->Append("head").ok());
  ASSERT_TRUE((*file)->Append(big).ok());
  EXPECT_FALSE(Exists(path));
  ASSERT_TRUE((*file)->Commit().ok());
  EXPECT_FALSE(Exists(path + ".tmp"));
  const std::string expected = "head" + big;
  EXPECT_EQ(ReadFileToString(path).value(), expected);
  EXPECT_EQ((*file)->bytes(), expected.size());
  EXPECT_EQ((*file)->crc32c(), Crc32c(expected.data(), expected.size()));
  EXPECT_FALSE((*file)->Append("more").ok());
}

TEST(AtomicFileTest, AbandonedFileLeavesNothing) {
  const std::string dir = TempDir("abandon");
  {
    auto file = AtomicFile::Create(dir + "/f", "test file");
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Append("partial").ok());
  }
  EXPECT_FALSE(Exists(dir + "/f"));
  EXPECT_FALSE(Exists(dir + "/f.tmp"));
}

TEST(AtomicFileTest, ErrorsNameTheFile) {
  auto file = AtomicFile::Create("/no/such/dir/f", "checkpoint file");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("cannot create checkpoint file /no/such/dir/f.tmp"),
            std::string::npos)
      << file.status();
}

TEST(FileTest, DirectoriesAreMadeListedAndRemoved) {
  const std::string dir = TempDir("dirs");
  ASSERT_TRUE(MakeDirs(dir + "/a/b/c").ok());
  ASSERT_TRUE(MakeDirs(dir + "/a/b/c").ok());  // Again: fine.
  auto f = AtomicFile::Create(dir + "/a/b/x", "test file");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_EQ(ListDir(dir + "/a/b").value(), (std::vector<std::string>{"c", "x"}));
  ASSERT_TRUE(RemoveAll(dir + "/a").ok());
  EXPECT_FALSE(Exists(dir + "/a"));
  EXPECT_TRUE(RemoveAll(dir + "/a").ok());  // Gone already: fine.
  EXPECT_EQ(ListDir(dir + "/a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadFileToString(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace downpour
