// Fuzzes the IDX importer (data/idx.h, `downpourctl dataset import`) over an
// image file and a label file cut from the input:
//
//   byte 0      options: bits 0-1 num_shards - 1, bits 2-4 the limit (0: all)
//   bytes 1-2   little-endian length of the image file (cut to what is left)
//   then        the image file, then the label file (each plain or gzip)
//
// Invariants beyond "no crash": an error has a message; a successful import
// wrote exactly the examples it reports, each a valid Example whose image has
// the declared rows x cols bytes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/example.h"
#include "data/idx.h"
#include "data/record_io.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/scratch_file.h"

namespace downpour {
namespace {

// Reads back what a successful import wrote; returns the number of examples.
int64_t CountImported(const data::IdxImportOptions& options, int64_t item_size) {
  int64_t examples = 0;
  std::vector<float> pixels(item_size);
  for (int s = 0; s < options.num_shards; ++s) {
    const std::string path =
        options.out_dir + "/" + data::ShardFileName(options.name, s, options.num_shards);
    auto reader = data::RecordReader::Open(path);
    FUZZ_CHECK(reader.ok(), reader.status().ToString());
    std::string record;
    while (true) {
      absl::StatusOr<bool> more = (*reader)->Read(&record);
      FUZZ_CHECK(more.ok(), more.status().ToString());
      if (!*more) break;
      int32_t label = -1;
      const absl::Status decoded =
          data::DecodeExample(record, "image", "label", item_size, pixels.data(), &label);
      FUZZ_CHECK(decoded.ok() && label >= 0 && label < 256, decoded.ToString());
      ++examples;
    }
  }
  return examples;
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t images_size = std::min<size_t>(data[1] | (data[2] << 8), size - 3);
  downpour::data::IdxImportOptions options;
  options.num_shards = 1 + (data[0] & 3);
  options.limit = (data[0] >> 2) & 7;
  options.images_path = downpour::fuzz::WriteScratchFile("images.idx", data + 3, images_size);
  options.labels_path = downpour::fuzz::WriteScratchFile("labels.idx", data + 3 + images_size,
                                                         size - 3 - images_size);
  options.out_dir = downpour::fuzz::ScratchDir() + "/out";
  absl::StatusOr<int64_t> imported = downpour::data::ImportIdx(options);
  if (!imported.ok()) {
    FUZZ_CHECK(!imported.status().message().empty(), imported.status().ToString());
    return 0;
  }
  auto images = downpour::data::IdxReader::Open(options.images_path, 3);
  FUZZ_CHECK(images.ok(), images.status().ToString());
  const int64_t examples = downpour::CountImported(options, (*images)->item_size());
  FUZZ_CHECK(examples == *imported, "read back ", examples, " of ", *imported, " examples");
  return 0;
}
