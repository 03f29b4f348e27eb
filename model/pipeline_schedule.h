// The order in which each stage of a pipeline runs the forward and backward
// passes of a step's micro-batches (PipelineSpec.schedule), and how many
// micro-batches' activations it holds at once. Each stage runs its
// micro-batches' forward passes in order 0, 1, ..., and their backward
// passes in the same order.
//
// ONE_F_ONE_B (PipeDream-Flush): stage s of p runs min(p - s - 1, m)
// forward passes first, then alternates one forward, one backward, then the
// backward passes left; it holds at most min(p - s, m) micro-batches.
// GPIPE: every forward pass, then every backward pass; it holds all m.
// Both leave each GPU idle (p - 1) / (m + p - 1) of a step of equal stages.
//
// Pure functions; thread-safe.
#ifndef DOWNPOUR_MODEL_PIPELINE_SCHEDULE_H_
#define DOWNPOUR_MODEL_PIPELINE_SCHEDULE_H_

#include <vector>

#include "proto/job.pb.h"

namespace downpour {

struct StagePass {
  bool forward = true;
  int micro_batch = 0;
  bool operator==(const StagePass& other) const {
    return forward == other.forward && micro_batch == other.micro_batch;
  }
};

// Stage `stage`'s passes over `micro_batches` micro-batches in a pipeline of
// `stages`. REQUIRES: 0 <= stage < stages, micro_batches >= 1.
std::vector<StagePass> StageSchedule(PipelineSpec::Schedule schedule, int stages, int stage,
                                     int micro_batches);

// The most micro-batches stage `stage` holds between their forward and
// backward passes; micro-batch j uses activation set j % InFlight(...).
int InFlight(PipelineSpec::Schedule schedule, int stages, int stage, int micro_batches);

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_PIPELINE_SCHEDULE_H_
