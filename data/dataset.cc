#include "data/dataset.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/thread_name.h"
#include "data/example.h"
#include "data/record_io.h"

namespace downpour {
namespace data {
namespace {

absl::Status ValidateOptions(const BatchReaderOptions& o) {
  if (o.slices.empty()) return absl::InvalidArgumentError("BatchReader has no files to read");
  for (const FileSlice& slice : o.slices) {
    if (slice.file.empty() || slice.stride < 1 || slice.offset < 0 ||
        slice.offset >= slice.stride) {
      return absl::InvalidArgumentError(
          absl::StrCat("BatchReader slice of file '", slice.file, "' (stride ", slice.stride,
                       ", offset ", slice.offset, ") is not a file and 0 <= offset < stride"));
    }
  }
  if (!o.inputs.empty()) {
    // The single-feature mode's options would be silently ignored.
    if (o.feature_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BatchReader reads named inputs; feature_size (", o.feature_size,
          ") is for the single-feature mode and must be 0 (each input has its own size)"));
    }
    if (o.image.known() || o.augment.enabled()) {
      return absl::InvalidArgumentError(
          "BatchReader reads named inputs; an image shape and augmentation are for the "
          "single-feature mode only");
    }
  } else if (o.feature_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchReader feature_size must be > 0; got ", o.feature_size));
  }
  if (o.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchReader batch_size must be > 0; got ", o.batch_size));
  }
  if (o.image.known() && o.image.size() != o.feature_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchReader image shape ", o.image.height, "x", o.image.width, "x",
                     o.image.channels, " does not hold feature_size ", o.feature_size, " values"));
  }
  if (o.augment.enabled() && !o.image.known()) {
    return absl::InvalidArgumentError(
        "BatchReader augmentation (random crop, flip) needs the input's image shape");
  }
  if (o.shuffle_buffer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchReader shuffle_buffer must be >= 0; got ", o.shuffle_buffer));
  }
  if (o.decode_threads < 1 || o.decode_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchReader decode_threads must be in [1, 256]; got ", o.decode_threads));
  }
  if (o.prefetch_depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchReader prefetch_depth must be >= 1; got ", o.prefetch_depth));
  }
  return absl::OkStatus();
}

std::string Resolve(const std::string& data_dir, const std::string& name) {
  if (data_dir.empty() || name.front() == '/') return name;
  return absl::StrCat(data_dir, absl::EndsWith(data_dir, "/") ? "" : "/", name);
}

// Runs fn(0..n-1) on the calling thread and `helpers` more threads, for
// decoding one batch's examples in parallel. Run() returns when every call has
// returned. Thread-safety: Run() is called from one thread at a time.
class DecodePool {
 public:
  explicit DecodePool(int helpers) {
    for (int i = 0; i < helpers; ++i) {
      threads_.emplace_back([this] {
        NameThisThread("data-decode");
        HelperLoop();
      });
    }
  }
  ~DecodePool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      work_.SignalAll();
    }
    for (std::thread& t : threads_) t.join();
  }
  DecodePool(const DecodePool&) = delete;
  DecodePool& operator=(const DecodePool&) = delete;

  void Run(int64_t n, const std::function<void(int64_t)>& fn) {
    if (threads_.empty() || n < 2) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      busy_ = static_cast<int>(threads_.size());
      ++generation_;
      work_.SignalAll();
    }
    Work(fn, n);
    absl::MutexLock lock(&mu_);
    while (busy_ > 0) done_.Wait(&mu_);
    fn_ = nullptr;
  }

 private:
  void Work(const std::function<void(int64_t)>& fn, int64_t n) {
    for (int64_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i);
  }

  void HelperLoop() {
    int64_t seen = 0;
    while (true) {
      const std::function<void(int64_t)>* fn;
      int64_t n;
      {
        absl::MutexLock lock(&mu_);
        while (!stop_ && generation_ == seen) work_.Wait(&mu_);
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        n = n_;
      }
      Work(*fn, n);
      absl::MutexLock lock(&mu_);
      if (--busy_ == 0) done_.Signal();
    }
  }

  absl::Mutex mu_;
  absl::CondVar work_;  // Signalled for a new generation or stop.
  absl::CondVar done_;  // Signalled when the last helper finishes a generation.
  const std::function<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;  // Helpers not yet done with this generation.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> next_{0};  // The next index to run.
  std::vector<std::thread> threads_;
};

