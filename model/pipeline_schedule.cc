#include "model/pipeline_schedule.h"

#include <algorithm>

namespace downpour {

std::vector<StagePass> StageSchedule(PipelineSpec::Schedule schedule, int stages, int stage,
                                     int micro_batches) {
  std::vector<StagePass> passes;
  if (schedule == PipelineSpec::GPIPE) {
    for (int j = 0; j < micro_batches; ++j) passes.push_back({true, j});
    for (int j = 0; j < micro_batches; ++j) passes.push_back({false, j});
    return passes;
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) passes.push_back({true, forward});
  for (; forward < micro_batches; ++forward, ++backward) {
    passes.push_back({true, forward});
    passes.push_back({false, backward});
  }
  for (; backward < micro_batches; ++backward) passes.push_back({false, backward});
  return passes;
}

int InFlight(PipelineSpec::Schedule schedule, int stages, int stage, int micro_batches) {
  if (schedule == PipelineSpec::GPIPE) return micro_batches;
  return std::max(1, std::min(stages - stage, micro_batches));
}

}  // namespace downpour
