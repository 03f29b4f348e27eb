// The sparse benchmark's small configuration as a smoke test: real
// coordinator and downpour-ps processes, two workers, two shards, two
// tables, a few ASYNC and SYNC steps and the dense baseline; the run
// completes, its figures are consistent and its JSON line parses. The Zipf
// sampler's frequencies match the distribution. No timing assertions.
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "bench/sparse_bench.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace downpour {
namespace bench {
namespace {

TEST(ZipfSamplerTest, FrequenciesFollowThePowerLaw) {
  for (double s : {0.8, 1.0, 1.2}) {
    constexpr int64_t kN = 1000;
    constexpr int kDraws = 400000;
    ZipfSampler zipf(kN, s);
    std::mt19937_64 rng(5);
    std::map<int64_t, int> counts;
    for (int i = 0; i < kDraws; ++i) {
      const int64_t k = zipf(rng);
      ASSERT_GE(k, 1);
      ASSERT_LE(k, kN);
      ++counts[k];
    }
    double norm = 0;
    for (int64_t k = 1; k <= kN; ++k) norm += std::pow(static_cast<double>(k), -s);
    for (int64_t k : {1, 2, 10, 100}) {
      const double expected = kDraws * std::pow(static_cast<double>(k), -s) / norm;
      EXPECT_NEAR(counts[k], expected, 5 * std::sqrt(expected) + 1) << "s " << s << " k " << k;
    }
  }
}

TEST(ZipfSamplerTest, DrawsFromAHugeVocabularyStayInRange) {
  ZipfSampler zipf(1'000'000'000, 0.8);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const int64_t k = zipf(rng);
    ASSERT_GE(k, 1);
    ASSERT_LE(k, 1'000'000'000);
  }
  SparseConfig config;
  config.vocab = 1'000'000'000;
  config.batch = 64;
  config.features = 4;
  config.skew = 1.2;
  const DrawStats stats = CountDistinctRows(config, 3);
  EXPECT_EQ(stats.ids_per_step, 256);
  EXPECT_GT(stats.rows_per_step, 0);
  EXPECT_LT(stats.rows_per_step, 256);  // The head repeats at s = 1.2.
}

double Field(const google::protobuf::Struct& json, const std::string& key) {
  auto it = json.fields().find(key);
  EXPECT_NE(it, json.fields().end()) << key;
  return it == json.fields().end() ? -1 : it->second.number_value();
}

TEST(SparseSmokeTest, SmallConfigurationsRunAndReportJson) {
  SparseBench::Options options;
  options.max_workers = 2;
  options.max_shards = 2;
  auto bench = SparseBench::Start(options);
  ASSERT_TRUE(bench.ok()) << bench.status();

  SparseConfig config;
  config.workers = 2;
  config.shards = 2;
  config.batch = 32;
  config.features = 6;
  config.tables = 2;
  config.dim = 8;
  config.vocab = 5000;
  config.steps = 4;
  config.warmup = 1;
  auto dense = (*bench)->RunDense(config, 5000, 2);
  ASSERT_TRUE(dense.ok()) << dense.status() << (*bench)->Logs();
  EXPECT_GT(dense->step_p50_ms, 0);
  EXPECT_GE(dense->bytes_per_step, 2 * 5000 * 8 * 4);

  for (bool sync : {false, true}) {
    config.sync = sync;
    auto result = (*bench)->Run(config);
    ASSERT_TRUE(result.ok()) << result.status() << (*bench)->Logs();
    EXPECT_EQ(result->ids_per_step, 32 * 6);
    EXPECT_GT(result->rows_per_step, 0);
    EXPECT_LE(result->rows_per_step, result->ids_per_step);
    EXPECT_GT(result->step_p50_ms, 0);
    EXPECT_GT(result->pulled_rows_per_s_worker, 0);
    EXPECT_GT(result->pulled_rows_per_s_shard, 0);
    EXPECT_GT(result->pushed_rows_per_s_shard, 0);
    // Every row a worker pulled or pushed is counted by some shard.
    EXPECT_NEAR(result->pulled_rows_per_s_shard * config.shards,
                result->pulled_rows_per_s_worker * config.workers,
                1e-6 * result->pulled_rows_per_s_worker + 1);
    // At least the rows' bytes both ways and their ids (three times).
    EXPECT_GE(result->sparse_bytes_per_step,
              result->rows_per_step * (2 * 4 * config.dim + 3 * 8) - 1);
    EXPECT_EQ(result->dense_bytes_per_step, 2.0 * 2 * 5000 * 8 * 4);
    EXPECT_GT(result->rows_held, 0);
    EXPECT_GT(result->bytes_per_row, 0);

    google::protobuf::Struct json;
    const std::string line = ToJson(*result);
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &json).ok()) << line;
    EXPECT_EQ(json.fields().at("mode").string_value(), sync ? "SYNC" : "ASYNC");
    EXPECT_EQ(Field(json, "ids_per_step"), 192);
    EXPECT_GT(Field(json, "rows_per_step"), 0);
    EXPECT_GT(Field(json, "sparse_bytes_per_step"), 0);
  }
}

}  // namespace
}  // namespace bench
}  // namespace downpour
