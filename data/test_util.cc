#include "data/test_util.h"

#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "data/example.h"
#include "data/record_io.h"
#include "gtest/gtest.h"

namespace downpour {
namespace data {
namespace testing {

std::string TestDataDir() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "downpour") + "/data/testdata";
}

std::string NewTempDir() {
  const char* root = getenv("TEST_TMPDIR");
  std::string templ = std::string(root != nullptr ? root : "/tmp") + "/data_test_XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << templ;
  }
  return templ;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileOrDie(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

void WriteRecordsOrDie(const std::string& path, const std::vector<std::string>& records) {
  auto writer = RecordWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const std::string& r : records) ASSERT_TRUE((*writer)->Write(r).ok());
  ASSERT_TRUE((*writer)->Close().ok());
}

std::string TaggedExample(int64_t id, int64_t n) {
  std::vector<uint8_t> pixels(n, static_cast<uint8_t>(id % 256));
  return EncodeImageExample(pixels.data(), n, id, {n, 1, 1});
}

std::vector<InputFormat> CtrInputFormats(int sparse, int dense, int max_ids) {
  std::vector<InputFormat> inputs;
  for (int f = 1; f <= sparse; ++f) {
    InputFormat input;
    input.name = "C" + std::to_string(f);
    input.sparse = true;
    input.features = {input.name};
    input.max_ids = max_ids;
    inputs.push_back(input);
  }
  InputFormat input;
  input.name = "dense";
  for (int j = 1; j <= dense; ++j) input.features.push_back("I" + std::to_string(j));
  input.size = dense;
  inputs.push_back(input);
  return inputs;
}

}  // namespace testing
}  // namespace data
}  // namespace downpour
