#include "client/config.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = R"(# two clusters
current-context: prod
contexts:
- name: prod
  coordinator: coord.example:7070
  - name: "local"
    coordinator: 127.0.0.1:7070
)";

TEST(CtlConfigTest, ParsesContextsAndRoundTrips) {
  absl::StatusOr<CtlConfig> config = ParseCtlConfig(kConfig, "config.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->current_context, "prod");
  ASSERT_EQ(config->contexts.size(), 2u);
  EXPECT_EQ(config->Find("local")->coordinator, "127.0.0.1:7070");
  absl::StatusOr<CtlConfig> again = ParseCtlConfig(FormatCtlConfig(*config), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->contexts.size(), 2u);
  EXPECT_EQ(again->Find("prod")->coordinator, "coord.example:7070");
}

TEST(CtlConfigTest, AMalformedFileNamesTheLine) {
  absl::StatusOr<CtlConfig> config =
      ParseCtlConfig("current-context: a\ncontexts:\n- name: a\n  port: 1\n", "c.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("c.yaml:4:"));
  EXPECT_THAT(config.status().message(), HasSubstr("'port'"));
}

TEST(CtlConfigTest, FlagThenContextThenEnvironmentThenCurrentContext) {
  CtlConfig config = *ParseCtlConfig(kConfig, "c");
  std::string source;
  EXPECT_EQ(*ResolveCoordinator("h:1", "e:2", "local", config, &source), "h:1");
  EXPECT_EQ(*ResolveCoordinator("", "e:2", "local", config, &source), "127.0.0.1:7070");
  EXPECT_EQ(source, "context local");
  EXPECT_EQ(*ResolveCoordinator("", "e:2", "", config, &source), "e:2");
  EXPECT_EQ(source, "DOWNPOUR_COORDINATOR");
  EXPECT_EQ(*ResolveCoordinator("", nullptr, "", config, &source), "coord.example:7070");
  EXPECT_EQ(*ResolveCoordinator("", nullptr, "", CtlConfig(), &source), "127.0.0.1:7070");
  EXPECT_FALSE(ResolveCoordinator("", nullptr, "nope", config, &source).ok());
  config.current_context = "gone";
  EXPECT_FALSE(ResolveCoordinator("", nullptr, "", config, &source).ok());
}

TEST(CtlConfigTest, SavesAndLoadsAFile) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
      "/cfg/downpour/config.yaml";
  CtlConfig config;
  config.current_context = "a";
  config.contexts.push_back({"a", "h:1"});
  ASSERT_TRUE(SaveCtlConfig(path, config).ok());
  absl::StatusOr<CtlConfig> loaded = LoadCtlConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->Find("a")->coordinator, "h:1");
  EXPECT_TRUE(LoadCtlConfig(path + ".missing")->contexts.empty());
  EXPECT_EQ(DefaultConfigPath(nullptr, "/home/u"), "/home/u/.config/downpour/config.yaml");
  EXPECT_EQ(DefaultConfigPath("/x", "/home/u"), "/x/downpour/config.yaml");
}

}  // namespace
}  // namespace downpour
