// InputDecoder (data/example.h): named dense and sparse inputs, checked
// against the click-log generator's own examples and against a decoder built
// on protobuf's parser (the reference for every unusual or damaged record).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "data/ctr_generator.h"
#include "data/example.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"

namespace downpour {
namespace data {
namespace {

using testing::CtrInputFormats;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::unique_ptr<CtrGenerator> MakeGenerator() {
  absl::StatusOr<std::unique_ptr<CtrGenerator>> generator = CtrGenerator::Create(CtrOptions());
  EXPECT_TRUE(generator.ok()) << generator.status();
  return generator.ok() ? *std::move(generator) : nullptr;
}

// The record's bytes, for a failure's trace.
std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) absl::StrAppend(&out, absl::Hex(c, absl::kZeroPad2));
  return out;
}

InputDecoder MakeDecoder(const std::vector<InputFormat>& inputs,
                         const std::string& label = "label") {
  absl::StatusOr<InputDecoder> decoder = InputDecoder::Create(inputs, label);
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  return *std::move(decoder);
}

// The same decoding through protobuf's parser and Map: what the wire parser
// must agree with.
absl::Status ReferenceDecode(const std::string& serialized, const std::vector<InputFormat>& inputs,
                             const std::string& label_key, DecodedInputs* out) {
  tensorflow::Example example;
  if (!example.ParseFromString(serialized)) return absl::DataLossError("not an Example");
  const auto& map = example.features().feature();
  out->values.clear();
  out->ids.clear();
  out->id_ends.clear();
  for (const InputFormat& input : inputs) {
    if (input.sparse) {
      auto it = map.find(input.features[0]);
      if (it != map.end()) {
        if (it->second.has_int64_list()) {
          const auto& ids = it->second.int64_list().value();
          if (ids.size() > input.max_ids) return absl::InvalidArgumentError("too many ids");
          out->ids.insert(out->ids.end(), ids.begin(), ids.end());
        } else if (it->second.kind_case() != tensorflow::Feature::KIND_NOT_SET) {
          return absl::InvalidArgumentError("sparse kind");
        }
      }
    } else {
      const size_t begin = out->values.size();
      for (const std::string& key : input.features) {
        auto it = map.find(key);
        if (it == map.end()) return absl::InvalidArgumentError("missing");
        if (it->second.has_float_list()) {
          for (float v : it->second.float_list().value()) out->values.push_back(v);
        } else if (it->second.has_int64_list()) {
          for (int64_t v : it->second.int64_list().value()) {
            out->values.push_back(static_cast<float>(v));
          }
        } else if (it->second.has_bytes_list()) {
          return absl::InvalidArgumentError("dense kind");
        }
      }
      if (static_cast<int64_t>(out->values.size() - begin) != input.size) {
        return absl::InvalidArgumentError("dense size");
      }
    }
    out->id_ends.push_back(static_cast<int64_t>(out->ids.size()));
  }
  auto it = map.find(label_key);
  if (it == map.end() || !it->second.has_int64_list() ||
      it->second.int64_list().value_size() != 1) {
    return absl::InvalidArgumentError("label");
  }
  const int64_t label = it->second.int64_list().value(0);
  if (label != static_cast<int32_t>(label)) return absl::InvalidArgumentError("label range");
  out->label = static_cast<int32_t>(label);
  return absl::OkStatus();
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), 4 * values.size());
  return bits;
}

// Where protobuf reads the record, the wire parser gives the same result;
// where it does not, the wire parser may still succeed (it does not examine
// features no input names) but must not crash. Returns whether protobuf read it.
bool ExpectSameAsReference(const std::string& record, const InputDecoder& decoder) {
  DecodedInputs fast, reference;
  const absl::Status fast_status = decoder.Decode(record, &fast);
  const absl::Status reference_status =
      ReferenceDecode(record, decoder.inputs(), decoder.label_key(), &reference);
  if (absl::IsDataLoss(reference_status)) {
    if (!fast_status.ok()) {
      EXPECT_TRUE(absl::IsDataLoss(fast_status) || absl::IsInvalidArgument(fast_status))
          << fast_status;
      EXPECT_FALSE(fast_status.message().empty());
    }
    return false;
  }
  EXPECT_EQ(fast_status.code(), reference_status.code())
      << "wire parser: " << fast_status << "; protobuf: " << reference_status;
  if (fast_status.ok() && reference_status.ok()) {
    EXPECT_EQ(Bits(fast.values), Bits(reference.values));  // NaNs too.
    EXPECT_EQ(fast.ids, reference.ids);
    EXPECT_EQ(fast.id_ends, reference.id_ends);
    EXPECT_EQ(fast.label, reference.label);
  }
  return true;
}

