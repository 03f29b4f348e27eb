// Every job spec in examples/ parses and passes ValidateJobSpec, as
// `downpourctl submit` would check it.
#include <dirent.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "spec/job_validation.h"

namespace downpour {
namespace {

TEST(ExamplesTest, EveryExampleSpecValidates) {
  const std::string dir =
      std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") + "/examples";
  DIR* listing = opendir(dir.c_str());
  ASSERT_NE(listing, nullptr) << dir;
  std::vector<std::string> specs;
  while (dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.size() > 6 && name.substr(name.size() - 6) == ".pbtxt") specs.push_back(name);
  }
  closedir(listing);
  EXPECT_GE(specs.size(), 8u);
  for (const std::string& name : specs) {
    std::ifstream in(dir + "/" + name);
    std::stringstream text;
    text << in.rdbuf();
    JobSpec spec;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text.str(), &spec)) << name;
    ApplyJobDefaults(&spec);
    const auto params = ValidateJobSpec(spec);
    EXPECT_TRUE(params.ok()) << name << ": " << params.status();
  }
}

}  // namespace
}  // namespace downpour
