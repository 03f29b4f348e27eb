#include "common/safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/safetensors_test_", name);
}

std::string Header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(SafetensorsTest, WritesWhatItReadsBack) {
  const std::vector<float> w = {1.f, -2.f, 3.5f, 0.f, 7.f, 8.f};
  const std::vector<int64_t> steps = {42};
  const std::vector<uint8_t> empty;
  const std::string path = TempPath("round_trip");
  auto written = WriteSafetensors(path,
                                  {{"fc1.weight", TensorDtype::kF32, {2, 3}, w.data()},
                                   {"step", TensorDtype::kI64, {}, steps.data()},
                                   {"nothing", TensorDtype::kU8, {0}, empty.data()}},
                                  {{"format", "pt"}, {"quote\"and\\slash", "line\nbreak"}});
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string bytes = ReadFileToString(path).value();
  EXPECT_EQ(written->bytes, bytes.size());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("quote\"and\\slash"), "line\nbreak");
  ASSERT_EQ(file->tensors().size(), 3u);
  SafetensorsFile::Tensor fc1 = file->Get("fc1.weight").value();
  EXPECT_EQ(fc1.shape, (std::vector<int64_t>{2, 3}));
  const float* values = file->Floats("fc1.weight", 6).value();
  EXPECT_EQ(std::vector<float>(values, values + 6), w);
  SafetensorsFile::Tensor step = file->Get("step").value();
  EXPECT_EQ(step.dtype, TensorDtype::kI64);
  EXPECT_TRUE(step.shape.empty());
  int64_t s = 0;
  std::memcpy(&s, step.data.data(), 8);
  EXPECT_EQ(s, 42);
  // The data start 8-byte aligned.
  EXPECT_EQ((8 + (bytes[0] & 0xff) + 256 * (bytes[1] & 0xff)) % 8, 0);

  EXPECT_EQ(file->Get("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(file->Floats("step", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file->Floats("fc1.weight", 5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, SerializedBytesEqualTheFile) {
  const std::vector<float> w = {1.f, 2.f};
  const std::string path = TempPath("serialized");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", TensorDtype::kF32, {2}, w.data()}}, {{"k", "v"}}).ok());
  auto bytes = SerializeSafetensors({{"w", TensorDtype::kF32, {2}, w.data()}}, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, ReadFileToString(path).value());
  auto parsed = SafetensorsFile::Parse(*bytes, "in memory");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Floats("w", 2).value()[1], 2.f);
}

TEST(SafetensorsTest, RefusesBadNames) {
  const float x = 1.f;
  EXPECT_EQ(
      WriteSafetensors(TempPath("dup"),
                       {{"a", TensorDtype::kF32, {1}, &x}, {"a", TensorDtype::kF32, {1}, &x}}, {})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      WriteSafetensors(TempPath("reserved"), {{"__metadata__", TensorDtype::kF32, {1}, &x}}, {})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, DamagedFilesAreDataLossNamingTheFileAndTheDamage) {
  const std::string data(8, '\0');
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_TRUE(SafetensorsFile::Parse(Header(good, data), "good").ok());
  struct Case {
    std::string bytes;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"short", "shorter than its 8-byte header length"},
      {Header(good, data).substr(0, 20), "does not fit"},
      {Header(good, data + "x"), "1 bytes after the last tensor"},
      {Header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
       "8 bytes for its shape's 3"},
      {Header(R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype"},
      {Header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "gap"},
      {Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data),
       "outside the file"},
      {Header(R"({"a":{"dtype":"F32","shape":[2]}})", data), "lacks dtype, shape or data_offsets"},
      {Header(R"({"a":)", data), "unexpected end"},
      {Header(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", data),
       "expected an integer"},
  };
  for (const Case& c : cases) {
    auto parsed = SafetensorsFile::Parse(c.bytes, "f.safetensors");
    ASSERT_FALSE(parsed.ok()) << c.says;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << c.says;
    EXPECT_THAT(parsed.status().message(), HasSubstr("safetensors file f.safetensors is damaged"));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.says));
  }
}

}  // namespace
}  // namespace downpour
