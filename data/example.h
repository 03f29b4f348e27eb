// Encoding and decoding of tf.train.Example records for supervised training,
// in one of two modes:
//   - one dense feature (raw uint8 bytes, a PNG or JPEG image, or floats) and
//     one integer class label: DecodeExample;
//   - several named inputs (proto/job.proto's InputSpec), each DENSE (the
//     floats of one or more features, concatenated) or SPARSE (a variable
//     number of int64 ids), and the label: InputDecoder.
//
// Thread-safety: the functions are pure and safe to call from any thread; an
// InputDecoder is immutable after Create and may be shared by threads.
// Ownership: callers own all buffers; nothing is retained.
#ifndef DOWNPOUR_DATA_EXAMPLE_H_
#define DOWNPOUR_DATA_EXAMPLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/image.h"

namespace downpour {
namespace data {

// How a bytes_list feature holds its values.
enum class FeatureEncoding {
  // Raw uint8 values when the value has exactly feature_size bytes; otherwise
  // a PNG or JPEG image, told apart by its magic bytes.
  kBySize,
  kRaw,      // Always raw uint8 values.
  kEncoded,  // Always a PNG or JPEG image (for tiny images whose file could
             // have exactly feature_size bytes).
};

// What a reader expects of each example.
struct ExampleFormat {
  std::string feature_key = "image";
  std::string label_key = "label";
  int64_t feature_size = 0;  // Elements per example; > 0.
  // The model's input as an image: what PNG/JPEG values decode to. Unknown
  // (zeros) for a flat input, where an image keeps its own channels.
  ImageShape image;
  FeatureEncoding encoding = FeatureEncoding::kBySize;
};

// Parses a serialized tensorflow.Example and writes its features and label.
//
// The feature under `format.feature_key` is either a bytes_list holding
// exactly one value — `feature_size` raw bytes or an encoded image, as
// `format.encoding` says, scaled by 1/255 into [0, 1] — or a float_list of
// exactly `feature_size` values (copied as they are). The label is as below.
// A bad image is InvalidArgumentError naming the feature and what is wrong.
// REQUIRES: `features` has room for `feature_size` floats; `label` is non-null.
absl::Status DecodeExample(absl::string_view serialized, const ExampleFormat& format,
                           float* features, int32_t* label);

// Parses a serialized tensorflow.Example and writes its features and label.
//
// The feature under `feature_key` is either a bytes_list holding exactly one
// value of `feature_size` bytes (uint8 pixels, scaled by 1/255 into [0, 1]) or
// a float_list of exactly `feature_size` values (copied as they are). The label
// under `label_key` is an int64_list of exactly one value that fits in int32.
// A missing key, another kind, or a wrong size is InvalidArgumentError naming
// the key and both sizes; an unparsable record is DataLossError.
// REQUIRES: `features` has room for `feature_size` floats; `label` is non-null.
absl::Status DecodeExample(absl::string_view serialized, const std::string& feature_key,
                           const std::string& label_key, int64_t feature_size, float* features,
                           int32_t* label);

// Returns a serialized tensorflow.Example with features "image" (bytes_list of
// the `n` pixel bytes), "label" (int64_list {label}) and "shape" (int64_list
// `shape`, e.g. {rows, cols, channels}). Serialization is deterministic, so the
// same input always gives the same bytes.
std::string EncodeImageExample(const uint8_t* pixels, int64_t n, int64_t label,
                               const std::vector<int64_t>& shape);

// ------------------------------------------------------------ named inputs

// What one named input (InputSpec) reads of each example.
struct InputFormat {
  std::string name;  // For messages.
  bool sparse = false;
  // Dense: one or more features (float_list, or int64_list converted to
  // float), concatenated in order. Sparse: exactly one int64_list.
  std::vector<std::string> features;
  int64_t size = 0;     // Dense: values per example in all (> 0); sparse: 0.
  int32_t max_ids = 0;  // Sparse: the most ids one example may hold (> 0); dense: 0.
};

// One input's share of a batch of `n` examples.
struct InputBatch {
  std::vector<float> values;     // Dense: n * InputFormat::size, example-major.
  std::vector<int64_t> ids;      // Sparse: every example's ids, one example after another.
  std::vector<int64_t> offsets;  // Sparse: n + 1 entries; example i's ids are
                                 // ids[offsets[i], offsets[i + 1]).
};

// One example's inputs as InputDecoder::Decode leaves them, before they are
// placed in a batch (sparse lengths vary, so a batch's layout is known only
// once all its examples are decoded). Reused from record to record, it keeps
// its allocations.
struct DecodedInputs {
  std::vector<float> values;     // Every dense input's values, input after input.
  std::vector<int64_t> ids;      // Every sparse input's ids, input after input.
  std::vector<int64_t> id_ends;  // Per input: the end of its ids in `ids`
                                 // (a dense input repeats the previous end).
  int32_t label = 0;
};

// Decodes serialized tensorflow.Example records into named inputs and an
// int32 label, parsing the wire format directly: the features asked for are
// found through one hash lookup per map entry, nothing is allocated per
// feature, and no protobuf message is built (except for a record whose
// encoding a hand parser should not guess at, e.g. one Feature written as
// two messages to be merged, which goes through protobuf once and then the
// same path). A feature key may appear in several inputs.
//
// Use, for a batch on several threads: Decode each record into its own
// DecodedInputs (any thread, any order), then LayOutBatch once, then
// PlaceExample for each example (any thread, any order). The batch is the
// same however the work was spread.
//
// Errors are one sentence naming the input, the feature and what is wrong,
// InvalidArgumentError: a missing dense feature (a missing sparse feature is
// zero ids, like Criteo's missing values; a Feature with no list is an empty
// one), a bytes_list (or a float_list of ids), a dense total other than
// `size`, more than `max_ids` ids, a label missing, not an int64_list of one
// value, or outside int32. A record that is not a tensorflow.Example is
// DataLossError. Features that no input names are not examined.
//
// Thread-safety: immutable after Create; Decode, LayOutBatch and PlaceExample
// may run concurrently (on distinct outputs). Decode allocates nothing once
// `out` has grown to size (the protobuf path keeps a message per thread).
class InputDecoder {
 public:
  // Checks the formats (InvalidArgumentError naming the input): at least one
  // input; names non-empty and unique; a dense input has features and
  // size > 0 and no max_ids; a sparse one exactly one feature, max_ids > 0
  // and no size; feature keys and `label_key` non-empty.
  static absl::StatusOr<InputDecoder> Create(std::vector<InputFormat> inputs,
                                             std::string label_key);

