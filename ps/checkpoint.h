// CheckpointWriter: writes a shard's parts of checkpoints
// (spec/checkpoint_files.h has the format) on a thread of its own, off the
// push path, and keeps what it wrote (or why it could not) for the
// coordinator, which learns of it from the shard's heartbeats.
//
// Thread-safety: thread-safe. Ownership: the writer owns its thread and the
// captures it was given until written; it destroys each once written, which
// hands the arrays it borrowed back to the store.
#ifndef DOWNPOUR_PS_CHECKPOINT_H_
#define DOWNPOUR_PS_CHECKPOINT_H_

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/coordinator.pb.h"
#include "ps/shard_capture.h"
#include "spec/checkpoint_files.h"

namespace downpour {

// Writes snapshots under `root`.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string root);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::string& root() const { return root_; }
  // Queues `capture` for writing.
  void Write(ShardCapture capture);
  void Write(ShardSnapshot snapshot) { Write(ShardCapture::Owning(std::move(snapshot))); }
  // The parts written for running jobs, newest last (the last few per job).
  std::vector<CheckpointPart> Parts();
  // Forgets a job's parts (it ended here).
  void ForgetJob(const std::string& job_id);
  // Whether nothing is queued or being written.
  bool Idle();
  // Waits until everything queued so far is written (tests).
  void Drain();

 private:
  void Loop();

  const std::string root_;
  absl::Mutex mu_;
  std::deque<ShardCapture> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::deque<CheckpointPart>> parts_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_CHECKPOINT_H_