// Runs assemble(set) for each set handed to it, one at a time in the order
// handed, on a thread of its own: a batch is decoded and queued while the
// producer reads the next one's records. Thread-compatible (the producer's).
class Assembler {
 public:
  explicit Assembler(std::function<absl::Status(int set)> assemble)
      : assemble_(std::move(assemble)), thread_([this] {
          NameThisThread("data-assemble");
          Loop();
        }) {}
  // Finishes the set handed last, then stops.
  ~Assembler() {
    {
      absl::MutexLock lock(&mu_);
      quit_ = true;
      work_.Signal();
    }
    thread_.join();
  }
  Assembler(const Assembler&) = delete;
  Assembler& operator=(const Assembler&) = delete;

  // Waits until the set handed last is assembled; the first error any
  // assembly returned (none is run after it).
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    while (handed_ >= 0) done_.Wait(&mu_);
    return status_;
  }
  // REQUIRES: Wait() returned OK since the last Hand.
  void Hand(int set) {
    absl::MutexLock lock(&mu_);
    handed_ = set;
    work_.Signal();
  }

 private:
  void Loop() {
    while (true) {
      int set;
      {
        absl::MutexLock lock(&mu_);
        while (!quit_ && handed_ < 0) work_.Wait(&mu_);
        if (handed_ < 0) return;
        set = handed_;
      }
      absl::Status assembled = assemble_(set);
      absl::MutexLock lock(&mu_);
      status_ = std::move(assembled);
      handed_ = -1;
      done_.Signal();
    }
  }

  const std::function<absl::Status(int)> assemble_;
  absl::Mutex mu_;
  absl::CondVar work_, done_;
  int handed_ ABSL_GUARDED_BY(mu_) = -1;  // The set handed and not yet assembled.
  bool quit_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Last: started once the rest is.
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ListRecordFiles(const std::string& pattern,
                                                         const std::string& data_dir) {
  if (pattern.empty()) return absl::InvalidArgumentError("the record file pattern is empty");
  const std::string resolved = Resolve(data_dir, pattern);
  // What glob prefixes to a relative pattern's matches.
  const size_t prefix = resolved.size() - pattern.size();
  glob_t matches;
  const int rc = glob(resolved.c_str(), GLOB_MARK, nullptr, &matches);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      const std::string path = matches.gl_pathv[i];
      if (absl::EndsWith(path, "/") || absl::EndsWith(path, ".tmp")) continue;
      files.push_back(path.substr(prefix));
    }
  }
  globfree(&matches);
  const std::string dir = data_dir.empty() ? "." : data_dir;
  if (rc == GLOB_ABORTED) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot list the directory of ", pattern, " (data dir ", dir, ")"));
  }
  if (rc == GLOB_NOSPACE) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory matching ", pattern));
  }
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no record files match ", pattern, " (data dir ", dir, ")"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<FileSlice> WholeFiles(const std::vector<std::string>& files) {
  std::vector<FileSlice> slices;
  for (const std::string& file : files) slices.push_back(FileSlice{file, 1, 0});
  return slices;
}

absl::StatusOr<std::unique_ptr<BatchReader>> BatchReader::Create(
    const BatchReaderOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  for (const FileSlice& slice : options.slices) {
    const std::string path = Resolve(options.data_dir, slice.file);
    if (access(path.c_str(), R_OK) != 0) {
      return absl::NotFoundError(
          absl::StrCat("record file ", path, " cannot be read: ", std::strerror(errno)));
    }
  }
  std::unique_ptr<const InputDecoder> input_decoder;
  if (!options.inputs.empty()) {
    absl::StatusOr<InputDecoder> decoder = InputDecoder::Create(options.inputs, options.label_key);
    if (!decoder.ok()) return Annotate(decoder.status(), "BatchReader inputs");
    input_decoder = std::make_unique<const InputDecoder>(*std::move(decoder));
  }
  std::unique_ptr<BatchReader> reader(new BatchReader(options));
  reader->input_decoder_ = std::move(input_decoder);
  reader->producer_ = std::thread([r = reader.get()] {
    NameThisThread("data-read");
    r->ProducerLoop();
  });
  return reader;
}