// ------------------------------------------------ hand-written wire format

std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}
std::string Tag(uint32_t field, uint32_t wire_type) { return Varint(field << 3 | wire_type); }
std::string Bytes(uint32_t field, const std::string& bytes) {
  return Tag(field, 2) + Varint(bytes.size()) + bytes;
}
std::string Fixed32(uint32_t field, float value) {
  std::string out = Tag(field, 5);
  out.append(reinterpret_cast<const char*>(&value), 4);
  return out;
}
std::string PackedInt64s(const std::vector<int64_t>& values) {
  std::string packed;
  for (int64_t v : values) packed += Varint(static_cast<uint64_t>(v));
  return Bytes(1, packed);
}
std::string PackedFloats(const std::vector<float>& values) {
  return Bytes(1, std::string(reinterpret_cast<const char*>(values.data()), 4 * values.size()));
}
// Feature messages.
std::string Int64Feature(const std::string& list) { return Bytes(3, list); }
std::string FloatFeature(const std::string& list) { return Bytes(2, list); }
std::string BytesFeature(const std::string& value) { return Bytes(1, Bytes(1, value)); }
// A Features map entry.
std::string Entry(const std::string& key, const std::string& feature) {
  return Bytes(1, Bytes(1, key) + Bytes(2, feature));
}
// An Example of one Features message.
std::string ExampleOf(const std::string& entries) { return Bytes(1, entries); }

// Inputs of the small hand-written records: sparse "s", dense "d" of
// features "a" (2 values) and "b" (1), label "y".
std::vector<InputFormat> SmallInputs() {
  InputFormat sparse;
  sparse.name = "s";
  sparse.sparse = true;
  sparse.features = {"s"};
  sparse.max_ids = 4;
  InputFormat dense;
  dense.name = "d";
  dense.features = {"a", "b"};
  dense.size = 3;
  return {sparse, dense};
}

std::string SmallRecord() {
  return ExampleOf(Entry("s", Int64Feature(PackedInt64s({7, -1}))) +
                   Entry("a", FloatFeature(PackedFloats({0.5f, 1.5f}))) +
                   Entry("b", Int64Feature(PackedInt64s({3}))) +
                   Entry("y", Int64Feature(PackedInt64s({1}))));
}

