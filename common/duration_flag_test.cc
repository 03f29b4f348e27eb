#include "common/duration_flag.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(DurationFlagTest, SecondsGoStyleAndDays) {
  EXPECT_EQ(*ParseDurationFlag("t", "90"), absl::Seconds(90));
  EXPECT_EQ(*ParseDurationFlag("t", "0"), absl::ZeroDuration());
  EXPECT_EQ(*ParseDurationFlag("t", "1.5"), absl::Milliseconds(1500));
  EXPECT_EQ(*ParseDurationFlag("t", "36h"), absl::Hours(36));
  EXPECT_EQ(*ParseDurationFlag("t", "10m30s"), absl::Seconds(630));
  EXPECT_EQ(*ParseDurationFlag("t", "7d"), absl::Hours(168));
}

TEST(DurationFlagTest, NegativeOrMalformedNamesTheFlag) {
  for (const char* bad : {"-1", "-2h", "soon", "d", "7x", ""}) {
    const auto parsed = ParseDurationFlag("job_retention_age", bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("--job_retention_age="), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace downpour
