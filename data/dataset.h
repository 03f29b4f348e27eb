// BatchReader: a worker's input pipeline. Reads this worker's share of a set of
// record files of tensorflow.Example, decodes them into dense float features and
// int32 labels, optionally shuffles, and assembles batches ahead of time on a
// background thread, so that Next() normally returns without touching the disk.
//
// Sharding across `num_workers` workers: the matching files are sorted; when
// there are at least as many files as workers, worker `rank` reads the files
// whose index % num_workers == rank; otherwise every worker reads all files and
// keeps the records whose global index (position in the concatenation of the
// sorted files) % num_workers == rank. Either way every record is read by
// exactly one worker per epoch.
//
// Shuffling (shuffle_buffer > 0): each epoch visits this worker's files in a
// freshly shuffled order (file sharding only; record sharding keeps the sorted
// order the global index depends on) and draws records at random from a buffer
// of `shuffle_buffer` records, as tf.data's shuffle does. The buffer is drained
// at the end of each epoch, so every epoch is a permutation of the shard. The
// order is a deterministic function of (seed, rank).
//
// With repeat = true (training) epochs follow one another forever and every
// batch is full; with repeat = false (evaluation) one pass is made, the last
// batch may be short, and Next() then reports end of data.
//
// Thread-safety: Next(), examples_read() and queued_batches() may be called from
// any thread, but batches are handed out in one sequence, so normally one
// consumer calls Next(). Ownership: the BatchReader owns its background thread
// and its open files; the destructor stops the thread, also when the queue is
// full, and joins it.
#ifndef DOWNPOUR_DATA_DATASET_H_
#define DOWNPOUR_DATA_DATASET_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace downpour {
namespace data {

struct BatchReaderOptions {
  // glob(3) pattern of record files, e.g. "fashion-mnist-train-*.tfrecord". A
  // relative pattern is resolved against data_dir.
  std::string file_pattern;
  std::string data_dir;
  std::string feature_key = "image";
  std::string label_key = "label";
  int64_t feature_size = 0;    // Elements per example; must be > 0.
  int64_t batch_size = 0;      // Must be > 0.
  int64_t shuffle_buffer = 0;  // 0 = read in order.
  uint64_t seed = 0;
  int rank = 0;
  int num_workers = 1;
  bool repeat = true;
  int prefetch_depth = 4;  // Ready batches kept in the queue; must be > 0.
};

struct Batch {
  int64_t size = 0;             // Examples in this batch (<= batch_size).
  std::vector<float> features;  // size * feature_size, example-major.
  std::vector<int32_t> labels;  // size.
};

class BatchReader {
 public:
  // Validates the options, finds the files and starts the background thread.
  // No matching file is NotFoundError "no record files match <pattern> (data dir <dir>)".
  static absl::StatusOr<std::unique_ptr<BatchReader>> Create(const BatchReaderOptions& options);

  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;
  ~BatchReader();

  // Blocks until a batch is ready and moves it into `*batch`. Returns false at
  // end of data (only with repeat = false). A damaged or undecodable record is
  // returned as an error naming the file and offset, after the batches that were
  // completed before it; the error is then returned by every later call.
  absl::StatusOr<bool> Next(Batch* batch);

  // Examples handed out through Next() so far.
  int64_t examples_read() const { return examples_read_.load(std::memory_order_relaxed); }
  // Batches waiting in the prefetch queue (0 means the consumer is input-bound).
  int64_t queued_batches() const;
  // The files this worker reads (sorted), for logs and tests.
  const std::vector<std::string>& files() const { return files_; }

 private:
  // A record waiting in the shuffle buffer, with where it came from for errors.
  struct PendingRecord {
    std::string data;
    int file = 0;
    int64_t offset = 0;
  };

  BatchReader(const BatchReaderOptions& options, std::vector<std::string> files,
              bool shard_by_record);

  // Runs on producer_: reads epochs, decodes, shuffles, batches, and ends
  // with Finish().
  void ProducerLoop();
  // Blocks while the queue is full; returns false if asked to stop.
  bool PushBatch(Batch* batch);
  void Finish(absl::Status status);
  bool StopRequested() const;

  const BatchReaderOptions options_;
  const std::vector<std::string> files_;  // This worker's files (all files if shard_by_record_).
  const bool shard_by_record_;
  std::mt19937_64 rng_;                        // Used only by the producer thread.
  std::vector<PendingRecord> shuffle_buffer_;  // Used only by the producer thread.

  mutable absl::Mutex mu_;
  absl::CondVar not_empty_;  // Signalled when a batch is queued or the producer finishes.
  absl::CondVar not_full_;   // Signalled when a batch is taken or stop is requested.
  std::deque<Batch> ready_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> examples_read_{0};
  std::thread producer_;
};

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_DATASET_H_