// Valid records laid out as protobuf allows but rarely writes.
std::vector<std::string> UnusualRecords() {
  const std::string y = Entry("y", Int64Feature(PackedInt64s({1})));
  const std::string a = Entry("a", FloatFeature(PackedFloats({0.5f, 1.5f})));
  const std::string b = Entry("b", Int64Feature(PackedInt64s({3})));
  const std::string s = Entry("s", Int64Feature(PackedInt64s({7, -1})));
  const std::string unknown = Tag(9, 0) + Varint(300) + Tag(10, 1) + std::string(8, 'x') +
                              Tag(11, 5) + "abcd" + Bytes(12, "junk") + Tag(13, 3) + Tag(14, 3) +
                              Tag(15, 0) + Varint(1) + Tag(14, 4) + Tag(13, 4);
  std::vector<std::string> records;
  // Unpacked values; a packed list in two chunks and an unpacked value.
  records.push_back(ExampleOf(
      Entry("s", Int64Feature(Tag(1, 0) + Varint(7) + Tag(1, 0) + Varint(uint64_t{0} - 1))) +
      Entry("a", FloatFeature(Fixed32(1, 0.5f) + Fixed32(1, 1.5f))) + b + y));
  records.push_back(ExampleOf(
      Entry("s", Int64Feature(PackedInt64s({7}) + PackedInt64s({8}) + Tag(1, 0) + Varint(9))) +
      Entry("a", FloatFeature(PackedFloats({0.5f}) + Fixed32(1, 1.5f))) + b + y));
  // A key given twice: the last entry wins.
  records.push_back(ExampleOf(Entry("s", Int64Feature(PackedInt64s({1, 2, 3, 4, 5}))) + s + a + b +
                              Entry("y", BytesFeature("no")) + y));
  // Example.features given twice: merged.
  records.push_back(ExampleOf(s + a) + ExampleOf(b + y));
  // An entry's value before its key; an entry whose key is given twice.
  records.push_back(ExampleOf(Bytes(1, Bytes(2, Int64Feature(PackedInt64s({4}))) + Bytes(1, "s")) +
                              Bytes(1, Bytes(1, "zz") + Bytes(1, "a") +
                                           Bytes(2, FloatFeature(PackedFloats({0.5f, 1.5f})))) +
                              b + y));
  // An entry with two values, merged into one Feature (concatenated lists).
  const std::string two_values = Bytes(1, "s") + Bytes(2, Int64Feature(PackedInt64s({1}))) +
                                 Bytes(2, Int64Feature(PackedInt64s({2, 3})));
  records.push_back(ExampleOf(Bytes(1, two_values) + a + b + y));
  // A Feature with two lists: the last one wins.
  records.push_back(ExampleOf(
      s + Entry("a", FloatFeature(PackedFloats({9.0f})) + Int64Feature(PackedInt64s({4, 5}))) + b +
      y));
  // Unknown fields and groups at every level.
  const std::string list = unknown + PackedInt64s({5}) + unknown;
  const std::string feature = unknown + Bytes(3, list) + unknown;
  const std::string entry = unknown + Bytes(1, "s") + unknown + Bytes(2, feature) + unknown;
  records.push_back(unknown + ExampleOf(unknown + Bytes(1, entry) + a + b + unknown + y) + unknown);
  // An entry without a value (an empty Feature: no ids, no values), one
  // without a key, and a Feature with no list.
  records.push_back(ExampleOf(Bytes(1, Bytes(1, "s")) + Bytes(1, Bytes(2, BytesFeature("x"))) +
                              Entry("a", FloatFeature(PackedFloats({1, 2, 3}))) + Entry("b", "") +
                              y));
  return records;
}

// ------------------------------------------------------------------- tests

TEST(InputDecoderTest, CtrRecordsDecodeAsGenerated) {
  std::unique_ptr<CtrGenerator> generator = MakeGenerator();
  ASSERT_NE(generator, nullptr);
  const std::vector<InputFormat> inputs = CtrInputFormats();
  const InputDecoder decoder = MakeDecoder(inputs);
  EXPECT_EQ(decoder.dense_values(), 13);
  constexpr int kExamples = 300;
  std::vector<CtrExample> drawn(kExamples);
  std::vector<DecodedInputs> decoded(kExamples);
  std::vector<InputBatch> appended;
  for (int e = 0; e < kExamples; ++e) {
    generator->Generate(CtrSplit::kTrain, e, &drawn[e]);
    const std::string record = generator->Encode(drawn[e]);
    ASSERT_TRUE(decoder.Decode(record, &decoded[e]).ok());
    decoder.AppendExample(decoded[e], &appended);
    int32_t label = -1;
    std::vector<InputBatch> one;
    ASSERT_TRUE(DecodeInputs(record, inputs, "label", 0, &one, &label).ok());
    EXPECT_EQ(label, drawn[e].label);
    ASSERT_EQ(one.size(), inputs.size());
    EXPECT_THAT(one[26].values, ElementsAreArray(drawn[e].dense));
    ExpectSameAsReference(record, decoder);
  }
  // Placed in reverse order, as decode threads might: the same batch.
  std::vector<InputBatch> batch;
  decoder.LayOutBatch(decoded.data(), kExamples, &batch);
  for (int e = kExamples - 1; e >= 0; --e) decoder.PlaceExample(decoded[e], e, &batch);

  for (const std::vector<InputBatch>* b : {&batch, &appended}) {
    ASSERT_EQ(b->size(), 27u);
    for (int f = 0; f < 26; ++f) {
      const InputBatch& input = (*b)[f];
      EXPECT_TRUE(input.values.empty());
      ASSERT_EQ(input.offsets.size(), kExamples + 1u);
      EXPECT_EQ(input.offsets[0], 0);
      for (int e = 0; e < kExamples; ++e) {
        const std::vector<int64_t> want(drawn[e].ids.begin() + drawn[e].id_offsets[f],
                                        drawn[e].ids.begin() + drawn[e].id_offsets[f + 1]);
        const std::vector<int64_t> got(input.ids.begin() + input.offsets[e],
                                       input.ids.begin() + input.offsets[e + 1]);
        EXPECT_EQ(got, want) << "C" << f + 1 << " of example " << e;
      }
      EXPECT_EQ(input.offsets[kExamples], static_cast<int64_t>(input.ids.size()));
    }
    const InputBatch& dense = (*b)[26];
    ASSERT_EQ(dense.values.size(), 13u * kExamples);
    EXPECT_TRUE(dense.ids.empty() && dense.offsets.empty());
    for (int e = 0; e < kExamples; ++e) {
      for (int j = 0; j < 13; ++j) EXPECT_EQ(dense.values[e * 13 + j], drawn[e].dense[j]);
    }
  }
  for (int e = 0; e < kExamples; ++e) EXPECT_EQ(decoded[e].label, drawn[e].label);
}

