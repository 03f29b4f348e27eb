// ValidateJobSpec's check of the compute precision: every Precision the
// proto defines is accepted, and an unknown number is refused naming the
// field and the names that are valid.
#include "spec/job_validation.h"

#include <string>

#include "gtest/gtest.h"
#include "spec/test_jobs.h"

namespace downpour {
namespace {

TEST(JobValidationTest, EveryPrecisionValidates) {
  for (Precision precision : {FP32, TF32, FP32_STRICT, BF16, FP16}) {
    JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
    spec.set_precision(precision);
    ApplyJobDefaults(&spec);
    const auto params = ValidateJobSpec(spec);
    EXPECT_TRUE(params.ok()) << Precision_Name(precision) << ": " << params.status();
  }
}

TEST(JobValidationTest, AnUnknownPrecisionIsRefusedNamingTheField) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  spec.set_precision(static_cast<Precision>(42));
  ApplyJobDefaults(&spec);
  const auto params = ValidateJobSpec(spec);
  ASSERT_FALSE(params.ok());
  EXPECT_EQ(params.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(params.status().message());
  EXPECT_EQ(message.rfind("precision has unknown value 42", 0), 0u) << message;
  EXPECT_NE(message.find("FP32_STRICT"), std::string::npos) << message;
}

}  // namespace
}  // namespace downpour
