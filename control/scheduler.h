// The coordinator's scheduling: which pending jobs start now, on which nodes.
// Jobs start in submission order (FIFO) as soon as enough alive workers are
// free (a worker runs one job at a time) and enough shards are alive (shards
// are shared; a job's shards are the least loaded ones). A started job gets
// its worker ranks, its shard indices and the placement of its parameter
// partitions over those shards (spec/shard_map.h).
//
// A pure function of the jobs and the alive nodes, so it is tested without
// a coordinator; CoordinatorState applies its decisions. Thread-safe.
#ifndef DOWNPOUR_CONTROL_SCHEDULER_H_
#define DOWNPOUR_CONTROL_SCHEDULER_H_

#include <string>
#include <vector>

#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

// What to do with one pending job.
struct ScheduleDecision {
  enum class Action {
    kWait,   // Not enough free nodes: `message` says what it waits for.
    kStart,  // Start it with `placement`.
    kFail,   // It cannot be placed (`message` says why).
  };
  std::string job_id;
  Action action = Action::kWait;
  std::string message;
  Placement placement;
};

// Decisions for every PENDING job of `jobs` (in submission order), given the
// alive nodes. RUNNING jobs' workers are busy and their shards loaded; a job
// started by an earlier decision counts as running for the later ones.
std::vector<ScheduleDecision> SchedulePending(const std::vector<const JobStatus*>& jobs,
                                              const std::vector<NodeInfo>& alive_nodes);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_SCHEDULER_H_
