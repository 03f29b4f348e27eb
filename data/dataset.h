// BatchReader: a worker's input pipeline. Reads the record files of
// tensorflow.Example it is given — whole, or every `stride`-th record of a
// file from `offset`, which is how the coordinator shares files out when
// there are fewer files than workers (spec/data_assignment.h) — decodes them
// into int32 labels and either one dense float feature per example or, with
// `inputs`, several named inputs (dense floats and variable-length int64 id
// lists: data/example.h's InputDecoder), optionally shuffles, and assembles
// batches ahead of time on a background thread, so that Next() normally
// returns without touching the disk.
//
// Shuffling (shuffle_buffer > 0): each epoch visits the slices in a freshly
// shuffled order and draws records at random from a buffer of
// `shuffle_buffer` records, as tf.data's shuffle does. The buffer is drained
// at the end of each epoch, so every epoch is a permutation of the slices'
// records. The order is a deterministic function of (seed, stream).
//
// Augmentation (random crop and flip, data/augment.h) draws from a generator
// of its own, also a function of (seed, stream), in the order examples are
// batched: the same seed gives the same crops, and turning augmentation on
// does not change the order of the examples.
//
// Records may be GZIP-compressed files (data/record_io.h); feature values may
// be PNG or JPEG images (data/image.h). The background thread reads a batch's
// records and hands them to an assembling thread, which decodes them on
// itself and decode_threads - 1 helpers while the next batch's are read.
// A record's payload checksum is checked there too, as its batch is decoded
// (records another reader's stride takes are that reader's to check): a
// damaged record ends the run with DataLoss naming its file and offset,
// after the batches before its own, and before any error of a later read.
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
#include "data/augment.h"
#include "data/example.h"
#include "data/record_io.h"

namespace downpour {
namespace data {

// A file's share of a reader's data: its records whose index in the file
// % stride == offset (stride 1: every record).
struct FileSlice {
  std::string file;
  int stride = 1;
  int offset = 0;
};

// The regular files matching the glob(3) `pattern` (e.g.
// "fashion-mnist-train-*.tfrecord"; relative to `data_dir` unless absolute),
// sorted and named as the pattern names them: a relative pattern gives names
// relative to data_dir, which each worker resolves against its own.
// Directories and the ".tmp" files of unfinished writers are skipped. None
// is NotFoundError "no record files match <pattern> (data dir <dir>)".
absl::StatusOr<std::vector<std::string>> ListRecordFiles(const std::string& pattern,
                                                         const std::string& data_dir);

// Every record of each of `files`.
std::vector<FileSlice> WholeFiles(const std::vector<std::string>& files);

struct BatchReaderOptions {
  // What to read (at least one slice); relative file names are resolved
  // against data_dir.
  std::vector<FileSlice> slices;
  std::string data_dir;
  // Named inputs (InputSpec): non-empty selects that mode, where
  // feature_key, feature_size, image, encoding and augment are unused (and
  // Create refuses a feature_size, image or augmentation given anyway).
  std::vector<InputFormat> inputs;
  std::string feature_key = "image";
  std::string label_key = "label";
  int64_t feature_size = 0;  // Elements per example; must be > 0 (without inputs).
  // The model's input as an image (height, width, channels), for PNG/JPEG
  // values and augmentation; unknown (zeros) for a flat input.
  ImageShape image;
  FeatureEncoding encoding = FeatureEncoding::kBySize;
  Compression compression = Compression::kAuto;  // Of every file.
  // Random crop / flip of each example (training data only). REQUIRES, when
  // enabled: a known `image` of feature_size elements.
  AugmentOptions augment;
  int64_t batch_size = 0;      // Must be > 0.
  int64_t shuffle_buffer = 0;  // 0 = read in order.
  uint64_t seed = 0;
  // Tells apart the shuffle orders of readers of one seed (a worker's rank).
  uint64_t stream = 0;
  bool repeat = true;
  int prefetch_depth = 4;  // Ready batches kept in the queue; must be > 0.
  // Threads that decode a batch's examples (the reader's own thread and
  // decode_threads - 1 more); must be > 0. Batches are the same for any number.
  int decode_threads = 1;
};

struct Batch {
  int64_t size = 0;             // Examples in this batch (<= batch_size).
  std::vector<float> features;  // size * feature_size, example-major; empty with inputs.
  std::vector<int32_t> labels;  // size.
  // With BatchReaderOptions::inputs: one per input, in order, each holding
  // `size` examples.
  std::vector<InputBatch> inputs;
};

class BatchReader {
 public:
  // Validates the options and starts the background thread. A missing or
  // unreadable file is an error of Next() naming it.
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

 private:
  // A record waiting in the shuffle buffer, with where it came from for errors.
  struct PendingRecord {
    std::string data;
    uint32_t crc = 0;  // Its payload's, checked as it is decoded.
    int64_t read = 0;  // How many records this reader kept before it.
    int file = 0;
    int64_t offset = 0;
    bool compressed = false;  // Its file is: offset is in the uncompressed stream.
  };

  explicit BatchReader(const BatchReaderOptions& options);
  // Where slice `i`'s file is.
  std::string PathOf(int i) const;

  // Runs on producer_: reads epochs, shuffles and batches the records, has
  // each batch decoded and queued on a thread of its own, and ends with
  // Finish().
  void ProducerLoop();
  // Blocks while the queue is full; returns false if asked to stop.
  bool PushBatch(Batch* batch);
  void Finish(absl::Status status);
  bool StopRequested() const;

  const BatchReaderOptions options_;
  // With options_.inputs; immutable, shared by the decode threads.
  std::unique_ptr<const InputDecoder> input_decoder_;
  std::mt19937_64 rng_;                        // Used only by the producer thread.
  std::mt19937_64 augment_rng_;                // Used only by the producer thread.
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
