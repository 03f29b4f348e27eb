// InputDecoder (data/example.h): named dense and sparse inputs read straight
// from tensorflow.Example's wire format.
//
// Going through protobuf's generated parser builds a Map of 40 std::string
// keys and 40 Feature messages per CTR record and then looks each feature up
// by key; reading the bytes in place and hashing each entry's key once
// allocates nothing and is about ten times faster: a CTR record of 930 bytes
// (26 id lists, 13 floats, a label) in 1.0-1.5 us on one thread against
// 12-20 us (InputDecoderSpeedTest in example_inputs_test, best of 7 rounds,
// on the project's 2-core Xeon VM shared with other builds).
//
// The hand parser follows protobuf's rules where a valid Example may differ
// from the usual layout (unknown fields and groups skipped, packed and
// unpacked lists, several list chunks, a key given twice: the last entry
// wins, Features given twice: merged). What needs protobuf's merging of
// sub-messages (one map entry with two values, one Feature with two lists)
// is handed to protobuf, whose canonical re-serialization then takes the
// same path.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/inlined_vector.h"
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
// Tag bytes of length-delimited fields 1 and 2.
constexpr uint8_t kKeyTag = 0x0a;
constexpr uint8_t kValueTag = 0x12;

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
      : p_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(p_ + bytes.size()), limit_(end_) {}
  // `readable_end`: where the buffer that holds `bytes` ends, so that a varint
  // near the end of `bytes` may be loaded whole (and then checked).
  WireReader(absl::string_view bytes, const char* readable_end)
      : p_(reinterpret_cast<const uint8_t*>(bytes.data())),
        end_(p_ + bytes.size()),
        limit_(reinterpret_cast<const uint8_t*>(readable_end)) {}

  bool done() const { return p_ == end_; }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Varint(uint64_t* value) {
    if (p_ < end_ && *p_ < 0x80) {
      *value = *p_++;
      return true;
    }
    return limit_ - p_ >= 10 ? LongVarint(value) : VarintNearEnd(value);
  }

  // Varint with the long case inlined too: for the ids of packed lists.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool InlineVarint(uint64_t* value) {
    if (p_ < end_ && *p_ < 0x80) {
      *value = *p_++;
      return true;
    }
    if (limit_ - p_ < 10) return VarintNearEnd(value);
    const uint8_t* next = DecodeLongVarint(p_, value);
    if (next == nullptr || next > end_) return false;
    p_ = next;
    return true;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Tag(uint32_t* field, uint32_t* wire_type) {
    uint64_t tag;
    if (!Varint(&tag) || tag > std::numeric_limits<uint32_t>::max()) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<uint32_t>(tag & 7);
    return *field != 0;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool LengthDelimited(absl::string_view* bytes) {
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

  // A varint of 2 or more bytes with 10 bytes left: no bounds checks, and
  // no branch on its length but 9 against 10 bytes (ids are mostly 9 or 10
  // bytes long, so a loop over bytes mispredicts its exit). The 7-bit groups
  // of 8 bytes loaded at once are packed together by three shifts.
  ABSL_ATTRIBUTE_NOINLINE bool LongVarint(uint64_t* value) {
    const uint8_t* next = DecodeLongVarint(p_, value);
    if (next == nullptr || next > end_) return false;
    p_ = next;
    return true;
  }

  // The last varint of a list, mostly: decoded from a zero-padded copy, so
  // that a truncated one ends in the padding, past the end.
  ABSL_ATTRIBUTE_NOINLINE bool VarintNearEnd(uint64_t* value) {
    uint8_t padded[16] = {};
    const size_t left = static_cast<size_t>(end_ - p_);
    std::memcpy(padded, p_, left);
    const uint8_t* next = DecodeLongVarint(padded, value);
    if (next == nullptr || static_cast<size_t>(next - padded) > left) return false;
    p_ += next - padded;
    return true;
  }

  // REQUIRES: 10 readable bytes at `p`. Returns the byte after the varint,
  // or null for one of more than 10 bytes.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static const uint8_t* DecodeLongVarint(const uint8_t* p,
                                                                      uint64_t* value) {
    uint64_t low;
    std::memcpy(&low, p, 8);
    const uint64_t ends = ~low & 0x8080808080808080u;  // Bytes without continuation.
    if (ends != 0) {
      const int bits = __builtin_ctzll(ends) + 1;  // Through the last byte.
      *value = PackGroups(bits == 64 ? low : low & ((uint64_t{1} << bits) - 1));
      return p + bits / 8;
    }
    const uint64_t ninth = p[8];
    const uint64_t tenth = p[9];
    const uint64_t ten_bytes = ninth >> 7;
    if ((ten_bytes & (tenth >> 7)) != 0) return nullptr;  // More than 10 bytes.
    *value = PackGroups(low) | (ninth & 0x7f) << 56 | ((tenth << 63) & (0 - ten_bytes));
    return p + 9 + ten_bytes;
  }

  // The 7-bit groups of 8 little-endian bytes, as one 56-bit number.
  static uint64_t PackGroups(uint64_t x) {
    x &= 0x7f7f7f7f7f7f7f7fu;
    x = (x & 0x007f007f007f007fu) | (x & 0x7f007f007f007f00u) >> 1;
    x = (x & 0x00003fff00003fffu) | (x & 0x3fff00003fff0000u) >> 2;
    return (x & 0x000000000fffffffu) | (x & 0x0fffffff00000000u) >> 4;
  }

  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* limit_;  // >= end_.
};

