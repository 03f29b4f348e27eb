// A shard's part of a checkpoint: its partitions of one job (values,
// optimizer slots, version, updates applied), the workers' pushed-step
// counts, and the exactly-once windows, captured consistently
// (ParameterStore) and written as one safetensors file,
// ROOT/JOB_ID/step-S/shard-K.safetensors, which a restarted or replacement
// shard reads back.
//
// File layout: tensor "t<T>.p<P>" holds partition P of parameter tensor T
// (F32), "t<T>.p<P>.slot<K>" its optimizer slot K; "worker_steps" (I64) each
// rank's pushed steps; metadata "job", "shard", "step", "mode", "partitions"
// (one "T P offset elements version updates" line each) and "requests" (one
// "incarnation floor seq,seq,... worker_id" line per worker).
//
// Thread-safety: the functions are thread-safe; a CheckpointWriter is
// thread-safe. Ownership: the writer owns its thread and the snapshots it
// was given until written.
#ifndef DOWNPOUR_PS_CHECKPOINT_H_
#define DOWNPOUR_PS_CHECKPOINT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/safetensors.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"
#include "ps/request_dedup.h"

namespace downpour {

struct PartitionSnapshot {
  int32_t tensor_id = 0;
  int32_t partition = 0;
  int64_t offset = 0;
  int64_t version = 0;
  int64_t updates = 0;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

struct ShardSnapshot {
  std::string job_id;
  int shard = 0;
  int64_t step = 0;
  bool sync = true;
  std::vector<PartitionSnapshot> partitions;  // Sorted by (tensor, partition).
  std::vector<int64_t> worker_steps;
  std::vector<RequestDedup::WorkerWindow> requests;
  // Non-empty: the capture failed (a partition was past the step); nothing
  // else is set but the job, shard and step.
  std::string error;
};

// "shard-K.safetensors".
std::string ShardFileName(int shard);
// "JOB_ID/step-S", relative to the checkpoint root.
std::string CheckpointDir(const std::string& job_id, int64_t step);

absl::StatusOr<WrittenFile> WriteShardSnapshot(const std::string& path,
                                               const ShardSnapshot& snapshot);

// Reads a shard file, first checking it has `expected`'s size and CRC32C (a
// file that does not is DataLoss naming it: partial or corrupt).
absl::StatusOr<ShardSnapshot> ReadShardSnapshot(const std::string& path,
                                                const CheckpointFile& expected);

// Writes snapshots on a thread of its own, under `root`, and keeps what it
// wrote (or why it could not) for the coordinator, which learns of it from
// the shard's heartbeats.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string root);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::string& root() const { return root_; }
  // Queues `snapshot` for writing.
  void Write(ShardSnapshot snapshot);
  // The parts written for running jobs, newest last (the last few per job).
  std::vector<CheckpointPart> Parts();
  // Forgets a job's parts (it ended here).
  void ForgetJob(const std::string& job_id);
  // Waits until everything queued so far is written (tests).
  void Drain();

 private:
  void Loop();

  const std::string root_;
  absl::Mutex mu_;
  std::deque<ShardSnapshot> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::deque<CheckpointPart>> parts_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_CHECKPOINT_H_
