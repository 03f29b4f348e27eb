#include "data/ctr_generator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/splitmix64.h"
#include "common/status.h"
#include "data/idx.h"
#include "data/record_io.h"

namespace downpour {
namespace data {
namespace {

// Ranks take the low 40 bits of the id's pre-image, the feature the bits
// above, so (feature, rank) -> id is one-to-one.
constexpr int kRankBits = 40;
constexpr int64_t kMaxVocabulary = (int64_t{1} << kRankBits) - 1;
constexpr int kMaxFeatures = 4096;
constexpr int kMaxIds = 1000;
constexpr int kInteractionDims = 4;
constexpr int kCalibrationExamples = 16384;
// The split tag of the examples the bias is calibrated on; never written.
constexpr uint64_t kCalibrationSplit = 2;
constexpr int64_t kMaxIndex = int64_t{1} << 56;

// Successive draws of one example: SplitMix64 over a counter.
class Stream {
 public:
  explicit Stream(uint64_t state) : state_(state) {}
  uint64_t Next() { return SplitMix64(state_++); }
  // In [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// A standard normal value from 64 random bits (Box-Muller over two halves).
double Gaussian(uint64_t bits) {
  const double u1 = (static_cast<double>(bits >> 32) + 0.5) * 0x1.0p-32;  // (0, 1)
  const double u2 = static_cast<double>(bits & 0xffffffffu) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

bool IsFileName(absl::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

absl::Status CheckOptions(const CtrOptions& o) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (o.sparse_features < 1 || o.sparse_features > kMaxFeatures) {
    return bad("sparse_features=", o.sparse_features, " must be between 1 and ", kMaxFeatures);
  }
  if (o.dense_features < 0 || o.dense_features > kMaxFeatures) {
    return bad("dense_features=", o.dense_features, " must be between 0 and ", kMaxFeatures);
  }
  if (!o.vocabularies.empty() && static_cast<int>(o.vocabularies.size()) != o.sparse_features) {
    return bad("vocabulary lists ", o.vocabularies.size(), " values for ", o.sparse_features,
               " sparse features; give one per feature or MIN:MAX");
  }
  for (int64_t v : o.vocabularies) {
    if (v < 1 || v > kMaxVocabulary) {
      return bad("vocabulary ", v, " must be between 1 and ", kMaxVocabulary);
    }
  }
  if (o.vocabularies.empty() && (o.min_vocabulary < 1 || o.max_vocabulary > kMaxVocabulary ||
                                 o.min_vocabulary > o.max_vocabulary)) {
    return bad("vocabulary ", o.min_vocabulary, ":", o.max_vocabulary,
               " must satisfy 1 <= MIN <= MAX <= ", kMaxVocabulary);
  }
  if (!(o.zipf > 0 && o.zipf <= 10)) return bad("zipf=", o.zipf, " must be in (0, 10]");
  if (o.max_ids < 1 || o.max_ids > kMaxIds) {
    return bad("max_ids=", o.max_ids, " must be between 1 and ", kMaxIds);
  }
  if (!(o.click_rate >= 0.001 && o.click_rate <= 0.999)) {
    return bad("click_rate=", o.click_rate, " must be between 0.001 and 0.999");
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"weight_scale", o.weight_scale},
                                    {"dense_weight_scale", o.dense_weight_scale},
                                    {"interaction", o.interaction}}) {
    if (!(value >= 0 && value <= 100)) return bad(name, "=", value, " must be in [0, 100]");
  }
  if (o.interaction_pairs < 0) {
    return bad("interaction_pairs=", o.interaction_pairs, " must not be negative");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseVocabularies(absl::string_view text, CtrOptions* options) {
  const auto parse = [&](absl::string_view part, int64_t* value) {
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocabulary '", text, "' is not MIN:MAX or a comma-separated list of integers"));
    }
    return absl::OkStatus();
  };
  options->vocabularies.clear();
  if (absl::StrContains(text, ':')) {
    std::vector<absl::string_view> bounds = absl::StrSplit(text, ':');
    if (bounds.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("vocabulary '", text, "' is not MIN:MAX"));
    }
    RETURN_IF_ERROR(parse(bounds[0], &options->min_vocabulary));
    RETURN_IF_ERROR(parse(bounds[1], &options->max_vocabulary));
    return absl::OkStatus();
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t value = 0;
    RETURN_IF_ERROR(parse(part, &value));
    options->vocabularies.push_back(value);
  }
  return absl::OkStatus();
}

const char* CombinerName(Combiner combiner) { return combiner == Combiner::kMean ? "mean" : "sum"; }

// ------------------------------------------------------------- ZipfSampler

namespace {

// log1p(x) / x and expm1(x) / x, exact near 0.
double Helper1(double x) {
  return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
double Helper2(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x));
}

}  // namespace

ZipfSampler::ZipfSampler(int64_t n, double s) : n_(n), s_(s) {
  h_integral_x1_ = HIntegral(1.5) - 1;
  h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
  threshold_ = 2 - HIntegralInverse(HIntegral(2.5) - H(2));
}

double ZipfSampler::H(double x) const { return std::exp(-s_ * std::log(x)); }

// The integral of H from 1 to x (up to a constant), finite at s = 1.
double ZipfSampler::HIntegral(double x) const {
  const double log_x = std::log(x);
  return Helper2((1 - s_) * log_x) * log_x;
}

double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1 - s_);
  if (t < -1) t = -1;  // Rounding can push it just below its bound.
  return std::exp(Helper1(t) * x);
}