// Whether `bytes` is exactly one length-delimited field of tag byte `tag`
// with a one-byte length: the usual layout of a map entry's value, a Feature
// and a list of fewer than 128 bytes, checked in a few instructions (the
// general loops cost ten times as much). Its payload then.
ABSL_ATTRIBUTE_ALWAYS_INLINE bool ShortField(absl::string_view bytes, uint8_t tag,
                                             absl::string_view* payload) {
  if (bytes.size() < 2 || static_cast<uint8_t>(bytes[0]) != tag) return false;
  const uint8_t length = static_cast<uint8_t>(bytes[1]);
  if (length >= 0x80 || length != bytes.size() - 2) return false;
  *payload = absl::string_view(bytes.data() + 2, length);
  return true;
}

// A map entry in any layout protobuf accepts; see ReadEntry.
ABSL_ATTRIBUTE_NOINLINE Parse ReadEntryInAnyLayout(absl::string_view entry_bytes,
                                                   absl::string_view* key,
                                                   absl::string_view* value) {
  WireReader entry(entry_bytes);
  *key = absl::string_view();
  *value = absl::string_view();
  int values = 0;
  uint32_t field, type;
  while (!entry.done()) {
    if (!entry.Tag(&field, &type)) return Parse::kCorrupt;
    if (field == 1 && type == kLengthDelimited) {
      if (!entry.LengthDelimited(key)) return Parse::kCorrupt;
    } else if (field == 2 && type == kLengthDelimited) {
      if (!entry.LengthDelimited(value)) return Parse::kCorrupt;
      ++values;
    } else if (!entry.Skip(field, type)) {
      return Parse::kCorrupt;
    }
  }
  return values > 1 ? Parse::kUnusual : Parse::kOk;  // Two Feature messages to merge.
}

// Reads a map entry's key and value (a Feature). An entry without a value has
// an empty one.
ABSL_ATTRIBUTE_ALWAYS_INLINE Parse ReadEntry(absl::string_view entry_bytes, absl::string_view* key,
                                             absl::string_view* value) {
  // The usual layout: key (field 1), then value (field 2), short.
  const size_t key_length = entry_bytes.size() >= 2 ? static_cast<uint8_t>(entry_bytes[1]) : 0x80;
  if (key_length < 0x80 && static_cast<uint8_t>(entry_bytes[0]) == kKeyTag &&
      key_length + 2 <= entry_bytes.size() &&
      ShortField(absl::string_view(entry_bytes.data() + key_length + 2,
                                   entry_bytes.size() - key_length - 2),
                 kValueTag, value)) {
    *key = absl::string_view(entry_bytes.data() + 2, key_length);
    return Parse::kOk;
  }
  return ReadEntryInAnyLayout(entry_bytes, key, value);
}

