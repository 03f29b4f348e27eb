#include "spec/checkpoint_files.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"

namespace downpour {
namespace {

std::string PartitionName(int32_t tensor_id, int32_t partition) {
  return absl::StrCat("t", tensor_id, ".p", partition);
}

absl::Status Damaged(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is damaged: ", what));
}

std::string SparseTensorName(const std::string& table, absl::string_view what) {
  return absl::StrCat("sparse/", table, "/", what);
}

// The sparse tables' tensors and their "sparse" metadata; InvalidArgument
// for a table whose vectors are not the sizes its header gives (the tensors
// point into the vectors).
absl::Status AddSparseTables(const ShardSnapshot& snapshot, std::vector<TensorToWrite>* tensors,
                             std::string* metadata) {
  std::vector<std::string> lines = {absl::StrCat("version ", snapshot.sparse_version)};
  for (const SparseTableSnapshot& t : snapshot.sparse_tables) {
    const int64_t rows = static_cast<int64_t>(t.ids.size());
    if (t.name.empty() || t.dim <= 0 || t.slots < 0 ||
        t.values.size() != static_cast<size_t>(rows * t.dim) ||
        t.slot_values.size() != static_cast<size_t>(rows * t.dim * t.slots) ||
        t.updates.size() != t.ids.size() || t.touches.size() != t.ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse table \"", t.name, "\" of the shard snapshot: ", rows, " ids, dim ", t.dim, ", ",
          t.slots, " slots, but ", t.values.size(), " values, ", t.slot_values.size(),
          " slot values, ", t.updates.size(), " update and ", t.touches.size(), " touch counts"));
    }
    lines.push_back(absl::StrCat(rows, " ", t.dim, " ", t.slots, " ", t.name));
    tensors->push_back({SparseTensorName(t.name, "ids"), TensorDtype::kI64, {rows}, t.ids.data()});
    tensors->push_back(
        {SparseTensorName(t.name, "values"), TensorDtype::kF32, {rows, t.dim}, t.values.data()});
    for (int k = 0; k < t.slots; ++k) {
      tensors->push_back({SparseTensorName(t.name, absl::StrCat("slot", k)),
                          TensorDtype::kF32,
                          {rows, t.dim},
                          t.slot_values.data() + static_cast<size_t>(k) * rows * t.dim});
    }
    tensors->push_back(
        {SparseTensorName(t.name, "updates"), TensorDtype::kI64, {rows}, t.updates.data()});
    tensors->push_back(
        {SparseTensorName(t.name, "touches"), TensorDtype::kI64, {rows}, t.touches.data()});
  }
  *metadata = absl::StrJoin(lines, "\n");
  return absl::OkStatus();
}

// Appends tensor `name` of `file` (`dtype`, `shape`) to `out`, or DataLoss
// naming `path`, the table and the tensor. Copied: a file's I64 tensors need
// not be 8-byte aligned.
template <typename T>
absl::Status AppendTensor(const SafetensorsFile& file, const std::string& path,
                          const std::string& table, const std::string& name, TensorDtype dtype,
                          const std::vector<int64_t>& shape, std::vector<T>* out) {
  auto it = file.tensors().find(name);
  if (it == file.tensors().end()) {
    return Damaged(path, absl::StrCat("sparse table ", table, " has no tensor ", name));
  }
  const SafetensorsFile::Tensor& tensor = it->second;
  if (tensor.dtype != dtype || tensor.shape != shape) {
    return Damaged(
        path,
        absl::StrCat("sparse table ", table, ": tensor ", name, " is ",
                     TensorDtypeName(tensor.dtype), " [", absl::StrJoin(tensor.shape, ", "),
                     "], not ", TensorDtypeName(dtype), " [", absl::StrJoin(shape, ", "), "]"));
  }
  const size_t at = out->size();
  out->resize(at + tensor.data.size() / sizeof(T));
  std::memcpy(out->data() + at, tensor.data.data(), tensor.data.size());
  return absl::OkStatus();
}

