#include "control/checkpoints.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "spec/checkpoint_files.h"

namespace downpour {
namespace control {

absl::StatusOr<CheckpointInfo> CommitCheckpoint(const std::string& root, const JobStatus& job,
                                                const CheckpointParts& parts, int64_t time_ms) {
  const std::string dir = CheckpointDir(job.id(), parts.step, job.attempt());
  RETURN_IF_ERROR(MakeDirs(absl::StrCat(root, "/", dir)));
  ASSIGN_OR_RETURN(
      std::unique_ptr<AtomicFile> worker_file,
      AtomicFile::Create(absl::StrCat(root, "/", dir, "/", kWorkerStateName), "checkpoint file"));
  RETURN_IF_ERROR(worker_file->Append(parts.worker_state));
  RETURN_IF_ERROR(worker_file->Commit());

  CheckpointManifest manifest;
  manifest.set_job_id(job.id());
  *manifest.mutable_spec() = job.spec();
  manifest.set_step(parts.step);
  manifest.set_attempt(job.attempt());
  manifest.set_time_ms(time_ms);
  uint64_t bytes = worker_file->bytes();
  for (const CheckpointFile& file : parts.shard_files) {
    *manifest.add_files() = file;
    bytes += file.bytes();
  }
  CheckpointFile* worker = manifest.add_files();
  worker->set_name(kWorkerStateName);
  worker->set_shard(-1);
  worker->set_bytes(worker_file->bytes());
  worker->set_crc32c(worker_file->crc32c());
  *manifest.mutable_partitions() = job.placement().partitions();
  RETURN_IF_ERROR(WriteManifest(root, manifest).status());

  CheckpointInfo info;
  info.set_step(parts.step);
  info.set_time_ms(time_ms);
  info.set_dir(dir);
  info.set_bytes(bytes);
  return info;
}

absl::StatusOr<CheckpointRestore> CompleteCheckpoint(const std::string& root,
                                                     const std::vector<CheckpointInfo>& checkpoints,
                                                     int64_t step,
                                                     std::vector<std::string>* refused) {
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    if (step != 0 && it->step() != step) continue;
    absl::StatusOr<CheckpointManifest> manifest = VerifyCheckpoint(root, it->dir());
    absl::StatusOr<std::string> worker_state;
    if (manifest.ok()) {
      worker_state = absl::NotFoundError(absl::StrCat("checkpoint ", it->dir(), " names no ",
                                                      kWorkerStateName, " in its manifest"));
    }
    CheckpointRestore restore;
    if (manifest.ok()) {
      for (const CheckpointFile& file : manifest->files()) {
        if (file.shard() >= 0) {
          *restore.add_files() = file;
        } else {
          worker_state = ReadVerified(absl::StrCat(root, "/", it->dir(), "/", file.name()), file);
        }
      }
    }
    const absl::Status status = manifest.ok() ? worker_state.status() : manifest.status();
    if (!status.ok()) {
      refused->push_back(absl::StrCat("checkpoint at step ", it->step(), ": ", status.message()));
      continue;
    }
    restore.set_step(it->step());
    restore.set_dir(it->dir());
    restore.set_worker_state(*std::move(worker_state));
    return restore;
  }
  if (step != 0) return absl::NotFoundError(absl::StrCat("no complete checkpoint at step ", step));
  return absl::NotFoundError("no complete checkpoint");
}

absl::Status RemoveStaleCheckpoints(const std::string& root, const std::string& job_id,
                                    const std::vector<CheckpointInfo>& kept, int64_t attempt,
                                    int64_t step) {
  absl::StatusOr<std::vector<std::string>> names = ListDir(absl::StrCat(root, "/", job_id));
  if (!names.ok()) return names.status();
  absl::Status first;
  for (const std::string& name : *names) {
    const std::string dir = absl::StrCat(job_id, "/", name);
    if (std::any_of(kept.begin(), kept.end(),
                    [&](const CheckpointInfo& c) { return c.dir() == dir; })) {
      continue;
    }
    // "step-S" (first start) or "step-S.attempt-N".
    int64_t s = 0, a = 1;
    const std::vector<std::string> parts = absl::StrSplit(name, ".attempt-");
    const bool ours = absl::StartsWith(parts[0], "step-") &&
                      absl::SimpleAtoi(parts[0].substr(5), &s) &&
                      (parts.size() == 1 || absl::SimpleAtoi(parts[1], &a));
    if (ours && std::max<int64_t>(a, 1) == std::max<int64_t>(attempt, 1) && s > step) continue;
    first.Update(RemoveAll(absl::StrCat(root, "/", dir)));
  }
  return first;
}

absl::Status RemoveAbandonedCheckpoint(const std::string& root, const std::string& job_id,
                                       int64_t step, int64_t attempt) {
  const std::string dir = absl::StrCat(root, "/", CheckpointDir(job_id, step, attempt));
  struct stat manifest;
  if (stat(absl::StrCat(dir, "/", kManifestName).c_str(), &manifest) == 0) return absl::OkStatus();
  return RemoveAll(dir);
}

absl::Status RemoveJobCheckpoints(const std::string& root, const std::string& job_id) {
  // Job ids are names (spec/job_validation.h ValidateJobId); never a path.
  if (job_id.empty() || job_id[0] == '.' || job_id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id \"", job_id, "\" names no checkpoint folder of its own"));
  }
  return RemoveAll(absl::StrCat(root, "/", job_id));
}

}  // namespace control
}  // namespace downpour