// ------------------------------------------------------------ CtrGenerator

CtrGenerator::CtrGenerator(const CtrOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<CtrGenerator>> CtrGenerator::Create(const CtrOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<CtrGenerator> g(new CtrGenerator(options));
  const int num_sparse = options.sparse_features;
  const uint64_t seed_key = SplitMix64(options.seed ^ 0x43545247454e3031ULL);  // "CTRGEN01"
  g->id_offset_ = SplitMix64(seed_key + 1);
  g->weight_key_ = SplitMix64(seed_key + 2);
  g->interaction_key_ = SplitMix64(seed_key + 3);
  g->stream_key_ = SplitMix64(seed_key + 4);
  g->interaction_pairs_ = std::min(options.interaction_pairs, num_sparse / 2);

  std::vector<int64_t> vocabularies = options.vocabularies;
  if (vocabularies.empty()) {
    const double log_min = std::log(static_cast<double>(options.min_vocabulary));
    const double log_max = std::log(static_cast<double>(options.max_vocabulary));
    for (int f = 0; f < num_sparse; ++f) {
      const double t = num_sparse > 1 ? static_cast<double>(f) / (num_sparse - 1) : 0;
      vocabularies.push_back(
          std::clamp<int64_t>(std::llround(std::exp(log_min + t * (log_max - log_min))),
                              options.min_vocabulary, options.max_vocabulary));
    }
  }
  const auto [smallest, largest] = std::minmax_element(vocabularies.begin(), vocabularies.end());
  const double log_span = std::log(static_cast<double>(*largest) / static_cast<double>(*smallest));
  for (int f = 0; f < num_sparse; ++f) {
    CtrFeature feature;
    feature.name = absl::StrCat("C", f + 1);
    feature.vocabulary = vocabularies[f];
    feature.max_ids = f % 2 == 0 ? 1 : options.max_ids;
    feature.combiner = f % 4 == 1 ? Combiner::kMean : Combiner::kSum;
    const double t =
        log_span > 0
            ? std::log(static_cast<double>(feature.vocabulary) / static_cast<double>(*smallest)) /
                  log_span
            : 0;
    feature.weight_scale = options.weight_scale * (1 - 0.75 * t);
    g->features_.push_back(std::move(feature));
    g->samplers_.emplace_back(vocabularies[f], options.zipf);
  }
  const int num_dense = options.dense_features;
  for (int j = 0; j < num_dense; ++j) {
    const double t = num_dense > 1 ? static_cast<double>(j) / (num_dense - 1) : 0;
    g->dense_means_.push_back(std::pow(1000.0, t));
    g->dense_weights_.push_back(options.dense_weight_scale *
                                Gaussian(SplitMix64(g->weight_key_ ^ (0xdeadULL << 32 | j))));
    g->dense_names_.push_back(absl::StrCat("I", j + 1));
  }

  // The bias that makes the mean click probability click_rate, on examples
  // of a stream that is never written.
  std::vector<double> logits;
  CtrExample example;
  for (int i = 0; i < kCalibrationExamples; ++i) {
    g->Draw(SplitMix64(g->stream_key_ ^ (kCalibrationSplit << 56 | static_cast<uint64_t>(i))),
            &example);
    logits.push_back(g->RawLogit(example));
  }
  double low = -40, high = 40;
  for (int iteration = 0; iteration < 100; ++iteration) {
    const double mid = (low + high) / 2;
    double sum = 0;
    for (double logit : logits) sum += Sigmoid(logit + mid);
    (sum / logits.size() < options.click_rate ? low : high) = mid;
  }
  g->bias_ = (low + high) / 2;
  return g;
}

void CtrGenerator::Draw(uint64_t state, CtrExample* out) const {
  Stream stream(state);
  const auto uniform = [&stream] { return stream.Uniform(); };
  const int num_sparse = static_cast<int>(features_.size());
  out->ids.clear();
  out->id_offsets.resize(num_sparse + 1);
  for (int f = 0; f < num_sparse; ++f) {
    out->id_offsets[f] = static_cast<int32_t>(out->ids.size());
    const int max_ids = features_[f].max_ids;
    const int count =
        max_ids == 1 ? 1 : 1 + std::min(max_ids - 1, static_cast<int>(stream.Uniform() * max_ids));
    for (int k = 0; k < count; ++k) {
      const uint64_t rank = static_cast<uint64_t>(samplers_[f].Sample(uniform));
      out->ids.push_back(static_cast<int64_t>(
          SplitMix64(id_offset_ + (static_cast<uint64_t>(f) << kRankBits) + rank)));
    }
  }
  out->id_offsets[num_sparse] = static_cast<int32_t>(out->ids.size());
  out->dense.resize(dense_means_.size());
  for (size_t j = 0; j < dense_means_.size(); ++j) {
    const double exponential = -std::log1p(-stream.Uniform());
    out->dense[j] = static_cast<float>(std::log1p(std::floor(dense_means_[j] * exponential)));
  }
  out->click_probability = Sigmoid(bias_ + RawLogit(*out));
  out->label = stream.Uniform() < out->click_probability ? 1 : 0;
}

void CtrGenerator::Generate(CtrSplit split, int64_t index, CtrExample* out) const {
  Draw(
      SplitMix64(stream_key_ ^ (static_cast<uint64_t>(split) << 56 | static_cast<uint64_t>(index))),
      out);
}

double CtrGenerator::RawLogit(const CtrExample& example) const {
  double logit = 0;
  const int num_sparse = static_cast<int>(features_.size());
  for (int f = 0; f < num_sparse; ++f) {
    const int begin = example.id_offsets[f], end = example.id_offsets[f + 1];
    if (begin == end) continue;
    double sum = 0;
    for (int k = begin; k < end; ++k) {
      sum += Gaussian(SplitMix64(static_cast<uint64_t>(example.ids[k]) ^ weight_key_));
    }
    if (features_[f].combiner == Combiner::kMean) sum /= (end - begin);
    logit += features_[f].weight_scale * sum;
  }
  for (size_t j = 0; j < dense_weights_.size(); ++j) logit += dense_weights_[j] * example.dense[j];
  for (int p = 0; p < interaction_pairs_; ++p) {
    double vectors[2][kInteractionDims] = {};
    for (int side = 0; side < 2; ++side) {
      const int f = 2 * p + side;
      const int begin = example.id_offsets[f], end = example.id_offsets[f + 1];
      for (int k = begin; k < end; ++k) {
        const uint64_t key = static_cast<uint64_t>(example.ids[k]) ^ interaction_key_;
        for (int d = 0; d < kInteractionDims; ++d) {
          vectors[side][d] += Gaussian(SplitMix64(key + d));
        }
      }
      if (features_[f].combiner == Combiner::kMean && end > begin) {
        for (double& v : vectors[side]) v /= (end - begin);
      }
    }
    double dot = 0;
    for (int d = 0; d < kInteractionDims; ++d) dot += vectors[0][d] * vectors[1][d];
    logit += options_.interaction * dot / std::sqrt(static_cast<double>(kInteractionDims));
  }
  return logit;
}

double CtrGenerator::Logit(const CtrExample& example) const { return bias_ + RawLogit(example); }

namespace {

// tensorflow.Example's wire format, written by hand: through protobuf's Map
// the encoding took most of the generator's time (hashing, allocating and
// sorting 40 keys per example). The tests parse the bytes back with
// protobuf.
constexpr char kFirstLengthDelimited = 0x0a;   // Field 1, length-delimited.
constexpr char kSecondLengthDelimited = 0x12;  // Field 2, length-delimited.
constexpr char kThirdLengthDelimited = 0x1a;   // Field 3, length-delimited.

size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// One map entry of Features: key, then a Feature whose `kind` field
// (`list_field`: 2 float_list, 3 int64_list) holds one packed list of
// `packed_size` bytes, which `append_values` writes.
template <typename AppendValues>
void AppendFeature(absl::string_view key, char list_field, size_t packed_size,
                   AppendValues&& append_values, std::string* out) {
  const size_t list_size = 1 + VarintSize(packed_size) + packed_size;  // Int64List / FloatList.
  const size_t feature_size = 1 + VarintSize(list_size) + list_size;
  const size_t entry_size =
      1 + VarintSize(key.size()) + key.size() + 1 + VarintSize(feature_size) + feature_size;
  out->push_back(kFirstLengthDelimited);  // Features.feature.
  AppendVarint(entry_size, out);
  out->push_back(kFirstLengthDelimited);  // The entry's key.
  AppendVarint(key.size(), out);
  out->append(key.data(), key.size());
  out->push_back(kSecondLengthDelimited);  // The entry's value.
  AppendVarint(feature_size, out);
  out->push_back(list_field);
  AppendVarint(list_size, out);
  out->push_back(kFirstLengthDelimited);  // The list's packed `value`.
  AppendVarint(packed_size, out);
  append_values(out);
}

void AppendInt64Feature(absl::string_view key, const int64_t* values, size_t n, std::string* out) {
  size_t packed_size = 0;
  for (size_t i = 0; i < n; ++i) packed_size += VarintSize(static_cast<uint64_t>(values[i]));
  AppendFeature(
      key, kThirdLengthDelimited, packed_size,
      [&](std::string* o) {
        for (size_t i = 0; i < n; ++i) AppendVarint(static_cast<uint64_t>(values[i]), o);
      },
      out);
}

void AppendFloatFeature(absl::string_view key, float value, std::string* out) {
  AppendFeature(
      key, kSecondLengthDelimited, 4,
      [&](std::string* o) {
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        for (int b = 0; b < 4; ++b)
          o->push_back(static_cast<char>(bits >> (8 * b)));  // Little endian.
      },
      out);
}

}  // namespace

std::string CtrGenerator::Encode(const CtrExample& example) const {
  std::string features;
  features.reserve(64 * (features_.size() + dense_names_.size()) + 16 * example.ids.size());
  for (size_t f = 0; f < features_.size(); ++f) {
    const int begin = example.id_offsets[f];
    AppendInt64Feature(features_[f].name, example.ids.data() + begin,
                       static_cast<size_t>(example.id_offsets[f + 1] - begin), &features);
  }
  for (size_t j = 0; j < dense_names_.size(); ++j) {
    AppendFloatFeature(dense_names_[j], example.dense[j], &features);
  }
  const int64_t label = example.label;
  AppendInt64Feature("label", &label, 1, &features);
  std::string out;
  out.reserve(features.size() + 1 + VarintSize(features.size()));
  out.push_back(kFirstLengthDelimited);  // Example.features.
  AppendVarint(features.size(), &out);
  out += features;
  return out;
}

// --------------------------------------------------------- WriteCtrDataset

namespace {

struct SplitCounter {
  int64_t examples = 0;
  int64_t clicks = 0;
  double probability_sum = 0;
  double log_loss_sum = 0;
};

// Shard s holds examples s, s + num_shards, ...: the shards are written on
// threads of their own (at most the machine's cores at once), each with its
// own counters, merged in shard order, so the files and figures are the same
// for any number of threads.
absl::Status WriteSplit(const CtrGenerator& generator, CtrSplit split, int64_t count,
                        const CtrDatasetOptions& options, const std::string& prefix,
                        CtrSplitSummary* summary, BinaryMetrics* metrics) {
  const int shards = options.num_shards;
  std::vector<SplitCounter> counters(shards);
  std::vector<BinaryMetrics> shard_metrics(metrics != nullptr ? shards : 0);
  std::vector<absl::Status> results(shards);
  auto write_shard = [&](int s) -> absl::Status {
    ASSIGN_OR_RETURN(auto writer, RecordWriter::Open(absl::StrCat(
                                      options.out_dir, "/", ShardFileName(prefix, s, shards))));
    SplitCounter& counter = counters[s];
    CtrExample example;
    for (int64_t i = s; i < count; i += shards) {
      generator.Generate(split, i, &example);
      // A writer dropped on an early return removes its temporary file.
      RETURN_IF_ERROR(writer->Write(generator.Encode(example)));
      ++counter.examples;
      counter.clicks += example.label;
      counter.probability_sum += example.click_probability;
      counter.log_loss_sum += BinaryCrossEntropy(example.click_probability, example.label);
      if (metrics != nullptr) shard_metrics[s].Add(example.click_probability, example.label);
    }
    return writer->Close();
  };
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, shards);
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int s = next++; s < shards; s = next++) results[s] = write_shard(s);
    });
  }
  for (std::thread& t : pool) t.join();
  for (const absl::Status& result : results) RETURN_IF_ERROR(result);
  SplitCounter total;
  for (int s = 0; s < shards; ++s) {
    total.examples += counters[s].examples;
    total.clicks += counters[s].clicks;
    total.probability_sum += counters[s].probability_sum;
    total.log_loss_sum += counters[s].log_loss_sum;
    if (metrics != nullptr) metrics->Merge(shard_metrics[s]);
  }
  summary->examples = total.examples;
  summary->clicks = total.clicks;
  // NaN (null in the JSON) for an empty split.
  const double n = static_cast<double>(total.examples);
  summary->mean_probability = n > 0 ? total.probability_sum / n : std::nan("");
  summary->bayes_log_loss = n > 0 ? total.log_loss_sum / n : std::nan("");
  summary->bayes_auc =
      metrics != nullptr ? metrics->Auc() : std::numeric_limits<double>::quiet_NaN();
  return absl::OkStatus();
}

