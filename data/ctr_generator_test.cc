#include "data/ctr_generator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "data/example.h"
#include "data/idx.h"
#include "data/record_io.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"

namespace downpour {
namespace data {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<CtrGenerator> MakeGenerator(const CtrOptions& options = CtrOptions()) {
  absl::StatusOr<std::unique_ptr<CtrGenerator>> generator = CtrGenerator::Create(options);
  EXPECT_TRUE(generator.ok()) << generator.status();
  return generator.ok() ? *std::move(generator) : nullptr;
}

// sum_{k=1..n} k^-s.
double Harmonic(int64_t n, double s) {
  double sum = 0;
  for (int64_t k = n; k >= 1; --k) sum += std::pow(static_cast<double>(k), -s);
  return sum;
}

TEST(CtrGeneratorTest, SameSeedSameExamplesWhateverTheOrder) {
  CtrOptions options;
  options.seed = 7;
  auto a = MakeGenerator(options);
  auto b = MakeGenerator(options);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->bias(), b->bias());
  CtrExample x, y;
  for (CtrSplit split : {CtrSplit::kTrain, CtrSplit::kTest}) {
    for (int64_t i = 99; i >= 0; --i) {  // b draws in the opposite order.
      a->Generate(split, 99 - i, &x);
      b->Generate(split, 99 - i, &y);
      EXPECT_EQ(a->Encode(x), b->Encode(y));
    }
  }
  a->Generate(CtrSplit::kTrain, 5, &x);
  a->Generate(CtrSplit::kTest, 5, &y);
  EXPECT_NE(a->Encode(x), a->Encode(y)) << "train and test draw from different streams";

  options.seed = 8;
  auto c = MakeGenerator(options);
  c->Generate(CtrSplit::kTrain, 5, &y);
  EXPECT_NE(x.ids, y.ids);
}

TEST(CtrGeneratorTest, ZipfSamplerFollowsTheLaw) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const auto next = [&] { return uniform(rng); };
  for (const auto& [n, s] : std::vector<std::pair<int64_t, double>>{
           {1000, 1.05}, {1000, 1.0}, {1000, 0.5}, {10000000, 1.05}, {1, 1.05}}) {
    ZipfSampler sampler(n, s);
    const int draws = 200000;
    std::map<int64_t, int> counts;
    for (int i = 0; i < draws; ++i) {
      const int64_t k = sampler.Sample(next);
      ASSERT_GE(k, 1);
      ASSERT_LE(k, n);
      if (k <= 10) ++counts[k];
    }
    const double h = Harmonic(n, s);
    for (int64_t k : {1, 2, 10}) {
      if (k > n) continue;
      const double expected = std::pow(static_cast<double>(k), -s) / h;
      const double sd = std::sqrt(expected * (1 - expected) / draws);
      EXPECT_NEAR(counts[k] / static_cast<double>(draws), expected, 5 * sd + 1e-9)
          << "n=" << n << " s=" << s << " rank " << k;
    }
  }
}

TEST(CtrGeneratorTest, TopIdsOfAFeatureHaveZipfFrequencies) {
  auto generator = MakeGenerator();
  ASSERT_NE(generator, nullptr);
  const CtrFeature& c1 = generator->features()[0];  // One id, the smallest vocabulary.
  ASSERT_EQ(c1.max_ids, 1);
  ASSERT_EQ(c1.vocabulary, 1000);
  std::map<int64_t, int> counts;
  const int n = 20000;
  CtrExample example;
  for (int i = 0; i < n; ++i) {
    generator->Generate(CtrSplit::kTrain, i, &example);
    ++counts[example.ids[example.id_offsets[0]]];
  }
  std::vector<int> sorted;
  sorted.reserve(counts.size());
  for (const auto& [id, count] : counts) sorted.push_back(count);
  std::sort(sorted.rbegin(), sorted.rend());
  const double h = Harmonic(1000, 1.05);
  for (int k : {1, 2, 3}) {
    const double expected = std::pow(k, -1.05) / h;
    EXPECT_NEAR(sorted[k - 1] / static_cast<double>(n), expected, 0.15 * expected) << "rank " << k;
  }
  EXPECT_LE(counts.size(), 1000u);
}