TEST(InputDecoderTest, IdsAbove2To53SurviveExactly) {
  const std::vector<int64_t> ids = {(int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min(), -1,
                                    (int64_t{1} << 62) + 3};
  tensorflow::Example example;
  auto& map = *example.mutable_features()->mutable_feature();
  for (int64_t id : ids) map["s"].mutable_int64_list()->add_value(id);
  for (float v : {1.f, 2.f}) map["a"].mutable_float_list()->add_value(v);
  map["b"].mutable_int64_list()->add_value(int64_t{1} << 24);
  map["y"].mutable_int64_list()->add_value(-3);
  std::vector<InputFormat> inputs = SmallInputs();
  inputs[0].max_ids = 5;
  std::vector<InputBatch> out;
  int32_t label = 0;
  ASSERT_TRUE(DecodeInputs(example.SerializeAsString(), inputs, "y", 0, &out, &label).ok());
  EXPECT_THAT(out[0].ids, ElementsAreArray(ids));
  EXPECT_THAT(out[0].offsets, ElementsAre(0, 5));
  EXPECT_THAT(out[1].values, ElementsAre(1.f, 2.f, 16777216.f));  // int64 -> float.
  EXPECT_EQ(label, -3);
}

TEST(InputDecoderTest, EmptyOrMissingSparseFeatureIsZeroIds) {
  const std::string a = Entry("a", FloatFeature(PackedFloats({1, 2}))) +
                        Entry("b", FloatFeature(PackedFloats({3}))) +
                        Entry("y", Int64Feature(PackedInt64s({0})));
  const InputDecoder decoder = MakeDecoder(SmallInputs(), "y");
  for (const std::string& record :
       {ExampleOf(a), ExampleOf(Entry("s", Int64Feature("")) + a),
        ExampleOf(Entry("s", Int64Feature(PackedInt64s({}))) + a), ExampleOf(Entry("s", "") + a)}) {
    std::vector<InputBatch> out;
    int32_t label = -1;
    ASSERT_TRUE(DecodeInputs(SmallRecord(), SmallInputs(), "y", 0, &out, &label).ok());
    const absl::Status s = DecodeInputs(record, SmallInputs(), "y", 1, &out, &label);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_THAT(out[0].ids, ElementsAre(7, -1));
    EXPECT_THAT(out[0].offsets, ElementsAre(0, 2, 2));
    EXPECT_THAT(out[1].values, ElementsAre(0.5f, 1.5f, 3.f, 1.f, 2.f, 3.f));
    EXPECT_TRUE(ExpectSameAsReference(record, decoder));
  }
}

TEST(InputDecoderTest, UnusualLayoutsDecodeAsProtobufReadsThem) {
  const InputDecoder decoder = MakeDecoder(SmallInputs(), "y");
  for (const std::string& record : UnusualRecords()) {
    SCOPED_TRACE(Hex(record));
    DecodedInputs out;
    const absl::Status s = decoder.Decode(record, &out);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(ExpectSameAsReference(record, decoder));
  }
}

class InputErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    generator_ = MakeGenerator();
    ASSERT_NE(generator_, nullptr);
    CtrExample drawn;
    generator_->Generate(CtrSplit::kTrain, 5, &drawn);
    ASSERT_TRUE(valid_.ParseFromString(generator_->Encode(drawn)));
  }
  absl::Status Decode(const tensorflow::Example& example) {
    DecodedInputs out;
    return MakeDecoder(CtrInputFormats()).Decode(example.SerializeAsString(), &out);
  }
  tensorflow::Feature& Feature(tensorflow::Example* example, const std::string& key) {
    return (*example->mutable_features()->mutable_feature())[key];
  }
  void ExpectError(const tensorflow::Example& example, const std::vector<std::string>& parts) {
    const absl::Status s = Decode(example);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (const std::string& part : parts) EXPECT_THAT(s.message(), HasSubstr(part));
    EXPECT_TRUE(ExpectSameAsReference(example.SerializeAsString(), MakeDecoder(CtrInputFormats())));
  }

  std::unique_ptr<CtrGenerator> generator_;
  tensorflow::Example valid_;
};

