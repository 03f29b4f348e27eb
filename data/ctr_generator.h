// A synthetic click log with a known generating model, shaped like Criteo's
// display-advertising data (26 hashed categorical features, 13 count
// features, a click label), for training and judging embedding models: since
// every example's true click probability is known, the best AUC and log loss
// any model can reach on a test set (the Bayes figures) are known too.
//
// The model, for example i of a split:
//   - sparse feature f (named "C<f+1>") holds 1 id when f is even, else 1 to
//     max_ids ids (uniformly); each id's rank r in 1..vocabulary[f] is drawn
//     from a Zipf law P(r) ~ r^-zipf, and the id written is
//     SplitMix64(seed offset + f * 2^40 + r) as an int64: a bijection, so ids
//     of different features (or ranks) never collide, spread over all 64 bits;
//   - dense feature j (named "I<j+1>") is log(1 + floor(m_j * E)), E ~ Exp(1),
//     a count of mean m_j from 1 to 1000 (log-spaced over the features);
//   - logit = bias + sum_f combine_f(w(id)) + sum_j v_j x_j
//             + interaction * sum_pairs <combine(u(id_a)), combine(u(id_b))> / 2
//     where w(id) = sigma_f * N(0, 1) and u(id) (4 values of N(0, 1)) are drawn
//     from SplitMix64 of the id itself (no table of vocabulary size is kept),
//     combine_f is the feature's combiner (mean for C2, C6, ...; sum for C4,
//     C8, ...; C1, C3, ... hold one id, so either), the pairs are (C1, C2),
//     (C3, C4), ... (a factorization-machine term, the model's nonlinearity),
//     sigma_f falls linearly in log(vocabulary) from weight_scale (smallest)
//     to weight_scale / 4 (largest: so much of a large vocabulary is seen too
//     rarely to be learnt that it would put the Bayes figures out of reach),
//     and the bias is calibrated once so that the mean click probability is
//     click_rate;
//   - label ~ Bernoulli(sigmoid(logit)).
// Every draw comes from SplitMix64 keyed by (seed, split, example index), so
// an example is a pure function of the options and its index: the same for a
// seed whatever the order or thread it is drawn on.
//
// Thread-safety: CtrGenerator is immutable after Create; Generate, Logit and
// Encode may run concurrently (each caller owns its CtrExample).
// WriteCtrDataset's objects are used by one thread.
#ifndef DOWNPOUR_DATA_CTR_GENERATOR_H_
#define DOWNPOUR_DATA_CTR_GENERATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/binary_metrics.h"  // The Bayes AUC and log loss.

namespace downpour {
namespace data {

struct CtrOptions {
  uint64_t seed = 1;
  int sparse_features = 26;
  int dense_features = 13;
  // Ids per sparse feature: one vocabulary for each, or empty to spread them
  // geometrically from min_vocabulary (C1) to max_vocabulary (the last).
  std::vector<int64_t> vocabularies;
  int64_t min_vocabulary = 1000;
  int64_t max_vocabulary = 10000000;
  double zipf = 1.05;       // Skew s of P(rank r) ~ r^-s; > 0.
  int max_ids = 3;          // Ids of a multi-valued feature: 1..max_ids.
  double click_rate = 0.1;  // The mean click probability the bias aims at.
  // Defaults give a Bayes AUC near 0.80 (Criteo's best published models
  // reach about 0.80) at a click rate of 0.1.
  double weight_scale = 0.3;
  double dense_weight_scale = 0.1;
  double interaction = 0.3;
  int interaction_pairs = 3;
};

// Parses --vocabulary: "MIN:MAX" (spread over the features) or one value per
// sparse feature, comma separated, into `options` (Create checks the values
// and their count).
absl::Status ParseVocabularies(absl::string_view text, CtrOptions* options);

enum class CtrSplit { kTrain = 0, kTest = 1 };

enum class Combiner { kSum, kMean };
const char* CombinerName(Combiner combiner);

// What the generator derived for one sparse feature.
struct CtrFeature {
  std::string name;  // "C1".."C26".
  int64_t vocabulary = 0;
  int max_ids = 1;
  Combiner combiner = Combiner::kSum;
  double weight_scale = 0;  // sigma_f.
};

// One drawn example.
struct CtrExample {
  // The ids of sparse feature f are ids[id_offsets[f]..id_offsets[f+1]).
  std::vector<int64_t> ids;
  std::vector<int32_t> id_offsets;
  std::vector<float> dense;
  double click_probability = 0;
  int label = 0;
};

// Draws Zipf-distributed ranks in 1..n with P(k) ~ k^-s by rejection-inversion
// (Hoermann and Derflinger, 1996): O(1) time and memory whatever n, about one
// uniform per rank. Immutable; thread-safe.
class ZipfSampler {
 public:
  // REQUIRES: n >= 1, s > 0.
  ZipfSampler(int64_t n, double s);
  // `next_uniform` returns doubles in [0, 1).
  template <typename NextUniform>
  int64_t Sample(NextUniform&& next_uniform) const;

