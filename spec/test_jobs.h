// Job specs for tests: small, valid, and the same wherever a test needs "a
// job" rather than a particular model. Test-only (testonly in BUILD).
#ifndef DOWNPOUR_SPEC_TEST_JOBS_H_
#define DOWNPOUR_SPEC_TEST_JOBS_H_

#include "proto/job.pb.h"

namespace downpour {

// An MLP over 8 features (dense 16, ReLU, dense 3, softmax cross-entropy:
// four parameter tensors), record files "train-*" and "test-*", batch 4,
// SGD at 0.1, 10 steps, SYNC, with `num_workers` workers and `num_shards`
// shards. Defaults are not applied.
JobSpec SmallMlpJob(int num_workers, int num_shards);

// A model with one sparse table: input "c" (SPARSE), embedding "e" (100 rows
// of 4, on the shards), dense 2, softmax cross-entropy.
ModelSpec SmallSparseModel();

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_TEST_JOBS_H_
