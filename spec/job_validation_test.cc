// ValidateJobSpec's checks: every Precision the proto defines is accepted
// and an unknown number is refused naming the field and the valid names;
// push_every / fetch_every and the evaluation settings; the metrics (known,
// once each, AUC and LOG_LOSS for two-class models only); the sparse tables'
// optimizers, each error naming the optimizer it checked; the size limits of
// spec/limits.h, each named with its size and limit; record-file globs that
// could leave the worker's data directory.
#include "spec/job_validation.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "spec/limits.h"
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

TEST(JobValidationTest, MetricsAreKnownListedOnceAndAucNeedsTwoClasses) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  ApplyJobDefaults(&spec);
  spec.add_metrics(ACCURACY);  // num_classes 3.
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.add_metrics(AUC);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "metrics: AUC needs a two-class model (num_classes 2), got 3");
  spec.set_metrics(1, LOG_LOSS);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "metrics: LOG_LOSS needs a two-class model (num_classes 2), got 3");

  spec.mutable_model()->set_num_classes(2);
  spec.mutable_model()->mutable_layer(2)->mutable_dense()->set_units(2);
  spec.set_metrics(1, AUC);
  spec.add_metrics(LOG_LOSS);
  const auto params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  spec.add_metrics(AUC);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(), "metrics lists AUC twice");
  spec.set_metrics(3, static_cast<Metric>(7));
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "metrics[3] has unknown value 7; must be ACCURACY, AUC or LOG_LOSS");
  spec.clear_metrics();
  EXPECT_TRUE(ValidateJobSpec(spec).ok());  // Empty: ACCURACY.
}

// SmallMlpJob (defaults applied) whose model is a sparse embedding "emb"
// (model.layer[0], table emb/table) of SPARSE input "ids", then a dense
// layer and the loss; the job's optimizer is ADAM.
JobSpec SparseTableJob() {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  ApplyJobDefaults(&spec);
  ModelSpec* model = spec.mutable_model();
  model->clear_input_shape();
  model->set_num_classes(2);
  InputSpec* ids = model->add_inputs();
  ids->set_name("ids");
  ids->set_kind(InputSpec::SPARSE);
  model->clear_layer();
  LayerSpec* emb = model->add_layer();
  emb->set_name("emb");
  emb->add_inputs("ids");
  emb->mutable_embedding()->set_sparse(true);
  emb->mutable_embedding()->set_vocab_size(100);
  emb->mutable_embedding()->set_dim(4);
  model->add_layer()->mutable_dense()->set_units(2);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  return spec;
}

TEST(JobValidationTest, SparseTablesTakeNoMomentumAndCheckTheirOwnOptimizer) {
  JobSpec spec = SparseTableJob();
  LayerSpec* emb = spec.mutable_model()->mutable_layer(0);
  auto params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  spec.mutable_optimizer()->set_kind(OptimizerSpec::MOMENTUM);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "sparse table emb/table: MOMENTUM is not offered for sparse tables; set "
            "model.layer[0].embedding.optimizer to SGD, ADAGRAD or ADAM");
  OptimizerSpec* own = emb->mutable_embedding()->mutable_optimizer();
  own->set_kind(OptimizerSpec::ADAGRAD);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "model.layer[0].embedding.optimizer.learning_rate must be positive");
  own->set_learning_rate(0.05f);
  params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
  own->set_kind(OptimizerSpec::MOMENTUM);  // Its own: the same sentence.
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "sparse table emb/table: MOMENTUM is not offered for sparse tables; set "
            "model.layer[0].embedding.optimizer to SGD, ADAGRAD or ADAM");
}

