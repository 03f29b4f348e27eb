#include "ps/checkpoint.h"

#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/log.h"
#include "common/status.h"

namespace downpour {
namespace {

// Parts kept per job for the heartbeats (older ones the coordinator has).
constexpr size_t kPartsKept = 4;

std::string PartitionName(int32_t tensor_id, int32_t partition) {
  return absl::StrCat("t", tensor_id, ".p", partition);
}

absl::Status Damaged(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is damaged: ", what));
}

}  // namespace

std::string ShardFileName(int shard) { return absl::StrCat("shard-", shard, ".safetensors"); }

std::string CheckpointDir(const std::string& job_id, int64_t step) {
  return absl::StrCat(job_id, "/step-", step);
}

absl::StatusOr<WrittenFile> WriteShardSnapshot(const std::string& path,
                                               const ShardSnapshot& snapshot) {
  std::vector<TensorToWrite> tensors;
  std::vector<std::string> partition_lines;
  for (const PartitionSnapshot& p : snapshot.partitions) {
    const std::string name = PartitionName(p.tensor_id, p.partition);
    const int64_t n = static_cast<int64_t>(p.values.size());
    tensors.push_back({name, TensorDtype::kF32, {n}, p.values.data()});
    for (size_t k = 0; k < p.slots.size(); ++k) {
      tensors.push_back(
          {absl::StrCat(name, ".slot", k), TensorDtype::kF32, {n}, p.slots[k].data()});
    }
    partition_lines.push_back(absl::StrCat(p.tensor_id, " ", p.partition, " ", p.offset, " ", n,
                                           " ", p.version, " ", p.updates));
  }
  tensors.push_back({"worker_steps",
                     TensorDtype::kI64,
                     {static_cast<int64_t>(snapshot.worker_steps.size())},
                     snapshot.worker_steps.data()});
  std::vector<std::string> request_lines;
  for (const RequestDedup::WorkerWindow& w : snapshot.requests) {
    request_lines.push_back(absl::StrCat(w.incarnation, " ", w.floor, " ",
                                         w.applied.empty() ? "-" : absl::StrJoin(w.applied, ","),
                                         " ", w.worker_id));
  }
  return WriteSafetensors(path, tensors,
                          {{"job", snapshot.job_id},
                           {"shard", absl::StrCat(snapshot.shard)},
                           {"step", absl::StrCat(snapshot.step)},
                           {"mode", snapshot.sync ? "SYNC" : "ASYNC"},
                           {"partitions", absl::StrJoin(partition_lines, "\n")},
                           {"requests", absl::StrJoin(request_lines, "\n")}});
}

absl::StatusOr<ShardSnapshot> ReadShardSnapshot(const std::string& path,
                                                const CheckpointFile& expected) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  if (bytes.size() != expected.bytes()) {
    return Damaged(path, absl::StrCat(bytes.size(), " bytes where the manifest says ",
                                      expected.bytes(), " (partial?)"));
  }
  if (Crc32c(bytes.data(), bytes.size()) != expected.crc32c()) {
    return Damaged(path, "its CRC32C is not the manifest's");
  }
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
    RequestDedup::WorkerWindow w;
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
  return snapshot;
}

CheckpointWriter::CheckpointWriter(std::string root) : root_(std::move(root)) {
  thread_ = std::thread([this] { Loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CheckpointWriter::Write(ShardSnapshot snapshot) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(snapshot));
}

std::vector<CheckpointPart> CheckpointWriter::Parts() {
  absl::MutexLock lock(&mu_);
  std::vector<CheckpointPart> out;
  for (const auto& [job, parts] : parts_) out.insert(out.end(), parts.begin(), parts.end());
  return out;
}

void CheckpointWriter::ForgetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  parts_.erase(job_id);
}

void CheckpointWriter::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CheckpointWriter* w)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->queue_.empty() && !w->writing_; },
      this));
}

void CheckpointWriter::Loop() {
  while (true) {
    ShardSnapshot snapshot;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stopping_ || !w->queue_.empty(); },
          this));
      // A shard shutting down finishes what it was given first.
      if (queue_.empty()) return;
      snapshot = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    CheckpointPart part;
    part.set_job_id(snapshot.job_id);
    part.set_step(snapshot.step);
    CheckpointFile* file = part.mutable_file();
    file->set_name(ShardFileName(snapshot.shard));
    file->set_shard(snapshot.shard);
    int64_t min_version = INT64_MAX, max_version = 0;
    for (const PartitionSnapshot& p : snapshot.partitions) {
      min_version = std::min(min_version, p.version);
      max_version = std::max(max_version, p.version);
    }
    file->set_min_version(snapshot.partitions.empty() ? 0 : min_version);
    file->set_max_version(max_version);
    const std::string dir = absl::StrCat(root_, "/", CheckpointDir(snapshot.job_id, snapshot.step));
    absl::Status made = snapshot.error.empty() ? MakeDirs(dir) : absl::AbortedError(snapshot.error);
    const absl::StatusOr<WrittenFile> written =
        made.ok() ? WriteShardSnapshot(dir + "/" + file->name(), snapshot)
                  : absl::StatusOr<WrittenFile>(made);
    if (written.ok()) {
      file->set_bytes(written->bytes);
      file->set_crc32c(written->crc32c);
      Log(absl::StrCat("job ", snapshot.job_id, ": checkpoint at step ", snapshot.step, ": wrote ",
                       dir, "/", file->name(), " (", written->bytes, " bytes)"));
    } else {
      part.set_error(std::string(written.status().message()));
      Log(absl::StrCat("job ", snapshot.job_id, ": checkpoint at step ", snapshot.step,
                       " not written: ", written.status().message()));
    }
    absl::MutexLock lock(&mu_);
    std::deque<CheckpointPart>& parts = parts_[snapshot.job_id];
    parts.push_back(std::move(part));
    while (parts.size() > kPartsKept) parts.pop_front();
    writing_ = false;
  }
}

}  // namespace downpour
