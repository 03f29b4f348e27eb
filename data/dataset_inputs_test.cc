// BatchReader with named inputs (BatchReaderOptions::inputs) over click-log
// records from data/ctr_generator, plain and GZIP-compressed.
#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/ctr_generator.h"
#include "data/dataset.h"
#include "data/record_io.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace data {
namespace {

using testing::CtrInputFormats;
using ::testing::HasSubstr;
using testing::NewTempDir;

constexpr int64_t kPlainExamples = 500;  // ctr-train-0000[0-2]-of-00003.tfrecord.
constexpr int64_t kGzipExamples = 200;   // Indices kPlainExamples.., two gzip files.

// One example as the generator drew it, laid out as a batch holds it: each
// sparse feature's ids, then the 13 dense values, then the label.
struct Truth {
  std::vector<std::vector<int64_t>> ids;
  std::vector<float> dense;
  int32_t label = 0;
  bool operator==(const Truth& o) const {
    return ids == o.ids && dense == o.dense && label == o.label;
  }
  bool operator<(const Truth& o) const {
    return std::tie(ids, dense, label) < std::tie(o.ids, o.dense, o.label);
  }
};

Truth TruthOf(const CtrExample& e) {
  Truth t;
  for (size_t f = 0; f + 1 < e.id_offsets.size(); ++f) {
    t.ids.emplace_back(e.ids.begin() + e.id_offsets[f], e.ids.begin() + e.id_offsets[f + 1]);
  }
  t.dense = e.dense;
  t.label = e.label;
  return t;
}

// Example `i` of `batch`, checking the batch's shape on the way.
Truth ExampleOf(const Batch& batch, int64_t i) {
  Truth t;
  EXPECT_TRUE(batch.features.empty());
  EXPECT_EQ(batch.labels.size(), static_cast<size_t>(batch.size));
  EXPECT_EQ(batch.inputs.size(), 27u);
  if (batch.inputs.size() != 27u) return t;
  for (int f = 0; f < 26; ++f) {
    const InputBatch& input = batch.inputs[f];
    EXPECT_EQ(input.offsets.size(), static_cast<size_t>(batch.size + 1));
    EXPECT_EQ(input.offsets.back(), static_cast<int64_t>(input.ids.size()));
    t.ids.emplace_back(input.ids.begin() + input.offsets[i],
                       input.ids.begin() + input.offsets[i + 1]);
  }
  const InputBatch& dense = batch.inputs[26];
  EXPECT_EQ(dense.values.size(), static_cast<size_t>(13 * batch.size));
  t.dense.assign(dense.values.begin() + 13 * i, dense.values.begin() + 13 * (i + 1));
  t.label = batch.labels[i];
  return t;
}

class DatasetInputsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = NewTempDir();
    CtrDatasetOptions options;
    options.out_dir = dir_;
    options.name = "ctr";
    options.train_examples = kPlainExamples;
    options.test_examples = 1;
    options.num_shards = 3;
    absl::StatusOr<CtrDatasetSummary> summary = WriteCtrDataset(options);
    ASSERT_TRUE(summary.ok()) << summary.status();
    absl::StatusOr<std::unique_ptr<CtrGenerator>> generator =
        CtrGenerator::Create(options.generator);
    ASSERT_TRUE(generator.ok()) << generator.status();
    generator_ = *std::move(generator);
    // Examples kPlainExamples.. in two GZIP files, half each, in order.
    CtrExample drawn;
    for (int part = 0; part < 2; ++part) {
      auto writer = RecordWriter::Open(absl::StrCat(dir_, "/ctr-train-gz-", part, ".tfrecord"),
                                       Compression::kGzip);
      ASSERT_TRUE(writer.ok()) << writer.status();
      for (int64_t i = 0; i < kGzipExamples / 2; ++i) {
        generator_->Generate(CtrSplit::kTrain, kPlainExamples + part * kGzipExamples / 2 + i,
                             &drawn);
        ASSERT_TRUE((*writer)->Write(generator_->Encode(drawn)).ok());
      }
      ASSERT_TRUE((*writer)->Close().ok());
    }
  }

  BatchReaderOptions Options() {
    BatchReaderOptions o;
    absl::StatusOr<std::vector<std::string>> files = ListRecordFiles("ctr-train-*", dir_);
    EXPECT_TRUE(files.ok()) << files.status();
    if (files.ok()) o.slices = WholeFiles(*files);
    o.data_dir = dir_;
    o.inputs = CtrInputFormats();
    o.batch_size = 64;
    o.repeat = false;
    return o;
  }

  // Every example of the files, in the order a reader without shuffling
  // meets them (files sorted; generated shard s holds examples s, s + 3, ...).
  std::vector<Truth> InFileOrder() {
    std::vector<int64_t> order;
    for (int s = 0; s < 3; ++s) {
      for (int64_t i = s; i < kPlainExamples; i += 3) order.push_back(i);
    }
    // "ctr-train-0000..." sorts before "ctr-train-gz-...".
    for (int64_t i = 0; i < kGzipExamples; ++i) order.push_back(kPlainExamples + i);
    std::vector<Truth> truths;
    CtrExample drawn;
    for (int64_t i : order) {
      generator_->Generate(CtrSplit::kTrain, i, &drawn);
      truths.push_back(TruthOf(drawn));
    }
    return truths;
  }

  // Reads `max_batches` batches (or to the end of data).
  std::vector<Batch> ReadBatches(const BatchReaderOptions& options, int max_batches = 1 << 30) {
    absl::StatusOr<std::unique_ptr<BatchReader>> reader = BatchReader::Create(options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    std::vector<Batch> batches;
    if (!reader.ok()) return batches;
    while (static_cast<int>(batches.size()) < max_batches) {
      Batch batch;
      absl::StatusOr<bool> got = (*reader)->Next(&batch);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok() || !*got) break;
      batches.push_back(std::move(batch));
    }
    return batches;
  }

  std::string dir_;
  std::unique_ptr<CtrGenerator> generator_;
};

