// How much memory a job needs where it runs, from its spec: what the
// coordinator admits and places a job against (control/scheduler.h), and
// what a shard reserves when it hosts one (ps/parameter_store.cc) — one
// formula for both.
//
// A shard holds, per element of its partitions, the value and the
// optimizer's slots (twice when checkpoints are on: the spare copy a capture
// borrows) and, in SYNC, the step's sum and the previous version's values
// (ps/parameter_store.h); per sparse table with max_rows, its
// rows at most (a table without a bound grows with the data, under the
// shard's --memory_limit). A worker holds its model replica: about two
// copies of the parameters (values and gradients; the exchange's staging is
// of the same order) and, per example of its batch, every layer's output
// and its gradient. The worker's figure is an estimate for admission: the
// worker's own allocator enforces its budget exactly.
//
// Thread-compatible pure functions.
#ifndef DOWNPOUR_SPEC_MEMORY_NEEDS_H_
#define DOWNPOUR_SPEC_MEMORY_NEEDS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "spec/model_shape.h"

namespace downpour {

// The optimizer's slots per element: SGD 0, MOMENTUM and ADAGRAD 1, ADAM 2
// (the arrays kernels::NumOptimizerSlots gives the shard's optimizer).
int OptimizerSlots(OptimizerSpec::Kind kind);

// Bytes shard `shard` reserves for its `partitions` of a job whose optimizer
// has `slots` slots; `int8_pulls`: a SYNC job pulled as INT8 changes (the
// published copy and its last change, JobSpec.parameter_wire_dtype).
int64_t ShardPartitionBytes(const std::vector<PartitionPlacement>& partitions, int shard, int slots,
                            bool checkpoints, bool sync, bool int8_pulls = false);

// What each of the job's shards holds (index = shard), dense partitions and
// bounded sparse tables. REQUIRES: `spec` validated (ApplyJobDefaults).
absl::StatusOr<std::vector<int64_t>> ShardMemoryNeeds(
    const JobSpec& spec, const std::vector<PartitionPlacement>& partitions, bool checkpoints);

// About what one worker holds for a replica of the model with a batch of
// `batch` examples; `int8_gradients`: with gradients pushed as INT8 (each
// element's carry and its encoding, JobSpec.gradient_wire_dtype).
int64_t WorkerMemoryNeed(const ModelShape& shape, int64_t batch, bool int8_gradients = false);

// "1.5 GiB", "300.0 MiB", "12.0 KiB": sizes in sentences.
std::string ByteSize(int64_t bytes);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_MEMORY_NEEDS_H_