TEST_F(InputErrorTest, ValidBaseline) { EXPECT_TRUE(Decode(valid_).ok()); }

TEST_F(InputErrorTest, MissingDenseFeature) {
  tensorflow::Example e = valid_;
  e.mutable_features()->mutable_feature()->erase("I3");
  ExpectError(e, {"input \"dense\"", "no feature \"I3\"", "it has: C1, C10"});
}

TEST_F(InputErrorTest, DenseFeatureOfWrongKind) {
  tensorflow::Example e = valid_;
  Feature(&e, "I3").mutable_bytes_list()->add_value("x");
  ExpectError(e, {"input \"dense\": feature \"I3\" is a bytes_list"});
}

TEST_F(InputErrorTest, DenseTotalOtherThanSize) {
  tensorflow::Example e = valid_;
  Feature(&e, "I3").mutable_float_list()->add_value(2.0f);
  ExpectError(e, {"input \"dense\"", "\"I1\", \"I2\"", "hold 14 values; expected 13"});
  e = valid_;
  Feature(&e, "I3").mutable_float_list()->clear_value();
  ExpectError(e, {"hold 12 values; expected 13"});
}

TEST_F(InputErrorTest, SparseFeatureOfWrongKind) {
  tensorflow::Example e = valid_;
  Feature(&e, "C7").mutable_float_list()->add_value(1.0f);
  ExpectError(e, {"input \"C7\": feature \"C7\" is a float_list; expected an int64_list of ids"});
  Feature(&e, "C7").mutable_bytes_list()->add_value("id");
  ExpectError(e, {"feature \"C7\" is a bytes_list"});
}

TEST_F(InputErrorTest, MoreThanMaxIds) {
  tensorflow::Example e = valid_;
  auto* ids = Feature(&e, "C2").mutable_int64_list();
  ids->Clear();
  for (int64_t id : {1, 2, 3, 4}) ids->add_value(id);
  ExpectError(e, {"input \"C2\": feature \"C2\" has 4 ids; at most 3 (max_ids)"});
}

TEST_F(InputErrorTest, BadLabels) {
  tensorflow::Example e = valid_;
  e.mutable_features()->mutable_feature()->erase("label");
  ExpectError(e, {"no label feature \"label\""});
  e = valid_;
  Feature(&e, "label").mutable_float_list()->add_value(1);
  ExpectError(e, {"label feature \"label\" is a float_list"});
  e = valid_;
  Feature(&e, "label").mutable_int64_list()->add_value(1);
  ExpectError(e, {"label feature \"label\" has 2 values; expected 1"});
  e = valid_;
  Feature(&e, "label").mutable_int64_list()->set_value(0, int64_t{1} << 40);
  ExpectError(e, {"value 1099511627776 does not fit int32"});
  e = valid_;
  Feature(&e, "label").mutable_int64_list()->set_value(0, std::numeric_limits<int32_t>::min());
  EXPECT_TRUE(Decode(e).ok());
}