// The tables of the "sparse" metadata `text` (see the header).
absl::Status ReadSparseTables(const SafetensorsFile& file, const std::string& path,
                              const std::string& text, ShardSnapshot* snapshot) {
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || !absl::StartsWith(lines[0], "version ") ||
      !absl::SimpleAtoi(lines[0].substr(8), &snapshot->sparse_version)) {
    return Damaged(path, "its \"sparse\" metadata does not start with the tables' version");
  }
  snapshot->has_sparse = true;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(lines[i], absl::MaxSplits(' ', 3));
    SparseTableSnapshot t;
    int64_t rows = 0;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &rows) || !absl::SimpleAtoi(f[1], &t.dim) ||
        !absl::SimpleAtoi(f[2], &t.slots) || rows < 0 || t.dim <= 0 || t.slots < 0 || t.slots > 2 ||
        f[3].empty()) {
      return Damaged(path, absl::StrCat("bad sparse table line \"", lines[i], "\""));
    }
    t.name = f[3];
    RETURN_IF_ERROR(AppendTensor(file, path, t.name, SparseTensorName(t.name, "ids"),
                                 TensorDtype::kI64, {rows}, &t.ids));
    RETURN_IF_ERROR(AppendTensor(file, path, t.name, SparseTensorName(t.name, "values"),
                                 TensorDtype::kF32, {rows, t.dim}, &t.values));
    for (int k = 0; k < t.slots; ++k) {
      RETURN_IF_ERROR(AppendTensor(file, path, t.name,
                                   SparseTensorName(t.name, absl::StrCat("slot", k)),
                                   TensorDtype::kF32, {rows, t.dim}, &t.slot_values));
    }
    RETURN_IF_ERROR(AppendTensor(file, path, t.name, SparseTensorName(t.name, "updates"),
                                 TensorDtype::kI64, {rows}, &t.updates));
    RETURN_IF_ERROR(AppendTensor(file, path, t.name, SparseTensorName(t.name, "touches"),
                                 TensorDtype::kI64, {rows}, &t.touches));
    snapshot->sparse_tables.push_back(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadVerified(const std::string& path, const CheckpointFile& expected) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", path, " cannot be read: ", bytes.status().message()));
  }
  if (bytes->size() != expected.bytes()) {
    return Damaged(path, absl::StrCat(bytes->size(), " bytes where the manifest says ",
                                      expected.bytes(), " (partial?)"));
  }
  if (Crc32c(bytes->data(), bytes->size()) != expected.crc32c()) {
    return Damaged(path, "its CRC32C is not the manifest's");
  }
  return bytes;
}

std::string ShardFileName(int shard) { return absl::StrCat("shard-", shard, ".safetensors"); }

std::string CheckpointDir(const std::string& job_id, int64_t step, int64_t attempt) {
  if (attempt <= 1) return absl::StrCat(job_id, "/step-", step);
  return absl::StrCat(job_id, "/step-", step, ".attempt-", attempt);
}

PartitionArrays ArraysOf(const PartitionSnapshot& p) {
  PartitionArrays arrays;
  arrays.tensor_id = p.tensor_id;
  arrays.partition = p.partition;
  arrays.offset = p.offset;
  arrays.version = p.version;
  arrays.updates = p.updates;
  arrays.num_elements = static_cast<int64_t>(p.values.size());
  arrays.values = p.values.data();
  for (const std::vector<float>& slot : p.slots) arrays.slots.push_back(slot.data());
  return arrays;
}

absl::StatusOr<WrittenFile> WriteShardSnapshot(const std::string& path,
                                               const ShardSnapshot& snapshot) {
  std::vector<PartitionArrays> partitions;
  partitions.reserve(snapshot.partitions.size());
  for (const PartitionSnapshot& p : snapshot.partitions) partitions.push_back(ArraysOf(p));
  return WriteShardSnapshot(path, snapshot, partitions);
}

absl::StatusOr<WrittenFile> WriteShardSnapshot(const std::string& path,
                                               const ShardSnapshot& snapshot,
                                               const std::vector<PartitionArrays>& partitions) {
  std::vector<TensorToWrite> tensors;
  std::vector<std::string> partition_lines;
  for (const PartitionArrays& p : partitions) {
    const std::string name = PartitionName(p.tensor_id, p.partition);
    const int64_t n = p.num_elements;
    tensors.push_back({name, TensorDtype::kF32, {n}, p.values});
    for (size_t k = 0; k < p.slots.size(); ++k) {
      tensors.push_back({absl::StrCat(name, ".slot", k), TensorDtype::kF32, {n}, p.slots[k]});
    }
    partition_lines.push_back(absl::StrCat(p.tensor_id, " ", p.partition, " ", p.offset, " ", n,
                                           " ", p.version, " ", p.updates));
  }
  tensors.push_back({"worker_steps",
                     TensorDtype::kI64,
                     {static_cast<int64_t>(snapshot.worker_steps.size())},
                     snapshot.worker_steps.data()});
  std::vector<std::string> request_lines;
  for (const RequestWindow& w : snapshot.requests) {
    request_lines.push_back(absl::StrCat(w.incarnation, " ", w.floor, " ",
                                         w.applied.empty() ? "-" : absl::StrJoin(w.applied, ","),
                                         " ", w.worker_id));
  }
  std::map<std::string, std::string> metadata = {
      {"job", snapshot.job_id},
      {"shard", absl::StrCat(snapshot.shard)},
      {"step", absl::StrCat(snapshot.step)},
      {"mode", snapshot.sync ? "SYNC" : "ASYNC"},
      {"partitions", absl::StrJoin(partition_lines, "\n")},
      {"requests", absl::StrJoin(request_lines, "\n")}};
  if (snapshot.has_sparse) {
    RETURN_IF_ERROR(AddSparseTables(snapshot, &tensors, &metadata["sparse"]));
  }
  return WriteSafetensors(path, tensors, metadata);
}

