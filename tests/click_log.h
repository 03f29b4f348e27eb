// A generated click log (data/ctr_generator.h) in a fresh directory, for the
// tests that train click models through the daemons.
#ifndef DOWNPOUR_TESTS_CLICK_LOG_H_
#define DOWNPOUR_TESTS_CLICK_LOG_H_

#include <cstdint>
#include <string>

#include "data/ctr_generator.h"

namespace downpour {
namespace testing {

struct ClickLog {
  std::string data_dir;  // Holds ctr/ctr-{train,test}-*-of-00004.tfrecord.
  data::CtrDatasetSummary summary;
};

// Writes `train` and `test` examples (seed 7, 4 shards a split) whose 26
// vocabularies grow from `min_vocabulary` to `max_vocabulary`; a failure is
// a test failure (and an empty summary).
ClickLog MakeClickLog(int64_t train, int64_t test, int64_t min_vocabulary, int64_t max_vocabulary);

}  // namespace testing
}  // namespace downpour

#endif  // DOWNPOUR_TESTS_CLICK_LOG_H_