// Calls on_entry(key, value) for each entry of the Example's feature map, in
// the order written (so a later entry of a key overrides an earlier one, as
// protobuf's Map does); a result other than kOk ends the scan.
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
      absl::string_view entry, key, value;
      if (!features.LengthDelimited(&entry)) return Parse::kCorrupt;
      Parse parse = ReadEntry(entry, &key, &value);
      if (parse == Parse::kOk) parse = on_entry(key, value);
      if (parse != Parse::kOk) return parse;
    }
  }
  return Parse::kOk;
}

// A Feature in any layout protobuf accepts; see ReadFeature.
ABSL_ATTRIBUTE_NOINLINE Parse ReadFeatureInAnyLayout(absl::string_view feature_bytes,
                                                     uint32_t* kind, absl::string_view* list) {
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
  return lists > 1 ? Parse::kUnusual : Parse::kOk;  // Lists to merge or to replace.
}

// Finds a Feature's list: `kind` is 0 (no list), kBytesListField,
// kFloatListField or kInt64ListField.
ABSL_ATTRIBUTE_ALWAYS_INLINE Parse ReadFeature(absl::string_view feature_bytes, uint32_t* kind,
                                               absl::string_view* list) {
  if (!feature_bytes.empty()) {  // The usual layout: one short list.
    const uint8_t tag = static_cast<uint8_t>(feature_bytes[0]);
    if (tag >= (kBytesListField << 3 | kLengthDelimited) &&
        tag <= (kInt64ListField << 3 | kLengthDelimited) && (tag & 7) == kLengthDelimited &&
        ShortField(feature_bytes, tag, list)) {
      *kind = tag >> 3;
      return Parse::kOk;
    }
  }
  return ReadFeatureInAnyLayout(feature_bytes, kind, list);
}

// Calls emit(float) for each value of a packed run of floats; kCorrupt
// (before any call) when the run is not a whole number of them.
template <typename Emit>
Parse ForEachPackedFloat(absl::string_view packed, Emit& emit) {
  if (packed.size() % 4 != 0) return Parse::kCorrupt;
  for (size_t i = 0; i < packed.size(); i += 4) {
    float value;
    std::memcpy(&value, packed.data() + i, 4);
    emit(value);
  }
  return Parse::kOk;
}