TEST(CtrGeneratorTest, IdsOfDifferentFeaturesNeverCollideAndSpanAllBits) {
  CtrOptions options;
  options.vocabularies.assign(26, 50);  // Small: every id comes up many times.
  auto generator = MakeGenerator(options);
  ASSERT_NE(generator, nullptr);
  std::vector<std::set<int64_t>> ids(26);
  CtrExample example;
  bool negative = false, high_positive = false;
  for (int i = 0; i < 3000; ++i) {
    generator->Generate(CtrSplit::kTrain, i, &example);
    ASSERT_EQ(example.id_offsets.size(), 27u);
    for (int f = 0; f < 26; ++f) {
      const int count = example.id_offsets[f + 1] - example.id_offsets[f];
      ASSERT_GE(count, 1);
      ASSERT_LE(count, f % 2 == 0 ? 1 : 3) << "C" << f + 1;
      for (int k = example.id_offsets[f]; k < example.id_offsets[f + 1]; ++k) {
        ids[f].insert(example.ids[k]);
        negative |= example.ids[k] < 0;
        high_positive |= example.ids[k] > (int64_t{1} << 62);
      }
    }
  }
  std::set<int64_t> all;
  size_t total = 0;
  for (int f = 0; f < 26; ++f) {
    EXPECT_LE(ids[f].size(), 50u);
    EXPECT_GE(ids[f].size(), 40u) << "C" << f + 1;
    total += ids[f].size();
    all.insert(ids[f].begin(), ids[f].end());
  }
  EXPECT_EQ(all.size(), total) << "an id appears under two features";
  EXPECT_TRUE(negative);
  EXPECT_TRUE(high_positive);
}

TEST(CtrGeneratorTest, ClickRateFollowsTheTarget) {
  for (double target : {0.03, 0.1, 0.25}) {
    CtrOptions options;
    options.click_rate = target;
    auto generator = MakeGenerator(options);
    ASSERT_NE(generator, nullptr);
    CtrExample example;
    const int n = 10000;
    int clicks = 0;
    double probability = 0;
    for (int i = 0; i < n; ++i) {
      generator->Generate(CtrSplit::kTest, i, &example);
      clicks += example.label;
      probability += example.click_probability;
    }
    EXPECT_NEAR(probability / n, target, 0.1 * target);
    EXPECT_NEAR(clicks / static_cast<double>(n), target, 0.15 * target);
  }
}

TEST(CtrGeneratorTest, ProbabilityComesFromTheIdsAlone) {
  auto generator = MakeGenerator();
  ASSERT_NE(generator, nullptr);
  CtrExample example;
  for (int i = 0; i < 100; ++i) {
    generator->Generate(CtrSplit::kTrain, i, &example);
    EXPECT_DOUBLE_EQ(1 / (1 + std::exp(-generator->Logit(example))), example.click_probability);
  }
}

TEST(CtrGeneratorTest, BayesAucMatchesAPairwiseCount) {
  auto generator = MakeGenerator();
  ASSERT_NE(generator, nullptr);
  BinaryMetrics metrics;
  std::vector<std::pair<double, int>> scored;
  double log_loss = 0;
  CtrExample example;
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    generator->Generate(CtrSplit::kTest, i, &example);
    metrics.Add(example.click_probability, example.label);
    scored.emplace_back(example.click_probability, example.label);
    const double p = example.click_probability;
    log_loss -= example.label ? std::log(p) : std::log(1 - p);
  }
  double correct = 0, pairs = 0;
  for (const auto& [p, y] : scored) {
    if (y != 1) continue;
    for (const auto& [q, z] : scored) {
      if (z != 0) continue;
      pairs += 1;
      correct += p > q ? 1 : (p == q ? 0.5 : 0);
    }
  }
  EXPECT_EQ(metrics.examples(), n);
  EXPECT_NEAR(metrics.LogLoss(), log_loss / n, 1e-12);
  const double auc = metrics.Auc();
  EXPECT_NEAR(auc, correct / pairs, 1e-12);
  EXPECT_GT(auc, 0.6);
  EXPECT_LT(auc, 0.95);
}

TEST(CtrGeneratorTest, AucCountsTiesAsOneHalf) {
  BinaryMetrics metrics;
  for (const auto& [p, y] : std::vector<std::pair<double, int>>{
           {0.1, 0}, {0.5, 1}, {0.5, 0}, {0.5, 0}, {0.9, 1}, {0.2, 1}, {0.9, 0}}) {
    metrics.Add(p, y);
  }
  // Positives 0.2, 0.5, 0.9 against negatives 0.1, 0.5, 0.5, 0.9:
  // 0.2 beats 1; 0.5 beats 1 and ties 2; 0.9 beats 3 and ties 1.
  EXPECT_DOUBLE_EQ(metrics.Auc(), (1 + (1 + 2 * 0.5) + (3 + 0.5)) / 12.0);
  BinaryMetrics one_class;
  one_class.Add(0.3, 1);
  EXPECT_TRUE(std::isnan(one_class.Auc()));
}

