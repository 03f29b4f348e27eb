// Helpers shared by the data/ tests: fresh temporary directories under
// TEST_TMPDIR and small record files. Test-only; not thread-safe.
#ifndef DOWNPOUR_DATA_TEST_UTIL_H_
#define DOWNPOUR_DATA_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "data/example.h"

namespace downpour {
namespace data {
namespace testing {

// Creates and returns an empty directory unique to this call, under TEST_TMPDIR
// (or /tmp when run outside Bazel).
std::string NewTempDir();

// The checked-in data/testdata directory in the test's runfiles (the
// :testdata filegroup must be in the test's `data`).
std::string TestDataDir();

std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& contents);

// Writes `records` to `path` with RecordWriter, failing the test on error.
void WriteRecordsOrDie(const std::string& path, const std::vector<std::string>& records);

// An image example whose `n` pixels all equal `id % 256` and whose label is `id`,
// so that a decoded example can be traced back to the record it came from.
std::string TaggedExample(int64_t id, int64_t n);

// The inputs of a model of the click log that data/ctr_generator writes:
// sparse "C1".."C<sparse>" (each its own feature, at most `max_ids` ids) and
// "dense", the features "I1".."I<dense>" of one value each.
std::vector<InputFormat> CtrInputFormats(int sparse = 26, int dense = 13, int max_ids = 3);

}  // namespace testing
}  // namespace data
}  // namespace downpour

#endif  // DOWNPOUR_DATA_TEST_UTIL_H_
