// InputDecoder (data/example.h): named dense and sparse inputs read straight
// from tensorflow.Example's wire format.
//
// Going through protobuf's generated parser builds a Map of 40 std::string
// keys and 40 Feature messages per CTR record and then looks each feature up
// by key; reading the bytes in place and hashing each entry's key once is
// several times faster and allocates nothing. The hand parser follows
// protobuf's rules where a valid Example may differ from the usual layout
// (unknown fields and groups skipped, packed and unpacked lists, several list
// chunks, a key given twice: the last entry wins, Features given twice:
// merged). What needs protobuf's merging of sub-messages (one map entry with
// two values, one Feature with two lists) is handed to protobuf, whose
// canonical re-serialization then takes the same path.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/example.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/example.pb.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "packed float_list values are copied as they lie: little-endian hosts only");

namespace downpour {
namespace data {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kStartGroup = 3;
constexpr uint32_t kEndGroup = 4;
constexpr uint32_t kFixed32 = 5;
// Nesting of unknown groups skipped (protobuf's own recursion limit).
constexpr int kMaxGroupDepth = 100;

// Feature's `kind` fields.
constexpr uint32_t kBytesListField = 1;
constexpr uint32_t kFloatListField = 2;
constexpr uint32_t kInt64ListField = 3;

// How a scan ended.
enum class Parse {
  kOk,
  kCorrupt,  // Not valid wire format.
  kUnusual,  // Valid, but needs protobuf's merging of sub-messages.
};

// A cursor over wire-format bytes; every read checks the bounds and returns
// false on truncated or malformed input.
class WireReader {
 public:
  explicit WireReader(absl::string_view bytes)
      : p_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(p_ + bytes.size()) {}

  bool done() const { return p_ == end_; }

  bool Varint(uint64_t* value) {
    if (p_ < end_ && *p_ < 0x80) {
      *value = *p_++;
      return true;
    }
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {  // At most 10 bytes.
      if (p_ == end_) return false;
      const uint8_t byte = *p_++;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (byte < 0x80) {
        *value = result;
        return true;
      }
    }
    return false;
  }

  bool Tag(uint32_t* field, uint32_t* wire_type) {
    uint64_t tag;
    if (!Varint(&tag) || tag > std::numeric_limits<uint32_t>::max()) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<uint32_t>(tag & 7);
    return *field != 0;
  }

  bool LengthDelimited(absl::string_view* bytes) {
    uint64_t length;
    if (!Varint(&length) || length > static_cast<uint64_t>(end_ - p_)) return false;
    *bytes = absl::string_view(reinterpret_cast<const char*>(p_), length);
    p_ += length;
    return true;
  }

  bool Fixed32(uint32_t* value) {
    if (end_ - p_ < 4) return false;
    std::memcpy(value, p_, 4);
    p_ += 4;
    return true;
  }

  // Skips the value of a field whose tag was just read.
  bool Skip(uint32_t field, uint32_t wire_type, int depth = 0) {
    uint64_t unused;
    absl::string_view bytes;
    switch (wire_type) {
      case kVarint:
        return Varint(&unused);
      case kFixed64:
        return Advance(8);
      case kLengthDelimited:
        return LengthDelimited(&bytes);
      case kFixed32:
        return Advance(4);
      case kStartGroup: {
        if (depth >= kMaxGroupDepth) return false;
        uint32_t inner_field, inner_type;
        while (Tag(&inner_field, &inner_type)) {
          if (inner_type == kEndGroup) return inner_field == field;
          if (!Skip(inner_field, inner_type, depth + 1)) return false;
        }
        return false;
      }
      default:  // An end group without its start, or wire types 6 and 7.
        return false;
    }
  }

 private:
  bool Advance(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }

  const uint8_t* p_;
  const uint8_t* end_;
};

// Calls on_entry(key, value) for each entry of the Example's feature map, in
// the order written (so a later entry of a key overrides an earlier one, as
// protobuf's Map does). An entry without a value has an empty one.
template <typename OnEntry>
Parse ScanExample(absl::string_view serialized, OnEntry&& on_entry) {
  WireReader example(serialized);
  uint32_t field, type;
  while (!example.done()) {
    if (!example.Tag(&field, &type)) return Parse::kCorrupt;
    if (field != 1 || type != kLengthDelimited) {  // Not Example.features.
      if (!example.Skip(field, type)) return Parse::kCorrupt;
      continue;
    }
    absl::string_view features_bytes;
    if (!example.LengthDelimited(&features_bytes)) return Parse::kCorrupt;
    WireReader features(features_bytes);
    while (!features.done()) {
      if (!features.Tag(&field, &type)) return Parse::kCorrupt;
      if (field != 1 || type != kLengthDelimited) {  // Not Features.feature.
        if (!features.Skip(field, type)) return Parse::kCorrupt;
        continue;
      }
      absl::string_view entry_bytes;
      if (!features.LengthDelimited(&entry_bytes)) return Parse::kCorrupt;
      WireReader entry(entry_bytes);
      absl::string_view key, value;
      int values = 0;
      while (!entry.done()) {
        if (!entry.Tag(&field, &type)) return Parse::kCorrupt;
        if (field == 1 && type == kLengthDelimited) {
          if (!entry.LengthDelimited(&key)) return Parse::kCorrupt;
        } else if (field == 2 && type == kLengthDelimited) {
          if (!entry.LengthDelimited(&value)) return Parse::kCorrupt;
          ++values;
        } else if (!entry.Skip(field, type)) {
          return Parse::kCorrupt;
        }
      }
      if (values > 1) return Parse::kUnusual;  // Two Feature messages to merge.
      on_entry(key, value);
    }
  }
  return Parse::kOk;
}

// Finds a Feature's list: `kind` is 0 (no list), kBytesListField,
// kFloatListField or kInt64ListField.
Parse ReadFeature(absl::string_view feature_bytes, uint32_t* kind, absl::string_view* list) {
  WireReader feature(feature_bytes);
  *kind = 0;
  *list = absl::string_view();
  int lists = 0;
  uint32_t field, type;
  while (!feature.done()) {
    if (!feature.Tag(&field, &type)) return Parse::kCorrupt;
    if (field >= kBytesListField && field <= kInt64ListField && type == kLengthDelimited) {
      if (!feature.LengthDelimited(list)) return Parse::kCorrupt;
      *kind = field;
      ++lists;
    } else if (!feature.Skip(field, type)) {
      return Parse::kCorrupt;
    }
  }
  return lists > 1 ? Parse::kUnusual : Parse::kOk;
}

// Calls emit(float) for each value of a FloatList, packed or not.
template <typename Emit>
Parse ForEachFloat(absl::string_view list_bytes, Emit&& emit) {
  WireReader list(list_bytes);
  uint32_t field, type;
  while (!list.done()) {
    if (!list.Tag(&field, &type)) return Parse::kCorrupt;
    if (field == 1 && type == kLengthDelimited) {
      absl::string_view packed;
      if (!list.LengthDelimited(&packed) || packed.size() % 4 != 0) return Parse::kCorrupt;
      for (size_t i = 0; i < packed.size(); i += 4) {
        float value;
        std::memcpy(&value, packed.data() + i, 4);
        emit(value);
      }
    } else if (field == 1 && type == kFixed32) {
      uint32_t bits;
      if (!list.Fixed32(&bits)) return Parse::kCorrupt;
      float value;
      std::memcpy(&value, &bits, 4);
      emit(value);
    } else if (!list.Skip(field, type)) {
      return Parse::kCorrupt;
    }
  }
  return Parse::kOk;
}

// Calls emit(int64_t) for each value of an Int64List, packed or not.
template <typename Emit>
Parse ForEachInt64(absl::string_view list_bytes, Emit&& emit) {
  WireReader list(list_bytes);
  uint32_t field, type;
  uint64_t value;
  while (!list.done()) {
    if (!list.Tag(&field, &type)) return Parse::kCorrupt;
    if (field == 1 && type == kLengthDelimited) {
      absl::string_view packed_bytes;
      if (!list.LengthDelimited(&packed_bytes)) return Parse::kCorrupt;
      WireReader packed(packed_bytes);
      while (!packed.done()) {
        if (!packed.Varint(&value)) return Parse::kCorrupt;
        emit(static_cast<int64_t>(value));
      }
    } else if (field == 1 && type == kVarint) {
      if (!list.Varint(&value)) return Parse::kCorrupt;
      emit(static_cast<int64_t>(value));
    } else if (!list.Skip(field, type)) {
      return Parse::kCorrupt;
    }
  }
  return Parse::kOk;
}

const char* KindName(uint32_t kind) {
  switch (kind) {
    case kBytesListField:
      return "a bytes_list";
    case kFloatListField:
      return "a float_list";
    case kInt64ListField:
      return "an int64_list";
    default:
      return "an empty feature";
  }
}

absl::Status NotAnExample(absl::string_view serialized) {
  return absl::DataLossError(
      absl::StrCat("record of ", serialized.size(), " bytes is not a valid tensorflow.Example"));
}

// "a, b, c" (sorted; the first 50), for errors about a missing feature. Only
// on the error path: allocates.
std::string FeatureKeys(absl::string_view serialized) {
  std::vector<std::string> keys;
  ScanExample(serialized,
              [&](absl::string_view key, absl::string_view) { keys.emplace_back(key); });
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (keys.empty()) return "no features";
  constexpr size_t kMaxListed = 50;
  const size_t more = keys.size() > kMaxListed ? keys.size() - kMaxListed : 0;
  keys.resize(keys.size() - more);
  return absl::StrCat(absl::StrJoin(keys, ", "),
                      more > 0 ? absl::StrCat(" and ", more, " more") : std::string());
}

// Where each feature asked for lies in the record being decoded.
struct FoundFeature {
  absl::string_view bytes;  // The Feature message.
  bool present = false;
};

}  // namespace

absl::StatusOr<InputDecoder> InputDecoder::Create(std::vector<InputFormat> inputs,
                                                  std::string label_key) {
  if (inputs.empty()) return absl::InvalidArgumentError("no inputs to decode");
  if (label_key.empty()) return absl::InvalidArgumentError("the label feature key is empty");
  InputDecoder decoder;
  auto slot = [&decoder](const std::string& key) {
    auto [it, added] =
        decoder.slot_of_key_.try_emplace(key, static_cast<int>(decoder.keys_.size()));
    if (added) decoder.keys_.push_back(key);
    return it->second;
  };
  std::vector<std::string> names;
  for (const InputFormat& input : inputs) {
    const std::string what =
        absl::StrCat(input.sparse ? "sparse" : "dense", " input \"", input.name, "\"");
    if (input.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", decoder.input_slots_.size(), " has no name"));
    }
    if (std::find(names.begin(), names.end(), input.name) != names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("two inputs are named \"", input.name, "\""));
    }
    names.push_back(input.name);
    if (input.sparse) {
      if (input.features.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " must read exactly 1 feature; it has ", input.features.size()));
      }
      if (input.max_ids <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " needs max_ids > 0; got ", input.max_ids));
      }
      if (input.size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " has size ", input.size, "; a sparse input's length is bounded by max_ids"));
      }
    } else {
      if (input.features.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(what, " reads no features"));
      }
      if (input.size <= 0 || input.size > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " needs a size in [1, 2^31); got ", input.size));
      }
      if (input.max_ids != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " has max_ids ", input.max_ids, "; only sparse inputs hold ids"));
      }
    }
    std::vector<int> slots;
    for (const std::string& feature : input.features) {
      if (feature.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(what, " names an empty feature key"));
      }
      slots.push_back(slot(feature));
    }
    decoder.input_slots_.push_back(std::move(slots));
    decoder.value_begin_.push_back(decoder.dense_values_);
    if (!input.sparse) decoder.dense_values_ += input.size;
  }
  decoder.label_slot_ = slot(label_key);
  decoder.inputs_ = std::move(inputs);
  decoder.label_key_ = std::move(label_key);
  return decoder;
}