TEST(InputDecoderTest, BadFormatsNameTheInput) {
  auto error = [](std::vector<InputFormat> inputs, const std::string& label = "y") {
    absl::StatusOr<InputDecoder> d = InputDecoder::Create(std::move(inputs), label);
    return d.ok() ? std::string("OK") : std::string(d.status().message());
  };
  EXPECT_EQ(error(SmallInputs()), "OK");
  EXPECT_THAT(error({}), HasSubstr("no inputs"));
  EXPECT_THAT(error(SmallInputs(), ""), HasSubstr("label feature key is empty"));
  std::vector<InputFormat> in = SmallInputs();
  in[1].name = "s";
  EXPECT_THAT(error(in), HasSubstr("two inputs are named \"s\""));
  in = SmallInputs();
  in[0].features.push_back("t");
  EXPECT_THAT(error(in), HasSubstr("sparse input \"s\" must read exactly 1 feature; it has 2"));
  in = SmallInputs();
  in[0].max_ids = 0;
  EXPECT_THAT(error(in), HasSubstr("sparse input \"s\" needs max_ids > 0"));
  in = SmallInputs();
  in[0].size = 4;
  EXPECT_THAT(error(in), HasSubstr("sparse input \"s\" has size 4"));
  in = SmallInputs();
  in[1].size = 0;
  EXPECT_THAT(error(in), HasSubstr("dense input \"d\" needs a size"));
  in = SmallInputs();
  in[1].features.clear();
  EXPECT_THAT(error(in), HasSubstr("dense input \"d\" reads no features"));
  in = SmallInputs();
  in[1].max_ids = 2;
  EXPECT_THAT(error(in), HasSubstr("only sparse inputs hold ids"));
  in = SmallInputs();
  in[1].features[1] = "";
  EXPECT_THAT(error(in), HasSubstr("empty feature key"));
  in = SmallInputs();
  in[0].name = "";
  EXPECT_THAT(error(in), HasSubstr("input 0 has no name"));
}

TEST(InputDecoderTest, DecodeInputsChecksTheIndex) {
  std::vector<InputBatch> out;
  int32_t label = 0;
  EXPECT_THAT(DecodeInputs(SmallRecord(), SmallInputs(), "y", 1, &out, &label).message(),
              HasSubstr("example 1 cannot follow the 0 examples"));
  ASSERT_TRUE(DecodeInputs(SmallRecord(), SmallInputs(), "y", 0, &out, &label).ok());
  EXPECT_FALSE(DecodeInputs(SmallRecord(), SmallInputs(), "y", 0, &out, &label).ok());
  // A failed decode leaves the batch as it was.
  EXPECT_FALSE(DecodeInputs("garbage", SmallInputs(), "y", 1, &out, &label).ok());
  EXPECT_THAT(out[0].offsets, ElementsAre(0, 2));
  EXPECT_EQ(out[1].values.size(), 3u);
}

TEST(InputDecoderTest, TruncatedRecordsAreErrors) {
  std::unique_ptr<CtrGenerator> generator = MakeGenerator();
  ASSERT_NE(generator, nullptr);
  CtrExample drawn;
  generator->Generate(CtrSplit::kTest, 1, &drawn);
  const std::string record = generator->Encode(drawn);
  const InputDecoder decoder = MakeDecoder(CtrInputFormats());
  DecodedInputs out;
  EXPECT_TRUE(decoder.Decode(record, &out).ok());
  for (size_t n = 0; n < record.size(); ++n) {
    const absl::Status s = decoder.Decode(absl::string_view(record.data(), n), &out);
    EXPECT_TRUE(n == 0 ? absl::IsInvalidArgument(s) : absl::IsDataLoss(s)) << n << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(n == 0 ? "no feature \"I1\"" : "not a valid"));
  }
  for (const std::string& garbage :
       {std::string("\xff\xff\xff\xff"), std::string("\x0a\x05\x0a\x03\x0a\x01"),
        std::string(11, '\x80'), std::string("\x0b"), std::string("\x0c"), std::string("\x07"),
        std::string("\x0b\x14"), std::string("\x0a\xff\xff\xff\xff\x0f"),
        std::string("\x1b\x23\x1c\x24"), std::string(1, '\0')}) {
    const absl::Status s = decoder.Decode(garbage, &out);
    EXPECT_TRUE(absl::IsDataLoss(s)) << Hex(garbage) << ": " << s;
  }
  // Damage in a feature that is read: a packed float_list of 5 bytes.
  const std::string bad_float =
      ExampleOf(Entry("s", "") + Entry("a", FloatFeature(Bytes(1, "abcde"))) +
                Entry("b", FloatFeature(PackedFloats({1}))) + Entry("y", ""));
  EXPECT_TRUE(absl::IsDataLoss(MakeDecoder(SmallInputs(), "y").Decode(bad_float, &out)));
}