TEST_F(DatasetInputsTest, EvalPassReadsEveryExampleInOrderWithAShortLastBatch) {
  const std::vector<Truth> truths = InFileOrder();
  ASSERT_EQ(truths.size(), static_cast<size_t>(kPlainExamples + kGzipExamples));
  std::vector<Batch> batches = ReadBatches(Options());
  ASSERT_EQ(batches.size(), 11u);  // 700 = 10 * 64 + 60.
  EXPECT_EQ(batches.back().size, 60);
  size_t next = 0;
  for (const Batch& batch : batches) {
    for (int64_t i = 0; i < batch.size; ++i, ++next) {
      ASSERT_LT(next, truths.size());
      EXPECT_TRUE(ExampleOf(batch, i) == truths[next]) << "example " << next;
    }
  }
  EXPECT_EQ(next, truths.size());
}

TEST_F(DatasetInputsTest, ShuffledBatchesAreTheSameForAnyNumberOfDecodeThreads) {
  BatchReaderOptions o = Options();
  o.shuffle_buffer = 100;
  o.seed = 7;
  o.repeat = true;
  o.batch_size = 96;
  o.decode_threads = 1;
  const std::vector<Batch> one = ReadBatches(o, 16);  // Two epochs and more.
  o.decode_threads = 3;
  const std::vector<Batch> three = ReadBatches(o, 16);
  ASSERT_EQ(one.size(), 16u);
  ASSERT_EQ(three.size(), 16u);
  for (size_t b = 0; b < one.size(); ++b) {
    EXPECT_EQ(one[b].size, 96);
    EXPECT_EQ(one[b].labels, three[b].labels);
    ASSERT_EQ(one[b].inputs.size(), three[b].inputs.size());
    for (size_t i = 0; i < one[b].inputs.size(); ++i) {
      EXPECT_EQ(one[b].inputs[i].values, three[b].inputs[i].values) << "batch " << b;
      EXPECT_EQ(one[b].inputs[i].ids, three[b].inputs[i].ids) << "batch " << b;
      EXPECT_EQ(one[b].inputs[i].offsets, three[b].inputs[i].offsets) << "batch " << b;
    }
  }
  // The first epoch is a permutation of the examples, and shuffled.
  std::vector<Truth> read;
  for (const Batch& batch : one) {
    for (int64_t i = 0; i < batch.size; ++i) read.push_back(ExampleOf(batch, i));
  }
  read.resize(kPlainExamples + kGzipExamples);
  std::vector<Truth> truths = InFileOrder();
  EXPECT_FALSE(read == truths);
  std::sort(read.begin(), read.end());
  std::sort(truths.begin(), truths.end());
  EXPECT_TRUE(read == truths);
}

