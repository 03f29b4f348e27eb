// The safetensors file format (https://github.com/huggingface/safetensors),
// which PyTorch, JAX and NumPy load directly: an 8-byte little-endian header
// length N, N bytes of JSON (for each tensor its dtype, shape and
// [begin, end) byte offsets into the data; an optional "__metadata__" map of
// strings), then the tensors' bytes, little endian, packed in offset order.
// Checkpoints and exports are written in it.
//
// Thread-safety: WriteSafetensors is thread-safe; a SafetensorsFile is
// immutable after Open and may be read from several threads. Ownership: a
// SafetensorsFile owns the file's bytes; the views it returns stay valid for
// its lifetime. The writer does not retain what it is given.
#ifndef DOWNPOUR_COMMON_SAFETENSORS_H_
#define DOWNPOUR_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace downpour {

enum class TensorDtype { kF32, kF64, kF16, kBF16, kI64, kI32, kU8 };

// "F32", "BF16", ...; and back (InvalidArgument for another name).
const char* TensorDtypeName(TensorDtype dtype);
absl::StatusOr<TensorDtype> ParseTensorDtype(absl::string_view name);
int TensorDtypeBytes(TensorDtype dtype);

// A tensor to write. The bytes are the caller's.
struct TensorToWrite {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;  // {} for a scalar.
  const void* data = nullptr;  // product(shape) * TensorDtypeBytes(dtype) bytes.
};

// What was written: the file's size and the CRC32C of all of it (a manifest
// records both).
struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// The bytes of a safetensors file of `tensors`, in order, and `metadata`
// (small files sent over the network). InvalidArgument as WriteSafetensors.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata);

// Tensor bytes from which WriteSafetensors writes around the page cache
// (AtomicFile::Caching::kBypass): checkpoints, exports.
inline constexpr uint64_t kUncachedFileBytes = uint64_t{8} << 20;

// Writes `tensors`, in order, and `metadata` to `path` atomically (a
// temporary file, fsynced, renamed; common/file.h), from where the tensors'
// bytes are (no copy of the whole file). InvalidArgument for a repeated or
// empty name or a negative dimension; the filesystem's error otherwise.
absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path,
                                             const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata);

// A safetensors file read whole and checked: the header is well-formed, every
// dtype known, every tensor's bytes match its shape, and the tensors cover
// the data exactly, without gaps, overlaps or trailing bytes. Anything else
// is DataLoss naming the file and what is wrong.
class SafetensorsFile {
 public:
  struct Tensor {
    TensorDtype dtype = TensorDtype::kF32;
    std::vector<int64_t> shape;
    absl::string_view data;
  };

  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // The same check over bytes already in memory; `name` names them in errors.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, std::string name);

  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;

  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // NotFound naming the file and the tensor.
  absl::StatusOr<Tensor> Get(const std::string& name) const;
  // The tensor as floats; InvalidArgument unless it is F32 with `elements`
  // elements.
  absl::StatusOr<const float*> Floats(const std::string& name, int64_t elements) const;

 private:
  SafetensorsFile() = default;

  std::string name_;
  // Shared so moving the object keeps the tensors' views valid.
  std::shared_ptr<const std::string> bytes_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SAFETENSORS_H_