// Calls emit(float) for each value of a FloatList, packed or not.
template <typename Emit>
Parse ForEachFloat(absl::string_view list_bytes, Emit&& emit) {
  absl::string_view packed;
  if (ShortField(list_bytes, kKeyTag, &packed)) {  // The usual layout: one packed run.
    return ForEachPackedFloat(packed, emit);
  }
  WireReader list(list_bytes);
  uint32_t field, type;
  while (!list.done()) {
    if (!list.Tag(&field, &type)) return Parse::kCorrupt;
    if (field == 1 && type == kLengthDelimited) {
      if (!list.LengthDelimited(&packed)) return Parse::kCorrupt;
      if (ForEachPackedFloat(packed, emit) != Parse::kOk) return Parse::kCorrupt;
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
// `readable_end`: the end of the record that holds the list.
template <typename Emit>
Parse ForEachInt64(absl::string_view list_bytes, const char* readable_end, Emit&& emit) {
  uint64_t value;
  absl::string_view packed_run;
  if (ShortField(list_bytes, kKeyTag, &packed_run)) {  // The usual layout: one packed run.
    WireReader packed(packed_run, readable_end);
    while (!packed.done()) {
      if (!packed.InlineVarint(&value)) return Parse::kCorrupt;
      emit(static_cast<int64_t>(value));
    }
    return Parse::kOk;
  }
  WireReader list(list_bytes);
  uint32_t field, type;
  while (!list.done()) {
    if (!list.Tag(&field, &type)) return Parse::kCorrupt;
    if (field == 1 && type == kLengthDelimited) {
      absl::string_view packed_bytes;
      if (!list.LengthDelimited(&packed_bytes)) return Parse::kCorrupt;
      WireReader packed(packed_bytes, readable_end);
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
  ScanExample(serialized, [&](absl::string_view key, absl::string_view) {
    keys.emplace_back(key);
    return Parse::kOk;
  });
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (keys.empty()) return "no features";
  constexpr size_t kMaxListed = 50;
  const size_t more = keys.size() > kMaxListed ? keys.size() - kMaxListed : 0;
  keys.resize(keys.size() - more);
  return absl::StrCat(absl::StrJoin(keys, ", "),
                      more > 0 ? absl::StrCat(" and ", more, " more") : std::string());
}

// What a lookup reads of a feature key: a few loads, no loop over its bytes.
// Keys of up to 16 bytes are read whole (first and last 8, 4 or 1 bytes,
// overlapping), so equal words mean equal keys; longer ones are compared too.
struct KeyWords {
  uint64_t head = 0;
  uint64_t tail = 0;
  uint64_t size = 0;
};
constexpr size_t kWholeKeyBytes = 16;

ABSL_ATTRIBUTE_ALWAYS_INLINE KeyWords LoadKey(absl::string_view key) {
  const char* p = key.data();
  const size_t n = key.size();
  KeyWords words;
  words.size = n;
  if (n >= 8) {
    std::memcpy(&words.head, p, 8);
    std::memcpy(&words.tail, p + n - 8, 8);
  } else if (n >= 4) {
    uint32_t head, tail;
    std::memcpy(&head, p, 4);
    std::memcpy(&tail, p + n - 4, 4);
    words.head = head;
    words.tail = tail;
  } else if (n > 0) {
    words.head = static_cast<uint8_t>(p[0]) | static_cast<uint64_t>(static_cast<uint8_t>(p[n / 2]))
                                                  << 8;
    words.tail = static_cast<uint8_t>(p[n - 1]);
  }
  return words;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE uint64_t HashKey(const KeyWords& words) {
  const unsigned __int128 product =
      static_cast<unsigned __int128>(words.head ^ 0x9e3779b97f4a7c15u) *
      (words.tail ^ (words.size * 0xbf58476d1ce4e5b9u));
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

// A feature asked for, as found in the record being decoded.
struct FoundFeature {
  bool present = false;
  uint32_t kind = 0;       // As ReadFeature says.
  absl::string_view list;  // The list message.
};

}  // namespace

absl::StatusOr<InputDecoder> InputDecoder::Create(std::vector<InputFormat> inputs,
                                                  std::string label_key) {
  if (inputs.empty()) return absl::InvalidArgumentError("no inputs to decode");
  if (label_key.empty()) return absl::InvalidArgumentError("the label feature key is empty");
  InputDecoder decoder;
  auto slot = [&decoder](const std::string& key) {
    auto it = std::find(decoder.keys_.begin(), decoder.keys_.end(), key);
    if (it != decoder.keys_.end()) return static_cast<int>(it - decoder.keys_.begin());
    decoder.keys_.push_back(key);
    return static_cast<int>(decoder.keys_.size()) - 1;
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
  // At most a quarter full: lookups of absent keys end at an empty bucket soon.
  size_t buckets = 16;
  while (buckets < 4 * decoder.keys_.size()) buckets *= 2;
  decoder.buckets_.assign(buckets, Bucket());
  decoder.bucket_mask_ = buckets - 1;
  for (size_t k = 0; k < decoder.keys_.size(); ++k) {
    const KeyWords words = LoadKey(decoder.keys_[k]);
    uint64_t b = HashKey(words) & decoder.bucket_mask_;
    while (decoder.buckets_[b].slot >= 0) b = (b + 1) & decoder.bucket_mask_;
    decoder.buckets_[b] = Bucket{words.head, words.tail, words.size, static_cast<int>(k)};
  }
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
  // On the stack for up to 64 features: nothing allocated per record.
  absl::InlinedVector<FoundFeature, 64> found(keys_.size());
  Parse parse = ScanExample(
      serialized, [&](absl::string_view key, absl::string_view value) ABSL_ATTRIBUTE_ALWAYS_INLINE {
        // The key's slot, by open addressing (inlined: a member function of a
        // shared library's class is called through the PLT).
        const KeyWords words = LoadKey(key);
        int slot;
        for (uint64_t b = HashKey(words) & bucket_mask_;; b = (b + 1) & bucket_mask_) {
          const Bucket& bucket = buckets_[b];
          slot = bucket.slot;
          if (slot < 0) return Parse::kOk;  // Not asked for.
          if (bucket.head == words.head && bucket.tail == words.tail && bucket.size == words.size &&
              (words.size <= kWholeKeyBytes || keys_[slot] == key)) {
            break;
          }
        }
        FoundFeature& feature = found[slot];
        feature.present = true;
        return ReadFeature(value, &feature.kind, &feature.list);
      });
  if (parse == Parse::kUnusual) {
    *unusual = true;
    return absl::OkStatus();
  }
  if (parse != Parse::kOk) return NotAnExample(serialized);

  const char* record_end = serialized.data() + serialized.size();
  out->values.resize(dense_values_);
  out->ids.clear();
  out->id_ends.resize(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputFormat& input = inputs_[i];
    const std::vector<int>& slots = input_slots_[i];
    if (input.sparse) {
      const FoundFeature& feature = found[slots[0]];
      if (feature.kind == kInt64ListField) {
        std::vector<int64_t>& ids = out->ids;
        const int64_t max_ids = input.max_ids;
        int64_t count = 0;
        parse = ForEachInt64(feature.list, record_end, [&](int64_t id) {
          if (count++ < max_ids) ids.push_back(id);
        });
        if (parse != Parse::kOk) return NotAnExample(serialized);
        if (count > max_ids) {
          return absl::InvalidArgumentError(
              absl::StrCat("input \"", input.name, "\": feature \"", keys_[slots[0]], "\" has ",
                           count, " ids; at most ", max_ids, " (max_ids) are allowed"));
        }
      } else if (feature.kind != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input \"", input.name, "\": feature \"", keys_[slots[0]], "\" is ",
                         KindName(feature.kind), "; expected an int64_list of ids"));
      }
      // Absent, or a Feature without a list: no ids.
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
      const FoundFeature& feature = found[slot];
      if (!feature.present) {
        return absl::InvalidArgumentError(
            absl::StrCat("input \"", input.name, "\": the example has no feature \"", keys_[slot],
                         "\"; it has: ", FeatureKeys(serialized)));
      }
      if (feature.kind == kFloatListField) {
        parse = ForEachFloat(feature.list, emit);
      } else if (feature.kind == kInt64ListField) {
        parse = ForEachInt64(feature.list, record_end,
                             [&](int64_t value) { emit(static_cast<float>(value)); });
      } else if (feature.kind != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input \"", input.name, "\": feature \"", keys_[slot], "\" is ",
                         KindName(feature.kind), "; expected a float_list or an int64_list"));
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

  const FoundFeature& label_feature = found[label_slot_];
  if (!label_feature.present) {
    return absl::InvalidArgumentError(absl::StrCat("the example has no label feature \"",
                                                   label_key_,
                                                   "\"; it has: ", FeatureKeys(serialized)));
  }
  if (label_feature.kind != kInt64ListField) {
    return absl::InvalidArgumentError(absl::StrCat("label feature \"", label_key_, "\" is ",
                                                   KindName(label_feature.kind),
                                                   "; expected an int64_list of 1 value"));
  }
  int64_t label = 0;
  int64_t labels = 0;
  parse = ForEachInt64(label_feature.list, record_end, [&](int64_t value) {
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