absl::StatusOr<ShardSnapshot> ReadShardSnapshot(const std::string& path,
                                                const CheckpointFile& expected) {
  ASSIGN_OR_RETURN(std::string bytes, ReadVerified(path, expected));
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), path));
  const auto& meta = file.metadata();
  auto field = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = meta.find(key);
    if (it == meta.end()) return Damaged(path, absl::StrCat("no \"", key, "\" metadata"));
    return it->second;
  };
  ShardSnapshot snapshot;
  ASSIGN_OR_RETURN(snapshot.job_id, field("job"));
  ASSIGN_OR_RETURN(const std::string shard, field("shard"));
  ASSIGN_OR_RETURN(const std::string step, field("step"));
  ASSIGN_OR_RETURN(const std::string mode, field("mode"));
  if (!absl::SimpleAtoi(shard, &snapshot.shard) || !absl::SimpleAtoi(step, &snapshot.step)) {
    return Damaged(path, "bad shard or step metadata");
  }
  snapshot.sync = mode == "SYNC";
  ASSIGN_OR_RETURN(const std::string partitions, field("partitions"));
  for (absl::string_view line : absl::StrSplit(partitions, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ');
    PartitionSnapshot p;
    int64_t n = 0;
    if (f.size() != 6 || !absl::SimpleAtoi(f[0], &p.tensor_id) ||
        !absl::SimpleAtoi(f[1], &p.partition) || !absl::SimpleAtoi(f[2], &p.offset) ||
        !absl::SimpleAtoi(f[3], &n) || !absl::SimpleAtoi(f[4], &p.version) ||
        !absl::SimpleAtoi(f[5], &p.updates) || n < 0) {
      return Damaged(path, absl::StrCat("bad partition line \"", line, "\""));
    }
    const std::string name = PartitionName(p.tensor_id, p.partition);
    ASSIGN_OR_RETURN(const float* values, file.Floats(name, n));
    p.values.assign(values, values + n);
    for (int k = 0;; ++k) {
      const std::string slot = absl::StrCat(name, ".slot", k);
      if (!file.tensors().count(slot)) break;
      ASSIGN_OR_RETURN(const float* s, file.Floats(slot, n));
      p.slots.emplace_back(s, s + n);
    }
    snapshot.partitions.push_back(std::move(p));
  }
  ASSIGN_OR_RETURN(SafetensorsFile::Tensor steps, file.Get("worker_steps"));
  if (steps.dtype != TensorDtype::kI64) return Damaged(path, "worker_steps is not I64");
  snapshot.worker_steps.resize(steps.data.size() / sizeof(int64_t));
  std::memcpy(snapshot.worker_steps.data(), steps.data.data(), steps.data.size());
  ASSIGN_OR_RETURN(const std::string requests, field("requests"));
  for (absl::string_view line : absl::StrSplit(requests, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    RequestWindow w;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &w.incarnation) ||
        !absl::SimpleAtoi(f[1], &w.floor)) {
      return Damaged(path, absl::StrCat("bad request window \"", line, "\""));
    }
    if (f[2] != "-") {
      for (absl::string_view seq : absl::StrSplit(f[2], ',')) {
        int64_t s = 0;
        if (!absl::SimpleAtoi(seq, &s)) return Damaged(path, "bad request sequence");
        w.applied.push_back(s);
      }
    }
    w.worker_id = f[3];
    snapshot.requests.push_back(std::move(w));
  }
  if (auto sparse = meta.find("sparse"); sparse != meta.end()) {
    RETURN_IF_ERROR(ReadSparseTables(file, path, sparse->second, &snapshot));
  }
  return snapshot;
}

std::string ManifestPath(const std::string& root, const std::string& dir) {
  return absl::StrCat(root, "/", dir, "/", kManifestName);
}

absl::StatusOr<WrittenFile> WriteManifest(const std::string& root,
                                          const CheckpointManifest& manifest) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  const auto printed = google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (!printed.ok()) {
    return absl::InternalError(absl::StrCat("manifest of ", manifest.job_id(), " step ",
                                            manifest.step(), ": ", printed.ToString()));
  }
  const std::string path =
      ManifestPath(root, CheckpointDir(manifest.job_id(), manifest.step(), manifest.attempt()));
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file,
                   AtomicFile::Create(path, "checkpoint manifest"));
  RETURN_IF_ERROR(file->Append(json));
  RETURN_IF_ERROR(file->Commit());
  return WrittenFile{file->bytes(), file->crc32c()};
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& root, const std::string& dir) {
  const std::string path = ManifestPath(root, dir);
  absl::StatusOr<std::string> json = ReadFileToString(path);
  if (!json.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path,
                     " cannot be read (incomplete checkpoint?): ", json.status().message()));
  }
  CheckpointManifest manifest;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*json, &manifest);
  if (!parsed.ok()) return Damaged(path, parsed.ToString());
  if (CheckpointDir(manifest.job_id(), manifest.step(), manifest.attempt()) != dir) {
    return Damaged(path, absl::StrCat("it is the manifest of ", manifest.job_id(), " step ",
                                      manifest.step(), ", not of ", dir));
  }
  return manifest;
}

absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& root,
                                                    const std::string& dir) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(root, dir));
  for (const CheckpointFile& file : manifest.files()) {
    RETURN_IF_ERROR(ReadVerified(absl::StrCat(root, "/", dir, "/", file.name()), file).status());
  }
  return manifest;
}

}  // namespace downpour