// Random damage to valid records (bytes flipped, inserted, removed, copied):
// never a crash, and wherever protobuf still reads the record, the same result.
TEST(InputDecoderTest, DamagedRecordsDecodeAsProtobufReadsThemOrFail) {
  std::unique_ptr<CtrGenerator> generator = MakeGenerator();
  ASSERT_NE(generator, nullptr);
  const InputDecoder ctr = MakeDecoder(CtrInputFormats());
  const InputDecoder small = MakeDecoder(SmallInputs(), "y");
  std::vector<std::pair<std::string, const InputDecoder*>> seeds;
  CtrExample drawn;
  for (int e = 0; e < 8; ++e) {
    generator->Generate(CtrSplit::kTrain, e, &drawn);
    seeds.emplace_back(generator->Encode(drawn), &ctr);
  }
  seeds.emplace_back(SmallRecord(), &small);
  for (const std::string& record : UnusualRecords()) seeds.emplace_back(record, &small);

  // Protobuf logs each invalid UTF-8 key it meets; a thousand lines say nothing.
  google::protobuf::LogHandler* log_handler = google::protobuf::SetLogHandler(nullptr);
  std::mt19937_64 rng(13);
  int read_by_protobuf = 0;
  constexpr int kTrials = 20000;
  for (int trial = 0; trial < kTrials; ++trial) {
    const auto& [seed, decoder] = seeds[rng() % seeds.size()];
    std::string record = seed;
    for (int m = 1 + rng() % 3; m > 0 && !record.empty(); --m) {
      const size_t at = rng() % record.size();
      switch (rng() % 5) {
        case 0:
          record[at] = static_cast<char>(rng());
          break;
        case 1:
          record[at] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 2:
          record.insert(at, 1, static_cast<char>(rng()));
          break;
        case 3:
          record.erase(at, 1 + rng() % 4);
          break;
        default:
          record.insert(at, record.substr(rng() % record.size(), 1 + rng() % 16));
          break;
      }
    }
    SCOPED_TRACE(Hex(record));
    if (ExpectSameAsReference(record, *decoder)) ++read_by_protobuf;
    if (::testing::Test::HasFailure()) break;
  }
  google::protobuf::SetLogHandler(log_handler);
  std::printf("%d of %d damaged records still parse as an Example\n", read_by_protobuf, kTrials);
  EXPECT_GT(read_by_protobuf, kTrials / 100);
}

// The figure for the worker's critical path: CTR records (26 id lists, 13
// floats, a label; one step of 4096) decoded on one thread, beside protobuf's
// parser for scale. No time is asserted. The best of 7 rounds is printed:
// the machine may be shared, and interference only ever slows a round down.
class InputDecoderSpeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::unique_ptr<CtrGenerator> generator = MakeGenerator();
    ASSERT_NE(generator, nullptr);
    CtrExample drawn;
    for (int e = 0; e < kRecords; ++e) {
      generator->Generate(CtrSplit::kTrain, e, &drawn);
      records_.push_back(generator->Encode(drawn));
      bytes_ += records_.back().size();
    }
  }
  void Measure(const char* what, const std::function<bool(const std::string&)>& decode) {
    double best = 1e9;
    for (int round = 0; round < 7; ++round) {
      int64_t decoded = 0;
      const absl::Time start = absl::Now();
      absl::Duration elapsed;
      do {
        for (const std::string& record : records_) ASSERT_TRUE(decode(record)) << what;
        decoded += kRecords;
        elapsed = absl::Now() - start;
      } while (elapsed < absl::Milliseconds(100));
      best = std::min(best, absl::ToDoubleSeconds(elapsed) / decoded);
    }
    std::printf("%s: %.0f CTR examples/s on one thread (%.0f ns each, %.0f MB/s; %zu bytes each)\n",
                what, 1 / best, 1e9 * best, bytes_ / kRecords / best / 1e6, bytes_ / kRecords);
  }

  static constexpr int kRecords = 4096;
  std::vector<std::string> records_;
  size_t bytes_ = 0;
  const InputDecoder decoder_ = MakeDecoder(CtrInputFormats());
  DecodedInputs out_;
};

TEST_F(InputDecoderSpeedTest, CtrRecordsOnOneThread) {
  Measure("InputDecoder", [&](const std::string& r) { return decoder_.Decode(r, &out_).ok(); });
}

TEST_F(InputDecoderSpeedTest, ProtobufReferenceOnOneThread) {
  Measure("protobuf parse + Map lookups (reference)", [&](const std::string& r) {
    return ReferenceDecode(r, decoder_.inputs(), "label", &out_).ok();
  });
}

}  // namespace
}  // namespace data
}  // namespace downpour
