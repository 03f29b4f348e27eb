// Fuzzes the TFRecord reader (data/record_io.h) over a file holding the
// input's bytes, read to its end or first error the way the worker's input
// pipeline reads a shard: with the reader's own detection of GZIP (kAuto,
// what the worker uses by default) and forced uncompressed (kNone), each with
// a read buffer smaller than most records (so refills land mid-header and
// mid-payload) and with one larger than the file.
//
// Invariants beyond "no crash": a damaged file is DataLoss naming the file;
// errors are sticky; a record is never longer than kMaxRecordLength.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "data/record_io.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/scratch_file.h"

namespace downpour {
namespace {

void ReadAll(const std::string& path, size_t buffer_size, data::Compression compression) {
  absl::StatusOr<std::unique_ptr<data::RecordReader>> reader =
      data::RecordReader::Open(path, buffer_size, compression);
  if (!reader.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(reader.status()), reader.status().ToString());
    return;
  }
  std::string record;
  int64_t last_offset = -1;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Read(&record);
    if (!more.ok()) {
      FUZZ_CHECK(absl::IsDataLoss(more.status()) &&
                     more.status().message().find(path) != absl::string_view::npos,
                 more.status().ToString());
      absl::StatusOr<bool> again = (*reader)->Read(&record);
      FUZZ_CHECK(!again.ok() && again.status() == more.status(), "the error is not sticky");
      return;
    }
    if (!*more) return;
    FUZZ_CHECK(record.size() <= data::kMaxRecordLength, record.size());
    FUZZ_CHECK((*reader)->record_offset() > last_offset, "the offset went back");
    last_offset = (*reader)->record_offset();
  }
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using downpour::data::Compression;
  const std::string path = downpour::fuzz::WriteScratchFile("records", data, size);
  // The small buffer varies with the input (1 to 32 bytes).
  const size_t small = 1 + size % 32;
  for (Compression compression : {Compression::kAuto, Compression::kNone}) {
    downpour::ReadAll(path, small, compression);
    downpour::ReadAll(path, size_t{64} << 10, compression);
  }
  return 0;
}