BatchReader::BatchReader(const BatchReaderOptions& options) : options_(options) {
  std::seed_seq seq{static_cast<uint32_t>(options.seed), static_cast<uint32_t>(options.seed >> 32),
                    static_cast<uint32_t>(options.stream),
                    static_cast<uint32_t>(options.stream >> 32)};
  rng_.seed(seq);
  // A generator of its own, so turning augmentation on keeps the order.
  std::seed_seq augment_seq{static_cast<uint32_t>(options.seed),
                            static_cast<uint32_t>(options.seed >> 32),
                            static_cast<uint32_t>(options.stream),
                            static_cast<uint32_t>(options.stream >> 32), 0x61756721u};
  augment_rng_.seed(augment_seq);
}

std::string BatchReader::PathOf(int i) const {
  return Resolve(options_.data_dir, options_.slices[i].file);
}

BatchReader::~BatchReader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    not_full_.SignalAll();
  }
  producer_.join();
}

absl::StatusOr<bool> BatchReader::Next(Batch* batch) {
  absl::MutexLock lock(&mu_);
  while (ready_.empty() && !finished_) not_empty_.Wait(&mu_);
  if (!ready_.empty()) {
    *batch = std::move(ready_.front());
    ready_.pop_front();
    not_full_.Signal();
    examples_read_.fetch_add(batch->size, std::memory_order_relaxed);
    return true;
  }
  if (!final_status_.ok()) return final_status_;
  return false;
}

int64_t BatchReader::queued_batches() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(ready_.size());
}

bool BatchReader::StopRequested() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void BatchReader::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  final_status_ = std::move(status);
  not_empty_.SignalAll();
}

bool BatchReader::PushBatch(Batch* batch) {
  absl::MutexLock lock(&mu_);
  while (!stop_ && static_cast<int64_t>(ready_.size()) >= options_.prefetch_depth) {
    not_full_.Wait(&mu_);
  }
  if (stop_) return false;
  ready_.push_back(std::move(*batch));
  not_empty_.Signal();
  return true;
}