// JSON numbers, 6 decimals or `digits` significant ones; null for NaN,
// which JSON lacks.
std::string Number(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.6f", value) : "null";
}
std::string Significant(double value, int digits) {
  return std::isfinite(value) ? absl::StrFormat("%.*g", digits, value) : "null";
}

std::string SplitJson(const CtrSplitSummary& split, bool with_auc) {
  const double n = static_cast<double>(split.examples);
  return absl::StrCat("{\"examples\": ", split.examples, ", \"clicks\": ", split.clicks,
                      ", \"click_rate\": ", Number(n > 0 ? split.clicks / n : std::nan("")),
                      ", \"mean_click_probability\": ", Number(split.mean_probability),
                      with_auc ? absl::StrCat(", \"bayes_auc\": ", Number(split.bayes_auc)) : "",
                      ", \"bayes_log_loss\": ", Number(split.bayes_log_loss), "}");
}

}  // namespace

absl::StatusOr<CtrDatasetSummary> WriteCtrDataset(const CtrDatasetOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("out_dir is empty");
  if (!IsFileName(options.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name '", options.name, "' must be letters, digits, '.', '_' or '-' (a file prefix)"));
  }
  if (options.num_shards < 1 || options.num_shards > 99999) {
    return absl::InvalidArgumentError(
        absl::StrCat("shards=", options.num_shards, " must be between 1 and 99999"));
  }
  if (options.train_examples < 1 || options.train_examples >= kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat("examples=", options.train_examples,
                                                   " must be between 1 and ", kMaxIndex - 1));
  }
  if (options.test_examples < 0 || options.test_examples >= kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat("test_examples=", options.test_examples,
                                                   " must be between 0 and ", kMaxIndex - 1));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CtrGenerator> generator,
                   CtrGenerator::Create(options.generator));
  RETURN_IF_ERROR(MakeDirs(options.out_dir));

  CtrDatasetSummary summary;
  const std::string train = absl::StrCat(options.name, "-train");
  const std::string test = absl::StrCat(options.name, "-test");
  const std::string shards = absl::StrFormat("-*-of-%05d.tfrecord", options.num_shards);
  summary.train_pattern = train + shards;
  summary.test_pattern = test + shards;
  RETURN_IF_ERROR(WriteSplit(*generator, CtrSplit::kTrain, options.train_examples, options, train,
                             &summary.train, nullptr));
  BinaryMetrics metrics;
  RETURN_IF_ERROR(WriteSplit(*generator, CtrSplit::kTest, options.test_examples, options, test,
                             &summary.test, &metrics));

  summary.summary_path = absl::StrCat(options.out_dir, "/", options.name, ".json");
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file,
                   AtomicFile::Create(summary.summary_path, "summary file"));
  RETURN_IF_ERROR(file->Append(CtrSummaryJson(options, *generator, summary)));
  RETURN_IF_ERROR(file->Commit());
  return summary;
}