TEST(CtrGeneratorTest, WrittenFilesReadBackAsTheExamplesDrawn) {
  CtrDatasetOptions options;
  options.out_dir = testing::NewTempDir() + "/ctr";
  options.name = "tiny";
  options.train_examples = 1000;
  options.test_examples = 300;
  options.num_shards = 3;
  absl::StatusOr<CtrDatasetSummary> summary = WriteCtrDataset(options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->train_pattern, "tiny-train-*-of-00003.tfrecord");
  EXPECT_EQ(summary->train.examples, 1000);
  EXPECT_EQ(summary->test.examples, 300);
  EXPECT_GT(summary->test.bayes_auc, 0.6);

  auto generator = MakeGenerator(options.generator);
  ASSERT_NE(generator, nullptr);
  CtrExample drawn;
  for (const auto& [split, prefix, count] : std::vector<std::tuple<CtrSplit, std::string, int64_t>>{
           {CtrSplit::kTrain, "tiny-train", 1000}, {CtrSplit::kTest, "tiny-test", 300}}) {
    int64_t read = 0;
    for (int s = 0; s < 3; ++s) {
      const std::string path = options.out_dir + "/" + ShardFileName(prefix, s, 3);
      auto reader = RecordReader::Open(path);
      ASSERT_TRUE(reader.ok()) << reader.status();
      std::string record;
      for (int64_t i = s;; i += 3) {
        absl::StatusOr<bool> more = (*reader)->Read(&record);
        ASSERT_TRUE(more.ok()) << more.status();
        if (!*more) break;
        ++read;
        generator->Generate(split, i, &drawn);
        float dense = 0;
        int32_t label = -1;
        ASSERT_TRUE(DecodeExample(record, "I13", "label", 1, &dense, &label).ok());
        EXPECT_EQ(label, drawn.label);
        EXPECT_EQ(dense, drawn.dense[12]);
        tensorflow::Example example;
        ASSERT_TRUE(example.ParseFromString(record));
        const auto& map = example.features().feature();
        EXPECT_EQ(map.size(), 26u + 13u + 1u);
        for (int f = 0; f < 26; ++f) {
          const auto& values = map.at(absl::StrCat("C", f + 1)).int64_list().value();
          ASSERT_EQ(values.size(), drawn.id_offsets[f + 1] - drawn.id_offsets[f]);
          EXPECT_GE(values.size(), 1);
          EXPECT_LE(values.size(), f % 2 == 0 ? 1 : 3);
          for (int k = 0; k < values.size(); ++k) {
            EXPECT_EQ(values[k], drawn.ids[drawn.id_offsets[f] + k]);
          }
        }
      }
    }
    EXPECT_EQ(read, count);
  }
  absl::StatusOr<std::string> json = ReadFileToString(summary->summary_path);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"kind\": \"ctr\""));
  EXPECT_THAT(*json, HasSubstr("\"bayes_auc\": "));
  EXPECT_THAT(*json, HasSubstr("{\"name\": \"C26\", \"vocabulary\": 10000000, \"max_ids\": 3, "
                               "\"combiner\": \"mean\""));
  EXPECT_THAT(*json, HasSubstr("\"test\": {\"examples\": 300, \"clicks\": " +
                               std::to_string(summary->test.clicks)));
}

TEST(CtrGeneratorTest, BadOptionsNameTheOption) {
  const auto create_error = [](const CtrOptions& options) {
    return std::string(CtrGenerator::Create(options).status().message());
  };
  CtrOptions o;
  o.zipf = 0;
  EXPECT_THAT(create_error(o), HasSubstr("zipf=0"));
  o = CtrOptions();
  o.click_rate = 1;
  EXPECT_THAT(create_error(o), HasSubstr("click_rate=1"));
  o = CtrOptions();
  o.vocabularies = {10, 20};
  EXPECT_THAT(create_error(o), HasSubstr("vocabulary lists 2 values for 26"));
  o = CtrOptions();
  o.min_vocabulary = 100;
  o.max_vocabulary = 10;
  EXPECT_THAT(create_error(o), HasSubstr("vocabulary 100:10"));

  CtrDatasetOptions d;
  d.out_dir = testing::NewTempDir();
  d.name = "../escape";
  d.train_examples = 10;
  EXPECT_THAT(WriteCtrDataset(d).status().message(), HasSubstr("name '../escape'"));
  d.name = "ok";
  d.num_shards = 0;
  EXPECT_THAT(WriteCtrDataset(d).status().message(), HasSubstr("shards=0"));
  d.num_shards = 1;
  d.train_examples = 0;
  EXPECT_THAT(WriteCtrDataset(d).status().message(), HasSubstr("examples=0"));
}

TEST(CtrGeneratorTest, ParsesVocabularies) {
  CtrOptions o;
  ASSERT_TRUE(ParseVocabularies("100:5000", &o).ok());
  EXPECT_EQ(o.min_vocabulary, 100);
  EXPECT_EQ(o.max_vocabulary, 5000);
  EXPECT_TRUE(o.vocabularies.empty());
  o.sparse_features = 3;
  ASSERT_TRUE(ParseVocabularies("10, 20,30", &o).ok());
  EXPECT_EQ(o.vocabularies, (std::vector<int64_t>{10, 20, 30}));
  EXPECT_FALSE(ParseVocabularies("10:x", &o).ok());
  EXPECT_FALSE(ParseVocabularies("1:2:3", &o).ok());
  EXPECT_FALSE(ParseVocabularies("", &o).ok());
}

}  // namespace
}  // namespace data
}  // namespace downpour
