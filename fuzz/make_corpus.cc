// Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ of
// the workspace (bazel run sets BUILD_WORKSPACE_DIRECTORY; or pass the
// workspace root as the only argument): small valid inputs from examples/,
// data/testdata/ and messages built here, deterministically, so running it
// again changes nothing. Seeds that fuzzing found (crash inputs kept as
// regressions) live beside them and are left alone.
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/example.h"
#include "data/record_io.h"
#include "fuzz/received_message.h"
#include "google/protobuf/text_format.h"
#include "proto/example.pb.h"
#include "proto/job.pb.h"
#include "proto/parameter_server.pb.h"
#include "spec/onnx_test_graphs.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// `bytes` as one gzip member.
std::string Gzip(const std::string& bytes) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, bytes.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// The records of a record file, through the reader under test.
std::vector<std::string> ReadRecords(const fs::path& path) {
  std::vector<std::string> records;
  auto reader = data::RecordReader::Open(path.string());
  std::string record;
  while (reader.ok()) {
    absl::StatusOr<bool> more = (*reader)->Read(&record);
    if (!more.ok() || !*more) break;
    records.push_back(record);
  }
  return records;
}

// A record file of `records`, written by RecordWriter, as bytes.
std::string RecordFile(const fs::path& scratch, const std::vector<std::string>& records,
                       data::Compression compression) {
  const fs::path path = scratch / "records";
  auto writer = data::RecordWriter::Open(path.string(), compression);
  for (const std::string& r : records) (void)(*writer)->Write(r);
  (void)(*writer)->Close();
  return ReadFile(path);
}

void JobSpecs(const fs::path& root, const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(root / "examples")) {
    if (entry.path().extension() != ".pbtxt") continue;
    const std::string text = ReadFile(entry.path());
    JobSpec spec;
    if (!google::protobuf::TextFormat::ParseFromString(text, &spec)) continue;
    const std::string stem = entry.path().stem().string();
    WriteFile(out / (stem + ".pbtxt"), text);
    WriteFile(out / (stem + ".binpb"), spec.SerializeAsString());
  }
}

void RecordFiles(const fs::path& root, const fs::path& out, const fs::path& scratch) {
  for (const char* name : {"gray_mixed.tfrecord", "rgb_jpeg.tfrecord.gz"}) {
    WriteFile(out / name, ReadFile(root / "data/testdata" / name));
  }
  const std::vector<std::string> records = {"", "a", std::string(40, 'x'), "tensorflow"};
  WriteFile(out / "empty", "");
  WriteFile(out / "one_record", RecordFile(scratch, {"record"}, data::Compression::kNone));
  WriteFile(out / "four_records", RecordFile(scratch, records, data::Compression::kNone));
  WriteFile(out / "four_records.gz", RecordFile(scratch, records, data::Compression::kGzip));
  // Two gzip members, as `cat a.gz b.gz` makes.
  WriteFile(out / "two_members.gz", RecordFile(scratch, {"first"}, data::Compression::kGzip) +
                                        RecordFile(scratch, {"second"}, data::Compression::kGzip));
}

void Examples(const fs::path& root, const fs::path& out) {
  // Two of each TensorFlow-written file: PNG and JPEG, RGB and grayscale.
  for (const char* name : {"gray_mixed.tfrecord", "rgb_jpeg.tfrecord.gz", "rgb_png.tfrecord.gz"}) {
    std::vector<std::string> records = ReadRecords(root / "data/testdata" / name);
    for (size_t i = 0; i < records.size() && i < 2; ++i) {
      WriteFile(out / absl::StrCat(fs::path(name).stem().stem().string(), "_", i), records[i]);
    }
  }
  std::vector<uint8_t> pixels(16);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 17);
  WriteFile(out / "raw_4x4", data::EncodeImageExample(pixels.data(), 16, 3, {4, 4, 1}));
  tensorflow::Example floats;
  auto& features = *floats.mutable_features()->mutable_feature();
  for (int i = 0; i < 16; ++i) features["image"].mutable_float_list()->add_value(i / 16.f);
  features["label"].mutable_int64_list()->add_value(1);
  WriteFile(out / "float_list", floats.SerializeAsString());
}

// An IDX file of unsigned bytes: magic, big-endian dims, the elements.
std::string Idx(const std::vector<uint32_t>& dims, const std::string& elements) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  return out + elements;
}

// The idx_fuzzer's input: options, the image file's length, both files.
std::string IdxInput(uint8_t options, const std::string& images, const std::string& labels) {
  std::string out = {static_cast<char>(options), static_cast<char>(images.size() & 0xff),
                     static_cast<char>(images.size() >> 8)};
  return out + images + labels;
}

void IdxFiles(const fs::path& out) {
  std::string pixels;
  for (int i = 0; i < 3 * 2 * 2; ++i) pixels.push_back(static_cast<char>(i * 20));
  const std::string images = Idx({3, 2, 2}, pixels);
  const std::string labels = Idx({3}, std::string("\x01\x07\x00", 3));
  WriteFile(out / "three_2x2", IdxInput(0, images, labels));
  WriteFile(out / "three_2x2_two_shards_limit_2", IdxInput(1 | (2 << 2), images, labels));
  WriteFile(out / "three_2x2_gzip", IdxInput(2, Gzip(images), Gzip(labels)));
  // One image of 32768 x 32768 declared, 4 bytes of it there (import once
  // allocated the whole GiB before finding the file truncated).
  WriteFile(out / "regression_huge_item",
            IdxInput(0, Idx({1, 32768, 32768}, "\x01\x02\x03\x04"), Idx({1}, "\x01")));
}

