#include "common/file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
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

// Around the page cache (where the filesystem allows): the same bytes and
// CRC32C, whatever the sizes of the appends and of the file's tail.
TEST(AtomicFileTest, BypassingTheCacheWritesTheSameBytes) {
  const std::string dir = TempDir("bypass");
  for (size_t size : {size_t{0}, size_t{5}, size_t{4096}, size_t{(9 << 20) + 777}}) {
    const std::string path = absl::StrCat(dir, "/f", size);
    auto file = AtomicFile::Create(path, "test file", AtomicFile::Caching::kBypass);
    ASSERT_TRUE(file.ok()) << file.status();
    std::string expected;
    for (size_t at = 0; at < size;) {
      // Appends of odd sizes, some larger than the aligned buffer.
      const size_t n = std::min(size - at, at % 3 == 0 ? size_t{(5 << 20) + 3} : size_t{1001});
      const std::string piece(n, static_cast<char>('a' + at % 26));
      ASSERT_TRUE((*file)->Append(piece).ok());
      expected += piece;
      at += n;
    }
    ASSERT_TRUE((*file)->Commit().ok());
    std::printf("%zu bytes, bypassing the page cache: %d\n", size, (*file)->bypasses_cache());
    EXPECT_EQ(ReadFileToString(path).value(), expected) << size;
    EXPECT_EQ((*file)->bytes(), expected.size());
    EXPECT_EQ((*file)->crc32c(), Crc32c(expected.data(), expected.size()));
  }
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
