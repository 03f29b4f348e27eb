// TensorBoardWriter: each job's scalars as TensorBoard event files, so that
// `tensorboard --logdir=STATE_DIR/tensorboard` graphs every job's run:
//
//   <root>/<job_id>/events.out.tfevents.<unix seconds>.<hostname>
//
// A file is TFRecord framing (length, masked CRC32C, payload, masked CRC32C)
// of tensorflow.Event protos (proto/tensorboard_event.proto): the first holds
// file_version "brain.Event:2", each later one a single scalar. A job's file
// is opened with its first scalar in this process and every event is one
// write(2), so a reader sees a point as soon as it is added (no fsync: a point
// lost to a crash costs nothing). A coordinator restart, or a job run again
// after it ended, opens a new file in the same directory; TensorBoard reads a
// directory's files in name order.
//
// Each (job, tag)'s steps only rise: a point at or below the step last written
// for it by this writer is dropped, because TensorBoard takes a step going back
// for a restart of the run and discards the points after it.
//
// Failures never reach the caller (the scalars are a view, the training does
// not depend on them): a directory or file that cannot be created or written
// is logged once per job, and that job's points are dropped until CloseJob.
//
// Thread-safe: one mutex guards the open files. Owns their descriptors.
#ifndef DOWNPOUR_CONTROL_TENSORBOARD_WRITER_H_
#define DOWNPOUR_CONTROL_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace downpour {
namespace control {

class TensorBoardWriter {
 public:
  struct Options {
    // The directory of the jobs' directories; created when needed.
    // REQUIRES: not empty.
    std::string root;
    // In the file names; empty: this host's name.
    std::string hostname;
    // Events' wall_time and the files' names; tests inject their own.
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  explicit TensorBoardWriter(Options options);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends scalar `tag` = `value` at `step` to the job's file.
  void AddScalar(const std::string& job_id, absl::string_view tag, int64_t step, double value)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Closes the job's file (the job ended); its next point opens a new one.
  void CloseJob(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // The directory of `job_id`'s files.
  std::string JobDir(const std::string& job_id) const;

 private:
  struct JobFile {
    int fd = -1;
    std::string path;
    bool failed = false;  // Logged; the job's points are dropped.
    std::map<std::string, int64_t, std::less<>> last_step;
  };

  // Creates the job's directory and a new file holding the file_version event.
  absl::Status Open(const std::string& job_id, JobFile* file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes one framed event.
  static absl::Status WriteEvent(const JobFile& file, const std::string& event);

  const Options options_;
  const std::string hostname_;
  absl::Mutex mu_;
  std::map<std::string, JobFile> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_TENSORBOARD_WRITER_H_
