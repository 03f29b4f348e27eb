#include "ps/checkpoint.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "common/log.h"

namespace downpour {
namespace {

// Parts kept per job for the heartbeats (older ones the coordinator has).
constexpr size_t kPartsKept = 4;

}  // namespace

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

void CheckpointWriter::Write(ShardCapture capture) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(capture));
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

bool CheckpointWriter::Idle() {
  absl::MutexLock lock(&mu_);
  return queue_.empty() && !writing_;
}

void CheckpointWriter::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CheckpointWriter* w)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->queue_.empty() && !w->writing_; },
      this));
}

void CheckpointWriter::Loop() {
  // Writing yields to training: the lowest CPU priority for this thread
  // (Linux applies a nice value per thread). SCHED_IDLE was tried: no
  // clearer gain on a 2-core box, and a capture could wait tens of ms for
  // the writer to start (BENCHMARKS.md).
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  while (true) {
    ShardCapture capture;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stopping_ || !w->queue_.empty(); },
          this));
      // A shard shutting down finishes what it was given first.
      if (queue_.empty()) return;
      capture = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    capture.Detach();
    const ShardSnapshot& snapshot = capture.info();
    CheckpointPart part;
    part.set_job_id(snapshot.job_id);
    part.set_step(snapshot.step);
    part.set_attempt(snapshot.attempt);
    CheckpointFile* file = part.mutable_file();
    file->set_name(ShardFileName(snapshot.shard));
    file->set_shard(snapshot.shard);
    int64_t min_version = INT64_MAX, max_version = 0;
    for (const PartitionArrays& p : capture.partitions()) {
      min_version = std::min(min_version, p.version);
      max_version = std::max(max_version, p.version);
    }
    if (capture.partitions().empty()) {
      // A shard holding only sparse tables of the job: their version.
      min_version = max_version = snapshot.has_sparse ? snapshot.sparse_version : 0;
    }
    file->set_min_version(min_version);
    file->set_max_version(max_version);
    const std::string dir =
        absl::StrCat(root_, "/", CheckpointDir(snapshot.job_id, snapshot.step, snapshot.attempt));
    const absl::Time began = absl::Now();
    absl::Status made = snapshot.error.empty() ? MakeDirs(dir) : absl::AbortedError(snapshot.error);
    const absl::StatusOr<WrittenFile> written =
        made.ok() ? WriteShardSnapshot(dir + "/" + file->name(), snapshot, capture.partitions())
                  : absl::StatusOr<WrittenFile>(made);
    const std::string job_id = snapshot.job_id;
    const int64_t step = snapshot.step;
    if (written.ok()) {
      file->set_bytes(written->bytes);
      file->set_crc32c(written->crc32c);
      const double seconds = absl::ToDoubleSeconds(absl::Now() - began);
      Log(absl::StrFormat(
          "job %s: checkpoint at step %d: wrote %s/%s (%d bytes in %.3f s, %.0f MB/s)", job_id,
          step, dir, file->name(), written->bytes, seconds,
          written->bytes / 1e6 / std::max(seconds, 1e-9)));
    } else {
      part.set_error(std::string(written.status().message()));
      Log(absl::StrCat("job ", job_id, ": checkpoint at step ", step,
                       " not written: ", written.status().message()));
    }
    // Written (or not): the borrowed arrays go back before the part is
    // reported, outside the writer's lock.
    capture = ShardCapture();
    absl::MutexLock lock(&mu_);
    std::deque<CheckpointPart>& parts = parts_[job_id];
    parts.push_back(std::move(part));
    while (parts.size() > kPartsKept) parts.pop_front();
    writing_ = false;
  }
}

}  // namespace downpour
