#include "client/output.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

TEST(OutputTest, ParsesEveryFormatAndNamesAnUnknownOne) {
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  absl::StatusOr<OutputFormat> bad = ParseOutputFormat("xml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'xml'"));
}

TEST(OutputTest, YamlHasScalarsEnumsNestedAndRepeatedFields) {
  JobStatus job;
  job.set_id("j\"1");
  job.set_state(RUNNING);
  job.set_step(42);
  job.mutable_spec()->set_name("mnist");
  job.mutable_placement()->add_worker_nodes("worker@a");
  job.mutable_placement()->add_worker_nodes("worker@b");
  JobEvent* event = job.add_events();
  event->set_time_ms(5);
  event->set_message("started");
  const std::string yaml = ToYaml(job);
  EXPECT_THAT(yaml, HasSubstr("id: \"j\\\"1\"\n"));
  EXPECT_THAT(yaml, HasSubstr("state: RUNNING\n"));
  EXPECT_THAT(yaml, HasSubstr("step: 42\n"));
  EXPECT_THAT(yaml, HasSubstr("spec:\n  name: \"mnist\"\n"));
  EXPECT_THAT(yaml, HasSubstr("  worker_nodes:\n  - \"worker@a\"\n  - \"worker@b\"\n"));
  EXPECT_THAT(yaml, HasSubstr("events:\n- time_ms: 5\n  message: \"started\"\n"));
  EXPECT_THAT(yaml, HasSubstr("checkpoints: []\n"));
}

TEST(OutputTest, JsonKeepsProtoFieldNamesAndDefaults) {
  NodeInfo node;
  node.set_id("ps@x");
  const std::string json = ToJson(node);
  EXPECT_THAT(json, HasSubstr("\"id\": \"ps@x\""));
  EXPECT_THAT(json, HasSubstr("\"last_heartbeat_ms\""));
  EXPECT_THAT(json, HasSubstr("\"cordoned\": false"));
}

TEST(OutputTest, ShortDurationsAndAgo) {
  EXPECT_EQ(FormatShortDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(FormatShortDuration(absl::Seconds(65)), "1m05s");
  EXPECT_EQ(FormatShortDuration(absl::Hours(2) + absl::Minutes(3)), "2h03m");
  EXPECT_EQ(Ago(0, 1000), "-");
  EXPECT_EQ(Ago(1000, 91000), "1m30s ago");
}

}  // namespace
}  // namespace downpour