PartitionHeader Header(int32_t tensor, int32_t partition, DType dtype, int64_t n) {
  PartitionHeader h;
  h.mutable_key()->set_tensor_id(tensor);
  h.mutable_key()->set_partition(partition);
  h.set_dtype(dtype);
  h.set_num_elements(n);
  return h;
}

// A push of the push_fuzzer's jobs: every partition on its shard 0 with
// `dtype` gradients.
TensorMessage Push(const std::string& job, int rank, int64_t step, DType dtype,
                   bool skipped = false, int64_t checkpoint_step = 0) {
  PushRequest push;
  push.set_job_id(job);
  push.set_worker_rank(rank);
  push.mutable_request_id()->set_worker_id(absl::StrCat("worker-", rank));
  push.mutable_request_id()->set_incarnation(1);
  push.mutable_request_id()->set_sequence(step + 1);
  push.set_step(step);
  push.set_skipped(skipped);
  push.set_checkpoint_step(checkpoint_step);
  push.set_attempt(job == "sync" ? 1 : 0);
  TensorMessage message;
  for (const auto& [tensor, partition, n] : {std::tuple{0, 0, 3}, {0, 1, 3}, {1, 0, 2}}) {
    *push.add_partitions() = Header(tensor, partition, dtype, n);
    if (skipped) continue;
    // Small gradients: 0.5 in float32, bfloat16 and float16 (little endian).
    const std::string one = dtype == FLOAT32    ? std::string("\x00\x00\x00\x3f", 4)
                            : dtype == BFLOAT16 ? std::string("\x00\x3f", 2)
                                                : std::string("\x00\x38", 2);
    std::string bytes;
    for (int i = 0; i < n; ++i) bytes += one;
    auto owner = std::make_shared<std::string>(bytes);
    message.payload.Append(owner->data(), owner->size(), owner);
  }
  message.header = push.SerializeAsString();
  return message;
}

void PushFrames(const fs::path& out) {
  WriteFile(out / "sync_rank0_step0", fuzz::FuzzInput(Push("sync", 0, 0, FLOAT32), 0));
  WriteFile(out / "sync_rank1_step0_checkpoint",
            fuzz::FuzzInput(Push("sync", 1, 0, FLOAT32, false, 1), 7));
  WriteFile(out / "sync_rank0_skipped", fuzz::FuzzInput(Push("sync", 0, 0, FLOAT32, true), 0));
  WriteFile(out / "async_rank1_fp16", fuzz::FuzzInput(Push("async", 1, 3, FLOAT16), 5));
  WriteFile(out / "ssp_rank0_bf16", fuzz::FuzzInput(Push("ssp", 0, 0, BFLOAT16), 0));
  WriteFile(out / "ssp_rank1_float32_sliced", fuzz::FuzzInput(Push("ssp", 1, 1, FLOAT32), 3));
}

void WireFrames(const fs::path& out) {
  WriteFile(out / "push_sync", fuzz::FuzzInput(Push("sync", 0, 0, FLOAT32), 0));
  WriteFile(out / "push_bf16_sliced_1", fuzz::FuzzInput(Push("ssp", 0, 0, BFLOAT16), 1));
  PullResponse pulled;
  *pulled.add_partitions() = Header(0, 0, FLOAT32, 2);
  pulled.mutable_partitions(0)->set_version(12);
  TensorMessage response;
  response.header = pulled.SerializeAsString();
  auto values = std::make_shared<std::string>(8, '\x01');
  response.payload.Append(values->data(), values->size(), values);
  WriteFile(out / "pull_response_sliced_5", fuzz::FuzzInput(response, 5));
  PushPullStreamRequest stream;
  stream.set_timeout_us(1000);
  stream.mutable_exchange()->mutable_pull()->set_job_id("async");
  TensorMessage exchange;
  exchange.header = stream.SerializeAsString();
  WriteFile(out / "push_pull_stream_request", fuzz::FuzzInput(exchange, 0));
  WriteFile(out / "empty_header", fuzz::FuzzInput(TensorMessage(), 0));
}

// ONNX models that import, and near misses (spec/onnx_test_graphs.h).
void OnnxModels(const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  WriteFile(out / "mlp", OnnxMlp().Bytes());
  WriteFile(out / "cnn", OnnxCnn().Bytes());
  WriteFile(out / "view_flatten", OnnxViewFlatten().Bytes());
  WriteFile(out / "embedding", OnnxEmbedding().Bytes());
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const char* workspace = argc > 1 ? argv[1] : std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (workspace == nullptr) {
    std::fprintf(stderr, "usage: bazel run //fuzz:make_corpus (or make_corpus WORKSPACE_ROOT)\n");
    return 1;
  }
  const fs::path root(workspace);
  const fs::path corpus = root / "fuzz" / "corpus";
  const fs::path scratch = fs::temp_directory_path() / "downpour-make-corpus";
  fs::create_directories(scratch);
  downpour::JobSpecs(root, corpus / "job_spec");
  downpour::RecordFiles(root, corpus / "record_reader", scratch);
  downpour::Examples(root, corpus / "example");
  downpour::IdxFiles(corpus / "idx");
  downpour::WireFrames(corpus / "tensor_wire");
  downpour::PushFrames(corpus / "push");
  downpour::OnnxModels(corpus / "onnx_import");
  fs::remove_all(scratch);
  std::printf("wrote the seed corpora under %s\n", corpus.c_str());
  return 0;
}