absl::Status InputDecoder::Decode(absl::string_view serialized, DecodedInputs* out) const {
  bool unusual = false;
  absl::Status status = DecodeWire(serialized, out, &unusual);
  if (!unusual) return status;
  // Reused per thread: parsing into a cleared message keeps its allocations.
  thread_local tensorflow::Example example;
  thread_local std::string canonical;
  example.Clear();
  if (serialized.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !example.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    return NotAnExample(serialized);
  }
  canonical.clear();
  {
    google::protobuf::io::StringOutputStream stream(&canonical);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    example.SerializeToCodedStream(&coded);
  }
  status = DecodeWire(canonical, out, &unusual);
  if (unusual) {
    return absl::InternalError(absl::StrCat("record of ", serialized.size(),
                                            " bytes stays unusual after re-serialization"));
  }
  return status;
}

absl::Status InputDecoder::DecodeWire(absl::string_view serialized, DecodedInputs* out,
                                      bool* unusual) const {
  *unusual = false;
  // Reused per thread, so that decoding allocates nothing per record.
  thread_local std::vector<FoundFeature> found;
  found.assign(keys_.size(), FoundFeature());
  Parse parse = ScanExample(serialized, [&](absl::string_view key, absl::string_view value) {
    auto it = slot_of_key_.find(key);
    if (it != slot_of_key_.end()) found[it->second] = FoundFeature{value, true};
  });
  if (parse == Parse::kUnusual) *unusual = true;
  if (parse != Parse::kOk) return *unusual ? absl::OkStatus() : NotAnExample(serialized);

  // Each feature's list, or a status for the scan's outcome.
  uint32_t kind;
  absl::string_view list;
  auto read_feature = [&](int slot) {
    parse = ReadFeature(found[slot].bytes, &kind, &list);
    if (parse == Parse::kUnusual) *unusual = true;
  };

  out->values.resize(dense_values_);
  out->ids.clear();
  out->id_ends.resize(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputFormat& input = inputs_[i];
    const std::vector<int>& slots = input_slots_[i];
    if (input.sparse) {
      const int slot = slots[0];
      int64_t count = 0;
      if (found[slot].present) {
        read_feature(slot);
        if (parse != Parse::kOk) return *unusual ? absl::OkStatus() : NotAnExample(serialized);
        if (kind == kInt64ListField) {
          std::vector<int64_t>& ids = out->ids;
          const int64_t max_ids = input.max_ids;
          parse = ForEachInt64(list, [&](int64_t id) {
            if (count++ < max_ids) ids.push_back(id);
          });
          if (parse != Parse::kOk) return NotAnExample(serialized);
          if (count > max_ids) {
            return absl::InvalidArgumentError(
                absl::StrCat("input \"", input.name, "\": feature \"", keys_[slot], "\" has ",
                             count, " ids; at most ", max_ids, " (max_ids) are allowed"));
          }
        } else if (kind != 0) {
          return absl::InvalidArgumentError(absl::StrCat("input \"", input.name, "\": feature \"",
                                                         keys_[slot], "\" is ", KindName(kind),
                                                         "; expected an int64_list of ids"));
        }
      }
      out->id_ends[i] = static_cast<int64_t>(out->ids.size());
      continue;
    }

    float* values = out->values.data() + value_begin_[i];
    const int64_t size = input.size;
    int64_t count = 0;
    auto emit = [&](float value) {
      if (count < size) values[count] = value;
      ++count;
    };
    for (int slot : slots) {
      if (!found[slot].present) {
        return absl::InvalidArgumentError(
            absl::StrCat("input \"", input.name, "\": the example has no feature \"", keys_[slot],
                         "\"; it has: ", FeatureKeys(serialized)));
      }
      read_feature(slot);
      if (parse != Parse::kOk) return *unusual ? absl::OkStatus() : NotAnExample(serialized);
      if (kind == kFloatListField) {
        parse = ForEachFloat(list, emit);
      } else if (kind == kInt64ListField) {
        parse = ForEachInt64(list, [&](int64_t value) { emit(static_cast<float>(value)); });
      } else if (kind != 0) {
        return absl::InvalidArgumentError(absl::StrCat("input \"", input.name, "\": feature \"",
                                                       keys_[slot], "\" is ", KindName(kind),
                                                       "; expected a float_list or an int64_list"));
      }
      if (parse != Parse::kOk) return NotAnExample(serialized);
    }
    if (count != size) {
      std::vector<std::string> names;
      for (int slot : slots) names.push_back(absl::StrCat("\"", keys_[slot], "\""));
      return absl::InvalidArgumentError(
          absl::StrCat("input \"", input.name, "\": feature", slots.size() > 1 ? "s " : " ",
                       absl::StrJoin(names, ", "), " hold ", count, " values; expected ", size));
    }
    out->id_ends[i] = static_cast<int64_t>(out->ids.size());
  }

  if (!found[label_slot_].present) {
    return absl::InvalidArgumentError(absl::StrCat("the example has no label feature \"",
                                                   label_key_,
                                                   "\"; it has: ", FeatureKeys(serialized)));
  }
  read_feature(label_slot_);
  if (parse != Parse::kOk) return *unusual ? absl::OkStatus() : NotAnExample(serialized);
  if (kind != kInt64ListField) {
    return absl::InvalidArgumentError(absl::StrCat("label feature \"", label_key_, "\" is ",
                                                   KindName(kind),
                                                   "; expected an int64_list of 1 value"));
  }
  int64_t label = 0;
  int64_t labels = 0;
  parse = ForEachInt64(list, [&](int64_t value) {
    label = value;
    ++labels;
  });
  if (parse != Parse::kOk) return NotAnExample(serialized);
  if (labels != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("label feature \"", label_key_, "\" has ", labels, " values; expected 1"));
  }
  if (label < std::numeric_limits<int32_t>::min() || label > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("label feature \"", label_key_, "\" value ", label, " does not fit int32"));
  }
  out->label = static_cast<int32_t>(label);
  return absl::OkStatus();
}

