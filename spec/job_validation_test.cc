// ValidateJobSpec's checks: every Precision the proto defines is accepted
// and an unknown number is refused naming the field and the valid names;
// push_every / fetch_every and the evaluation settings.
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

TEST(JobValidationTest, PushAndFetchEveryApplyToAsyncAndSspOnly) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/2, /*num_shards=*/1);
  ApplyJobDefaults(&spec);
  spec.mutable_consistency()->set_push_every(1);
  spec.mutable_consistency()->set_fetch_every(1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());  // 1 is every step, as SYNC is.
  spec.mutable_consistency()->set_push_every(4);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "consistency.push_every applies to modes ASYNC and SSP only (a SYNC step is every "
            "worker's)");
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  spec.mutable_consistency()->set_fetch_every(3);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.mutable_consistency()->set_fetch_every(-1);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "consistency.fetch_every must not be negative");
}

TEST(JobValidationTest, EvaluationSettingsAreChecked) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  ApplyJobDefaults(&spec);
  spec.set_eval_every_steps(-5);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(), "eval_every_steps must not be negative");
  spec.set_eval_every_steps(0);
  spec.set_stop_at_accuracy(0.9);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "stop_at_accuracy needs eval_every_steps > 0 (the job is evaluated only at its end)");
  spec.set_eval_every_steps(100);
  spec.set_stop_at_accuracy(1.01);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(), "stop_at_accuracy must be in [0, 1]");
  spec.set_stop_at_accuracy(0.9);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

}  // namespace
}  // namespace downpour