TEST_F(DatasetInputsTest, SlicesReadTheirShareOfAFile) {
  BatchReaderOptions o = Options();
  o.slices = {FileSlice{"ctr-train-gz-1.tfrecord", 3, 2}};
  o.decode_threads = 2;
  std::vector<Batch> batches = ReadBatches(o);
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size, 33);  // Records 2, 5, ..., 98 of 100.
  CtrExample drawn;
  for (int64_t i = 0; i < batches[0].size; ++i) {
    generator_->Generate(CtrSplit::kTrain, kPlainExamples + kGzipExamples / 2 + 2 + 3 * i, &drawn);
    EXPECT_TRUE(ExampleOf(batches[0], i) == TruthOf(drawn)) << i;
  }
}

TEST_F(DatasetInputsTest, BadRecordNamesFileOffsetAndFeature) {
  CtrExample drawn;
  std::vector<std::string> records;
  for (int64_t i = 0; i < 5; ++i) {
    generator_->Generate(CtrSplit::kTest, i, &drawn);
    if (i == 3) {  // C5 gets 5 ids; max_ids is 3.
      drawn.ids.insert(drawn.ids.begin() + drawn.id_offsets[5], 4, int64_t{77});
      for (size_t f = 5; f < drawn.id_offsets.size(); ++f) drawn.id_offsets[f] += 4;
    }
    records.push_back(generator_->Encode(drawn));
  }
  testing::WriteRecordsOrDie(dir_ + "/bad.tfrecord", records);
  BatchReaderOptions o = Options();
  o.slices = {FileSlice{"bad.tfrecord"}};
  o.batch_size = 2;
  o.decode_threads = 2;
  absl::StatusOr<std::unique_ptr<BatchReader>> reader = BatchReader::Create(o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Batch batch;
  absl::StatusOr<bool> got = (*reader)->Next(&batch);
  ASSERT_TRUE(got.ok() && *got) << got.status();
  got = (*reader)->Next(&batch);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("bad.tfrecord at offset "));
  EXPECT_THAT(got.status().message(), HasSubstr("feature \"C5\" has 5 ids; at most 3"));
}

TEST_F(DatasetInputsTest, CreateRefusesBadCombinations) {
  auto error = [](const BatchReaderOptions& o) {
    absl::StatusOr<std::unique_ptr<BatchReader>> reader = BatchReader::Create(o);
    return reader.ok() ? std::string("OK") : std::string(reader.status().message());
  };
  BatchReaderOptions o = Options();
  EXPECT_EQ(error(o), "OK");
  o.feature_size = 13;
  EXPECT_THAT(error(o), HasSubstr("feature_size (13) is for the single-feature mode"));
  o = Options();
  o.image = {28, 28, 1};
  EXPECT_THAT(error(o), HasSubstr("an image shape and augmentation are for the single-feature"));
  o = Options();
  o.augment.flip_left_right = true;
  EXPECT_THAT(error(o), HasSubstr("single-feature mode only"));
  o = Options();
  o.inputs[3].max_ids = 0;
  EXPECT_THAT(error(o), HasSubstr("BatchReader inputs: sparse input \"C4\" needs max_ids > 0"));
  o = Options();
  o.label_key = "";
  EXPECT_THAT(error(o), HasSubstr("label feature key is empty"));
}

}  // namespace
}  // namespace data
}  // namespace downpour