void InputDecoder::LayOutBatch(const DecodedInputs* examples, int64_t n,
                               std::vector<InputBatch>* batch) const {
  batch->resize(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    InputBatch& b = (*batch)[i];
    if (!inputs_[i].sparse) {
      b.values.resize(n * inputs_[i].size);
      b.ids.clear();
      b.offsets.clear();
      continue;
    }
    b.values.clear();
    b.offsets.resize(n + 1);
    b.offsets[0] = 0;
    for (int64_t e = 0; e < n; ++e) {
      const DecodedInputs& example = examples[e];
      const int64_t begin = i == 0 ? 0 : example.id_ends[i - 1];
      b.offsets[e + 1] = b.offsets[e] + (example.id_ends[i] - begin);
    }
    b.ids.resize(b.offsets[n]);
  }
}

void InputDecoder::PlaceExample(const DecodedInputs& example, int64_t index,
                                std::vector<InputBatch>* batch) const {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    InputBatch& b = (*batch)[i];
    if (!inputs_[i].sparse) {
      const int64_t size = inputs_[i].size;
      std::copy_n(example.values.data() + value_begin_[i], size, b.values.data() + index * size);
      continue;
    }
    const int64_t begin = i == 0 ? 0 : example.id_ends[i - 1];
    std::copy(example.ids.data() + begin, example.ids.data() + example.id_ends[i],
              b.ids.data() + b.offsets[index]);
  }
}