// An optimizer's errors name the field that was checked: the job's
// (optimizer.*) or a sparse table's own (model.layer[i].embedding.optimizer.*).
TEST(JobValidationTest, OptimizerErrorsNameTheOptimizerTheyChecked) {
  JobSpec spec = SparseTableJob();
  spec.mutable_optimizer()->set_beta1(1.f);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(), "optimizer.beta1 must be in [0, 1)");
  spec.mutable_optimizer()->set_beta1(0.9f);
  OptimizerSpec* own =
      spec.mutable_model()->mutable_layer(0)->mutable_embedding()->mutable_optimizer();
  own->set_kind(OptimizerSpec::ADAM);
  own->set_learning_rate(0.01f);
  own->set_beta1(1.5f);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "model.layer[0].embedding.optimizer.beta1 must be in [0, 1)");
  own->set_beta1(0.9f);
  own->set_beta2(-0.5f);
  EXPECT_EQ(ValidateJobSpec(spec).status().message(),
            "model.layer[0].embedding.optimizer.beta2 must be in [0, 1)");
  own->set_beta2(0.999f);
  const auto params = ValidateJobSpec(spec);
  EXPECT_TRUE(params.ok()) << params.status();
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

// The message ValidateJobSpec gives `spec` after defaults ("" when valid).
std::string Refusal(JobSpec spec) {
  ApplyJobDefaults(&spec);
  const auto params = ValidateJobSpec(spec);
  if (params.ok()) return "";
  EXPECT_EQ(params.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(params.status().message());
}

TEST(JobValidationTest, EveryStringAndListOfTheSpecIsBounded) {
  const JobSpec base = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  EXPECT_EQ(Refusal(base), "");
  struct Case {
    std::function<void(JobSpec*)> change;
    std::string message;
  };
  const std::string long_name(kMaxNameBytes + 1, 'n');
  const std::vector<Case> cases = {
      {[&](JobSpec* s) { s->set_name(long_name); }, "name is 129 bytes; the limit is 128 bytes"},
      {[](JobSpec* s) { s->set_num_workers(kMaxWorkers + 1); },
       "num_workers is 4097; the limit is 4096"},
      {[](JobSpec* s) { s->set_num_shards(kMaxShards + 1); },
       "num_shards is 1025; the limit is 1024"},
      {[](JobSpec* s) { s->mutable_checkpoint()->set_keep(101); },
       "checkpoint.keep is 101; the limit is 100"},
      {[](JobSpec* s) { s->set_partition_bytes(kMaxPartitionBytes + 1); },
       "partition_bytes is 67108865; the limit is 67108864 (64 MiB: a partition travels whole "
       "in one message)"},
      {[](JobSpec* s) {
         for (int i = 0; i < 8; ++i) s->mutable_model()->add_input_shape(1);
       },
       "model.input_shape has 9 entries; the limit is 8"},
      {[](JobSpec* s) {
         while (s->model().layer_size() <= kMaxLayers)
           s->mutable_model()->add_layer()->mutable_relu();
       },
       "model.layer has 2049 entries; the limit is 2048"},
      {[&](JobSpec* s) { s->mutable_model()->mutable_layer(1)->set_name(long_name); },
       "model.layer[1].name is 129 bytes; the limit is 128 bytes"},
      {[](JobSpec* s) {
         for (int i = 0; i <= kMaxLayerInputs; ++i)
           s->mutable_model()->mutable_layer(3)->add_inputs("x");
       },
       "model.layer[3].inputs has 65 entries; the limit is 64"},
      {[&](JobSpec* s) { s->mutable_model()->mutable_layer(2)->add_inputs(long_name); },
       "model.layer[2].inputs[0] is 129 bytes; the limit is 128 bytes"},
      {[](JobSpec* s) { s->mutable_dataset()->set_train_files(std::string(5000, 'a')); },
       "dataset.train_files is 5000 bytes; the limit is 4096 bytes (4 KiB)"},
      {[](JobSpec* s) { s->mutable_dataset()->set_test_files(std::string(4097, 'a')); },
       "dataset.test_files is 4097 bytes; the limit is 4096 bytes (4 KiB)"},
      {[](JobSpec* s) { s->mutable_dataset()->set_feature_key(std::string(257, 'k')); },
       "dataset.feature_key is 257 bytes; the limit is 256 bytes"},
      {[](JobSpec* s) { s->mutable_dataset()->set_label_key(std::string(300, 'k')); },
       "dataset.label_key is 300 bytes; the limit is 256 bytes"},
  };
  for (const Case& c : cases) {
    JobSpec spec = base;
    c.change(&spec);
    EXPECT_EQ(Refusal(spec), c.message);
  }
}

TEST(JobValidationTest, TheWholeSpecIsBoundedFieldsItDoesNotKnowIncluded) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  // Many layers of names within their own limits.
  for (int i = 0; i < 1200; ++i) {
    LayerSpec* layer = spec.mutable_model()->add_layer();
    layer->set_name(std::string(120, 'a' + i % 26) + std::to_string(i));
    layer->mutable_relu();
  }
  EXPECT_EQ(Refusal(spec).rfind("the job spec is ", 0), 0u) << Refusal(spec);
  EXPECT_NE(Refusal(spec).find("; the limit is 131072 bytes (128 KiB)"), std::string::npos);
  // A field this version does not know (number 999, length-delimited).
  JobSpec unknown = SmallMlpJob(1, 1);
  std::string bytes = unknown.SerializeAsString();
  const std::string blob(200 << 10, 'u');
  bytes += std::string("\xba\x3e", 2);  // Tag of field 999, wire type 2.
  uint32_t size = blob.size();
  while (size >= 0x80) {
    bytes.push_back(static_cast<char>(size | 0x80));
    size >>= 7;
  }
  bytes.push_back(static_cast<char>(size));
  bytes += blob;
  ASSERT_TRUE(unknown.ParseFromString(bytes));
  EXPECT_EQ(Refusal(unknown).rfind("the job spec is ", 0), 0u) << Refusal(unknown);
}