void BatchReader::ProducerLoop() {
  const InputDecoder* const inputs = input_decoder_.get();
  // A batch being filled with records (their augmentation drawn in batch
  // order) or being assembled from them: decoded on the pool, the same
  // batches whatever its size. With inputs, each example is decoded apart
  // (sparse lengths vary), then placed once the batch's layout is known.
  struct Work {
    Batch batch;
    std::vector<PendingRecord> pending;
    std::vector<AugmentDraw> draws;
    std::vector<absl::Status> errors;
    std::vector<DecodedInputs> decoded;
  };
  auto new_batch = [&](Batch* b) {
    b->size = 0;
    b->features.assign(inputs != nullptr ? 0 : options_.batch_size * options_.feature_size, 0.0f);
    b->labels.assign(options_.batch_size, 0);
    b->inputs.clear();  // Laid out once the batch is decoded.
  };
  // Two, so one is filled while the other is assembled.
  Work sets[2];
  for (Work& w : sets) {
    new_batch(&w.batch);
    w.pending.resize(options_.batch_size);
    w.draws.resize(options_.batch_size);
    w.errors.resize(options_.batch_size);
    w.decoded.resize(inputs != nullptr ? options_.batch_size : 0);
  }
  ExampleFormat format;
  format.feature_key = options_.feature_key;
  format.label_key = options_.label_key;
  format.feature_size = options_.feature_size;
  format.image = options_.image;
  format.encoding = options_.encoding;
  const bool augment = options_.augment.enabled();
  DecodePool pool(options_.decode_threads - 1);
  Work* assembling = nullptr;  // The set the pool's calls below work on.
  // A record's payload checksum, checked as its batch is decoded rather
  // than by the reading thread (a click log's batch of records takes it a
  // millisecond); the error names the record as RecordReader's would.
  const auto damaged = [&](const PendingRecord& record) {
    return RecordReader::PayloadIntact(record.data, record.crc)
               ? absl::OkStatus()
               : RecordReader::PayloadCorrupt(PathOf(record.file), record.offset,
                                              record.compressed);
  };
  // The example in `slot` decoded into its batch.
  const auto decode_example = [&](Work& w, int64_t slot) -> absl::Status {
    if (inputs != nullptr) {
      RETURN_IF_ERROR(inputs->Decode(w.pending[slot].data, &w.decoded[slot]));
      w.batch.labels[slot] = w.decoded[slot].label;
      return absl::OkStatus();
    }
    float* features = w.batch.features.data() + slot * options_.feature_size;
    thread_local std::vector<float> unaugmented;
    if (augment) unaugmented.resize(options_.feature_size);
    RETURN_IF_ERROR(DecodeExample(w.pending[slot].data, format,
                                  augment ? unaugmented.data() : features, &w.batch.labels[slot]));
    if (augment) {
      ApplyAugmentation(options_.augment, w.draws[slot], options_.image, unaugmented.data(),
                        features);
    }
    return absl::OkStatus();
  };
  const std::function<void(int64_t)> decode = [&](int64_t slot) {
    Work& w = *assembling;
    const PendingRecord& record = w.pending[slot];
    w.errors[slot] = damaged(record);
    if (!w.errors[slot].ok()) return;
    absl::Status decoded = decode_example(w, slot);
    if (!decoded.ok()) {
      w.errors[slot] =
          Annotate(decoded, absl::StrCat("bad example in ", PathOf(record.file), " at offset ",
                                         record.offset,
                                         record.compressed ? " of its uncompressed stream" : ""));
    }
  };
  // Copies decoded examples to their places, a chunk of them per call: a
  // call per example would cost more in hand-offs than the copy.
  constexpr int64_t kPlaceChunk = 256;
  const std::function<void(int64_t)> place = [&](int64_t chunk) {
    Work& w = *assembling;
    const int64_t end = std::min(w.batch.size, (chunk + 1) * kPlaceChunk);
    for (int64_t e = chunk * kPlaceChunk; e < end; ++e) {
      inputs->PlaceExample(w.decoded[e], e, &w.batch.inputs);
    }
  };
  // Decodes a set's records into its batch (the first bad one is the
  // error) and queues it; on the assembling thread.
  Assembler assembler([&](int set) -> absl::Status {
    Work& w = sets[set];
    assembling = &w;
    pool.Run(w.batch.size, decode);
    for (int64_t slot = 0; slot < w.batch.size; ++slot) RETURN_IF_ERROR(w.errors[slot]);
    if (inputs != nullptr) {
      inputs->LayOutBatch(w.decoded.data(), w.batch.size, &w.batch.inputs);
      pool.Run((w.batch.size + kPlaceChunk - 1) / kPlaceChunk, place);
    }
    w.batch.features.resize(w.batch.size * options_.feature_size);
    w.batch.labels.resize(w.batch.size);
    if (!PushBatch(&w.batch)) return absl::CancelledError("BatchReader stopped");
    new_batch(&w.batch);
    return absl::OkStatus();
  });
  int filling = 0;
  // Hands the set being filled over once the other is queued.
  auto hand_over = [&]() -> absl::Status {
    RETURN_IF_ERROR(assembler.Wait());
    assembler.Hand(filling);
    filling = 1 - filling;
    return absl::OkStatus();
  };
  // Ends with `status`, after the batches handed over before it (or with
  // their error, which came first).
  auto end = [&](absl::Status status) {
    absl::Status assembled = assembler.Wait();
    Finish(assembled.ok() ? std::move(status) : std::move(assembled));
  };
  // Takes `record` (leaving the caller an old string to reuse).
  auto add = [&](PendingRecord& record) -> absl::Status {
    Work& w = sets[filling];
    const int64_t slot = w.batch.size;
    std::swap(w.pending[slot], record);
    if (augment) w.draws[slot] = DrawAugmentation(options_.augment, &augment_rng_);
    if (++w.batch.size == options_.batch_size) return hand_over();
    return absl::OkStatus();
  };

  std::vector<int> order(options_.slices.size());
  std::iota(order.begin(), order.end(), 0);
  const bool shuffle = options_.shuffle_buffer > 0;
  // A place in the shuffle buffer, drawn at random; and the one drawn for
  // the next record (-1: none yet), always while the buffer is full.
  auto draw_pick = [&] {
    return std::uniform_int_distribution<size_t>(0, shuffle_buffer_.size() - 1)(rng_);
  };
  int64_t next_pick = -1;
  int64_t records_kept = 0;
  // A reading error ends the run, unless a record read before it is
  // corrupt: its checksum is checked only once its batch is decoded, and
  // it may still wait in the batch being filled or the shuffle buffer.
  // Then that record's error, as if checked when it was read.
  auto read_failed = [&](absl::Status status) {
    int64_t first = -1;  // The read index of the earliest damaged one.
    auto check = [&](const PendingRecord& r) {
      if (first >= 0 && r.read > first) return;
      if (absl::Status bad = damaged(r); !bad.ok()) {
        first = r.read;
        status = std::move(bad);
      }
    };
    const Work& w = sets[filling];
    for (int64_t slot = 0; slot < w.batch.size; ++slot) check(w.pending[slot]);
    for (const PendingRecord& r : shuffle_buffer_) check(r);
    end(std::move(status));
  };
  PendingRecord record;
  while (true) {
    if (shuffle) std::shuffle(order.begin(), order.end(), rng_);
    int64_t kept = 0;
    for (int f : order) {
      if (StopRequested()) return end(absl::CancelledError("BatchReader stopped"));
      const FileSlice& slice = options_.slices[f];
      absl::StatusOr<std::unique_ptr<RecordReader>> reader =
          RecordReader::Open(PathOf(f), RecordReader::kDefaultBufferSize, options_.compression);
      if (!reader.ok()) return read_failed(reader.status());
      const bool compressed = (*reader)->compressed();
      for (int64_t index = 0;; ++index) {
        absl::StatusOr<bool> got = (*reader)->Read(&record.data, &record.crc);
        if (!got.ok()) return read_failed(got.status());
        if (!*got) break;
        if (index % slice.stride != slice.offset) continue;
        ++kept;
        record.read = records_kept++;
        record.file = f;
        record.offset = (*reader)->record_offset();
        record.compressed = compressed;
        if (!shuffle) {
          if (absl::Status added = add(record); !added.ok()) return end(added);
        } else if (static_cast<int64_t>(shuffle_buffer_.size()) < options_.shuffle_buffer) {
          shuffle_buffer_.push_back(std::move(record));
          record = PendingRecord();
        } else {
          // Emit a random buffered record and keep the new one in its place;
          // the swap reuses the evicted record's string for the next read.
          // The next record's pick is drawn now and its place fetched into
          // the cache while that record is read (a 100,000-record buffer
          // does not fit it); the draws are the same, in the same order.
          const size_t at = next_pick >= 0 ? static_cast<size_t>(next_pick) : draw_pick();
          next_pick = static_cast<int64_t>(draw_pick());
          const PendingRecord* next = &shuffle_buffer_[next_pick];
          __builtin_prefetch(next);
          __builtin_prefetch(reinterpret_cast<const char*>(next + 1) - 1);
          std::swap(shuffle_buffer_[at], record);
          if (absl::Status added = add(record); !added.ok()) return end(added);
        }
      }
    }
    // Drain the buffer so that each epoch is exactly one permutation of the
    // shard (the first pick drawn already if the buffer was full).
    while (!shuffle_buffer_.empty()) {
      const size_t at = next_pick >= 0 ? static_cast<size_t>(next_pick) : draw_pick();
      next_pick = -1;
      std::swap(shuffle_buffer_[at], shuffle_buffer_.back());
      absl::Status added = add(shuffle_buffer_.back());
      shuffle_buffer_.pop_back();
      if (!added.ok()) return end(added);
    }
    if (!options_.repeat) break;
    if (kept == 0) {
      return end(absl::FailedPreconditionError(
          absl::StrCat("the training data given to this worker (", options_.slices.size(), " file",
                       options_.slices.size() == 1 ? "" : "s", ", first ", PathOf(0),
                       ") holds no records; it cannot repeat forever")));
    }
  }
  // The last, short batch.
  if (sets[filling].batch.size > 0) {
    if (absl::Status handed = hand_over(); !handed.ok()) return end(handed);
  }
  end(absl::OkStatus());
}

}  // namespace data
}  // namespace downpour