  const std::vector<InputFormat>& inputs() const { return inputs_; }
  const std::string& label_key() const { return label_key_; }
  // Floats of every dense input of one example together.
  int64_t dense_values() const { return dense_values_; }

  // Decodes one record into `*out` (all of it rewritten). On error `*out` is
  // unspecified.
  absl::Status Decode(absl::string_view serialized, DecodedInputs* out) const;

  // Sizes `*batch` (one InputBatch per input) for examples[0..n) and fills the
  // sparse inputs' offsets. REQUIRES: each examples[i] was decoded by Decode
  // of this decoder.
  void LayOutBatch(const DecodedInputs* examples, int64_t n, std::vector<InputBatch>* batch) const;
  // Copies `example`'s values and ids to its place, example `index`, in a
  // batch laid out by LayOutBatch from the same examples.
  void PlaceExample(const DecodedInputs& example, int64_t index,
                    std::vector<InputBatch>* batch) const;
  // Appends `example` after the examples `*batch` holds (an empty vector
  // holds none): LayOutBatch and PlaceExample for one thread.
  void AppendExample(const DecodedInputs& example, std::vector<InputBatch>* batch) const;

 private:
  InputDecoder() = default;
  // Decode on the wire format alone. Sets `*unusual` (and returns OK) where
  // the record needs protobuf's merging of sub-messages.
  absl::Status DecodeWire(absl::string_view serialized, DecodedInputs* out, bool* unusual) const;

  std::vector<InputFormat> inputs_;
  std::string label_key_;
  // Each distinct feature key asked for (the label's included) and its slot.
  std::vector<std::string> keys_;
  // An open-addressing table of keys_, at most a quarter full. A bucket keeps
  // what the lookup loads of a key (its first and last bytes, which are all
  // of a key of up to 16 bytes), so that most lookups compare two words and
  // call nothing: absl's hash, out of line in a shared library, and memcmp
  // took a fifth of the decoding time.
  struct Bucket {
    uint64_t head = 0;
    uint64_t tail = 0;
    uint64_t size = 0;
    int slot = -1;  // -1: empty.
  };
  std::vector<Bucket> buckets_;
  uint64_t bucket_mask_ = 0;
  std::vector<std::vector<int>> input_slots_;  // Per input: the slots of its features.
  int label_slot_ = 0;
  std::vector<int64_t> value_begin_;  // Per input: where its values start in
                                      // DecodedInputs::values (dense inputs).
  int64_t dense_values_ = 0;
};

// Decodes a serialized tf.Example into example `index` of `*out` (one
// InputBatch per input, in order; appended after examples 0..index-1, which
// it must hold — for index 0, `out` may be empty) and its label. For tools
// and tests: it builds an InputDecoder per call; a reader keeps one.
// On error `*out` is unchanged.
absl::Status DecodeInputs(absl::string_view serialized, const std::vector<InputFormat>& inputs,
                          const std::string& label_key, int64_t index, std::vector<InputBatch>* out,
                          int32_t* label);

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_EXAMPLE_H_
