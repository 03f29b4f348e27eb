// Reading IDX files (the format of MNIST and Fashion-MNIST, plain or gzip
// compressed) and importing an image/label pair of them into sharded record
// files of tensorflow.Example.
//
// IDX layout: magic {0, 0, type, ndims}, then ndims big-endian uint32
// dimensions, then the elements in row-major order. Only unsigned bytes
// (type 0x08) are supported, as in MNIST-style data sets.
//
// Thread-safety: IdxReader is not thread-safe; ImportIdx may run concurrently
// with different output paths. Ownership: IdxReader owns its file handle.
#ifndef DOWNPOUR_DATA_IDX_H_
#define DOWNPOUR_DATA_IDX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace downpour {
namespace data {

// Sequential reader of one IDX file. Files are opened with zlib's gzopen, which
// reads gzip-compressed and plain files alike.
class IdxReader {
 public:
  // Opens `path` and validates its header: the magic number must name unsigned
  // bytes and exactly `expected_dims` dimensions, all of them positive.
  static absl::StatusOr<std::unique_ptr<IdxReader>> Open(const std::string& path,
                                                         int expected_dims);

  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;
  ~IdxReader();

  // dims()[0] is the number of items; the rest is the shape of one item.
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t num_items() const { return dims_[0]; }
  // Bytes per item: the product of dims()[1..].
  int64_t item_size() const { return item_size_; }
  const std::string& path() const { return path_; }

  // Reads the next `count` items into `out` (count * item_size() bytes).
  // Reading past num_items() or a file shorter than its header says is an error.
  absl::Status ReadItems(int64_t count, uint8_t* out);

  // Reads the next item into `*item`, resized to item_size() bytes, with the
  // errors of ReadItems. The buffer grows only as the item's bytes arrive: a
  // header may declare items of up to 1 GiB that the file does not hold, and
  // a truncated file is then reported having taken about as much memory as
  // it has bytes. Passing the same buffer for the next items reuses it.
  absl::Status ReadItem(std::vector<uint8_t>* item);

  // Returns an error if bytes follow the last item. REQUIRES: all items read.
  absl::Status CheckAtEnd();

 private:
  IdxReader(std::string path, void* file);
  // OutOfRange unless `count` more items remain.
  absl::Status CheckRemaining(int64_t count) const;
  // DataLoss: the file ended `got` bytes into the items being read.
  absl::Status Truncated(int64_t got) const;

  const std::string path_;
  void* file_;  // gzFile, kept opaque so zlib.h stays out of this header.
  std::vector<int64_t> dims_;
  int64_t item_size_ = 1;
  int64_t items_read_ = 0;
};

struct IdxImportOptions {
  std::string images_path;  // IDX with 3 dimensions: count, rows, cols.
  std::string labels_path;  // IDX with 1 dimension: count.
  std::string out_dir;      // Created (with parents) if missing.
  std::string name = "data";
  int num_shards = 1;
  int64_t limit = 0;  // Import at most this many examples; 0 = all.
};

// Returns "<name>-<index>-of-<num_shards>.tfrecord", both numbers 5 digits.
std::string ShardFileName(const std::string& name, int index, int num_shards);

// Converts an IDX image/label pair into `num_shards` record files
// `out_dir/ShardFileName(name, i, num_shards)`, example k going to shard
// k % num_shards (round robin, so every shard gets a similar class mix and
// similar size). Each record is EncodeImageExample(image, label, {rows, cols, 1}).
// Shards appear only once complete. Returns the number of examples written.
absl::StatusOr<int64_t> ImportIdx(const IdxImportOptions& options);

}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_IDX_H_