 private:
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;

  int64_t n_;
  double s_;
  double h_integral_x1_;
  double h_integral_n_;
  double threshold_;
};

class CtrGenerator {
 public:
  // Checks the options (InvalidArgument naming the option) and calibrates the
  // bias on 16384 examples of a stream of their own.
  static absl::StatusOr<std::unique_ptr<CtrGenerator>> Create(const CtrOptions& options);

  const CtrOptions& options() const { return options_; }
  const std::vector<CtrFeature>& features() const { return features_; }
  const std::vector<double>& dense_means() const { return dense_means_; }
  const std::vector<double>& dense_weights() const { return dense_weights_; }
  double bias() const { return bias_; }

  // Draws example `index` of `split` into `*out` (its vectors are reused).
  // REQUIRES: 0 <= index < 2^56.
  void Generate(CtrSplit split, int64_t index, CtrExample* out) const;

  // The model's logit for the ids and dense values of `example`, from the
  // ids alone (not their ranks): sigmoid(Logit(e)) == e.click_probability.
  double Logit(const CtrExample& example) const;

  // A serialized tensorflow.Example: "C1".. (int64_list of the ids), "I1"..
  // (float_list of one value) and "label" (int64_list {0 or 1}); the same
  // bytes for the same example.
  std::string Encode(const CtrExample& example) const;

 private:
  explicit CtrGenerator(const CtrOptions& options);
  // The logit without the bias.
  double RawLogit(const CtrExample& example) const;
  void Draw(uint64_t stream, CtrExample* out) const;

  CtrOptions options_;
  std::vector<CtrFeature> features_;
  std::vector<ZipfSampler> samplers_;
  std::vector<double> dense_means_;
  std::vector<double> dense_weights_;
  std::vector<std::string> dense_names_;
  uint64_t id_offset_ = 0;
  uint64_t weight_key_ = 0;
  uint64_t interaction_key_ = 0;
  uint64_t stream_key_ = 0;
  int interaction_pairs_ = 0;
  double bias_ = 0;
};

struct CtrDatasetOptions {
  CtrOptions generator;
  std::string out_dir;  // Created with its parents when missing.
  std::string name;     // File prefix: letters, digits, '.', '_', '-'.
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  int num_shards = 1;
};

struct CtrSplitSummary {
  int64_t examples = 0;
  int64_t clicks = 0;
  double mean_probability = 0;
  double bayes_log_loss = 0;
  double bayes_auc = 0;  // NaN when a class is missing.
};

struct CtrDatasetSummary {
  CtrSplitSummary train;
  CtrSplitSummary test;
  std::string train_pattern;  // "NAME-train-*-of-0000K.tfrecord".
  std::string test_pattern;
  std::string summary_path;  // out_dir/NAME.json.
};

// Writes the train and test splits as `num_shards` record files each,
// out_dir/ShardFileName(NAME-train, i, K) and NAME-test likewise, example k
// going to shard k % K, then out_dir/NAME.json (CtrSummaryJson). Files appear
// only once complete. Bad options are InvalidArgument naming the option.
absl::StatusOr<CtrDatasetSummary> WriteCtrDataset(const CtrDatasetOptions& options);

// The summary file: the options and what the generator derived from them
// (bias, each feature's vocabulary, ids, combiner and weight scale), each
// split's example and click counts, click rate and Bayes log loss, and the
// test split's Bayes AUC.
std::string CtrSummaryJson(const CtrDatasetOptions& options, const CtrGenerator& generator,
                           const CtrDatasetSummary& summary);

// ---------------------------------------------------------------- inline

template <typename NextUniform>
int64_t ZipfSampler::Sample(NextUniform&& next_uniform) const {
  while (true) {
    const double u = h_integral_n_ + next_uniform() * (h_integral_x1_ - h_integral_n_);
    const double x = HIntegralInverse(u);
    int64_t k = static_cast<int64_t>(x + 0.5);
    if (k < 1) k = 1;
    if (k > n_) k = n_;
    if (k - x <= threshold_ || u >= HIntegral(k + 0.5) - H(static_cast<double>(k))) return k;
  }
}

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_CTR_GENERATOR_H_