std::string CtrSummaryJson(const CtrDatasetOptions& options, const CtrGenerator& generator,
                           const CtrDatasetSummary& summary) {
  const CtrOptions& o = generator.options();
  std::vector<std::string> sparse;
  for (const CtrFeature& f : generator.features()) {
    sparse.push_back(absl::StrFormat(
        "    {\"name\": \"%s\", \"vocabulary\": %d, \"max_ids\": %d, \"combiner\": \"%s\", "
        "\"weight_scale\": %s}",
        f.name, f.vocabulary, f.max_ids, CombinerName(f.combiner), Significant(f.weight_scale, 6)));
  }
  std::vector<std::string> dense;
  for (size_t j = 0; j < generator.dense_means().size(); ++j) {
    dense.push_back(absl::StrFormat("    {\"name\": \"I%d\", \"mean_count\": %s, \"weight\": %s}",
                                    j + 1, Significant(generator.dense_means()[j], 6),
                                    Significant(generator.dense_weights()[j], 6)));
  }
  return absl::StrCat(
      "{\n  \"kind\": \"ctr\",\n  \"name\": \"", options.name,
      "\",\n  \"shards\": ", options.num_shards, ",\n  \"train_files\": \"", summary.train_pattern,
      "\",\n  \"test_files\": \"", summary.test_pattern,
      "\",\n  \"label_key\": \"label\",\n  \"generator\": {\"seed\": ", o.seed,
      ", \"sparse_features\": ", o.sparse_features, ", \"dense_features\": ", o.dense_features,
      ", \"zipf\": ", Significant(o.zipf, 6), ", \"max_ids\": ", o.max_ids,
      ", \"target_click_rate\": ", Significant(o.click_rate, 6),
      ", \"weight_scale\": ", Significant(o.weight_scale, 6),
      ", \"dense_weight_scale\": ", Significant(o.dense_weight_scale, 6),
      ", \"interaction\": ", Significant(o.interaction, 6),
      ", \"interaction_pairs\": ", std::min(o.interaction_pairs, o.sparse_features / 2),
      ", \"bias\": ", Significant(generator.bias(), 9), "},\n  \"sparse\": [\n",
      absl::StrJoin(sparse, ",\n"), "\n  ],\n  \"dense\": [\n", absl::StrJoin(dense, ",\n"),
      dense.empty() ? "" : "\n", "  ],\n  \"train\": ", SplitJson(summary.train, false),
      ",\n  \"test\": ", SplitJson(summary.test, true), "\n}\n");
}

}  // namespace data
}  // namespace downpour