void InputDecoder::AppendExample(const DecodedInputs& example,
                                 std::vector<InputBatch>* batch) const {
  batch->resize(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    InputBatch& b = (*batch)[i];
    if (!inputs_[i].sparse) {
      const float* values = example.values.data() + value_begin_[i];
      b.values.insert(b.values.end(), values, values + inputs_[i].size);
      continue;
    }
    const int64_t begin = i == 0 ? 0 : example.id_ends[i - 1];
    b.ids.insert(b.ids.end(), example.ids.data() + begin, example.ids.data() + example.id_ends[i]);
    if (b.offsets.empty()) b.offsets.push_back(0);
    b.offsets.push_back(static_cast<int64_t>(b.ids.size()));
  }
}

absl::Status DecodeInputs(absl::string_view serialized, const std::vector<InputFormat>& inputs,
                          const std::string& label_key, int64_t index, std::vector<InputBatch>* out,
                          int32_t* label) {
  absl::StatusOr<InputDecoder> decoder = InputDecoder::Create(inputs, label_key);
  if (!decoder.ok()) return decoder.status();
  // The examples `out` holds, by its first input.
  int64_t held = 0;
  if (!out->empty()) {
    const InputBatch& first = (*out)[0];
    held = inputs[0].sparse ? std::max<int64_t>(0, static_cast<int64_t>(first.offsets.size()) - 1)
                            : static_cast<int64_t>(first.values.size()) / inputs[0].size;
  }
  if ((!out->empty() && out->size() != inputs.size()) || held != index) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeInputs: example ", index,
                                                   " cannot follow the ", held, " examples of ",
                                                   out->size(), " inputs in the batch"));
  }
  DecodedInputs decoded;
  absl::Status status = decoder->Decode(serialized, &decoded);
  if (!status.ok()) return status;
  decoder->AppendExample(decoded, out);
  *label = decoded.label;
  return absl::OkStatus();
}

}  // namespace data
}  // namespace downpour
