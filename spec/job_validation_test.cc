// ValidateJobSpec's checks: every Precision the proto defines is accepted
// and an unknown number is refused naming the field and the valid names;
// push_every / fetch_every and the evaluation settings.
#include "spec/job_validation.h"

#include <algorithm>
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

TEST(JobValidationTest, ImageDataOptionsAreChecked) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  ApplyJobDefaults(&spec);
  DatasetSpec* data = spec.mutable_dataset();
  // A flat input (input_shape [8]) takes compression but neither images nor
  // augmentation.
  data->set_compression(DatasetSpec::GZIP);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  data->set_compression(static_cast<DatasetSpec::Compression>(9));
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "dataset.compression has unknown value 9; must be AUTO, NONE or GZIP");
  data->set_compression(DatasetSpec::AUTO);
  data->set_decode_threads(65);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "dataset.decode_threads must be in [0, 64] (0: automatic)");
  data->set_decode_threads(4);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  data->set_random_flip_left_right(true);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "dataset.random_flip_left_right needs model.input_shape [height, width, channels]");
  data->set_random_flip_left_right(false);
  data->set_encoding(DatasetSpec::ENCODED);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "dataset.encoding ENCODED needs model.input_shape [height, width, channels] with 1 "
            "(grayscale) or 3 (RGB) channels");

  // An 8x4 RGB image.
  spec.mutable_model()->clear_input_shape();
  for (int d : {8, 4, 3}) spec.mutable_model()->add_input_shape(d);
  LayerSpec flatten;
  flatten.mutable_flatten();
  *spec.mutable_model()->mutable_layer()->Add() = flatten;
  std::rotate(spec.mutable_model()->mutable_layer()->rbegin(),
              spec.mutable_model()->mutable_layer()->rbegin() + 1,
              spec.mutable_model()->mutable_layer()->rend());
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  data->mutable_random_crop()->set_padding(4);
  data->set_random_flip_left_right(true);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  data->mutable_random_crop()->set_padding(5);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "dataset.random_crop.padding must be in [0, 4] (the input's height and width); got 5");
  data->mutable_random_crop()->set_padding(-1);
  EXPECT_FALSE(ValidateJobSpec(spec).ok());
}

}  // namespace
}  // namespace downpour