TEST(JobValidationTest, TooManyPartitionsForThePlacementAreRefused) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  // 8 x 3M + 3M x 3 weights: in 1 KiB partitions, over 2^17 of them.
  spec.mutable_model()->mutable_layer(0)->mutable_dense()->set_units(3000000);
  spec.set_partition_bytes(1024);
  const std::string message = Refusal(spec);
  EXPECT_EQ(
      message.rfind("partition_bytes 1024 cuts the model's 137 MiB into 140627 partitions", 0), 0u)
      << message;
  EXPECT_NE(message.find("; the limit is 131072 (every node is sent the placement)"),
            std::string::npos)
      << message;
  spec.set_partition_bytes(256 << 10);
  EXPECT_EQ(Refusal(spec), "");
}

TEST(JobValidationTest, DataPathsMustStayInsideTheWorkersDataDirectory) {
  JobSpec spec = SmallMlpJob(/*num_workers=*/1, /*num_shards=*/1);
  spec.mutable_dataset()->set_train_files("/etc/*");
  EXPECT_EQ(Refusal(spec),
            "dataset.train_files \"/etc/*\" is an absolute path; record files are named relative "
            "to each worker's --data_dir");
  spec.mutable_dataset()->set_train_files("fashion-mnist/train-*");
  spec.mutable_dataset()->set_test_files("../x");
  EXPECT_EQ(Refusal(spec),
            "dataset.test_files \"../x\" has the component \"..\", which can name the parent "
            "directory; record files must stay inside each worker's --data_dir");
  spec.mutable_dataset()->set_test_files("data/.*/test-*");
  EXPECT_NE(Refusal(spec).find("has the component \".*\""), std::string::npos);
  spec.mutable_dataset()->set_test_files("data/test-*");
  EXPECT_EQ(Refusal(spec), "");
}

TEST(JobValidationTest, JobIdsAreBounded) {
  EXPECT_TRUE(ValidateJobId(std::string(kMaxJobIdBytes, 'j')).ok());
  EXPECT_EQ(ValidateJobId(std::string(kMaxJobIdBytes + 1, 'j')).message(),
            "the job id is 65 bytes; the limit is 64 bytes");
  EXPECT_FALSE(ValidateJobId("").ok());
  EXPECT_FALSE(ValidateJobId("a/b").ok());
}

}  // namespace
}  // namespace downpour
