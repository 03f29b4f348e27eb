// Scratch files for fuzz targets whose parser reads a path (record files, IDX
// files): each input is written to a file of the process's own, in a private
// directory made once under $TEST_TMPDIR, $TMPDIR or /tmp (scripts/fuzz.sh
// points TMPDIR at a tmpfs where there is one, so writes cost no disk I/O).
//
// Thread-compatible: a fuzz target runs one input at a time. The directory is
// left behind when the process ends (a crash would leave it anyway); it holds
// only the last input's files.
#ifndef DOWNPOUR_FUZZ_SCRATCH_FILE_H_
#define DOWNPOUR_FUZZ_SCRATCH_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace downpour {
namespace fuzz {

// The private scratch directory, made on first use. Aborts if it cannot be
// made: the target cannot run at all without it.
const std::string& ScratchDir();

// Writes `size` bytes at `data` to ScratchDir()/`name` (replacing it) and
// returns the path. Aborts on a write error, for the same reason.
std::string WriteScratchFile(const std::string& name, const uint8_t* data, size_t size);

}  // namespace fuzz
}  // namespace downpour

#endif  // DOWNPOUR_FUZZ_SCRATCH_FILE_H_
