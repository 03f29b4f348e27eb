// The coordinator's scheduling: which pending jobs start now, on which nodes.
// Jobs start in submission order (FIFO) as soon as enough alive workers are
// free (a worker runs one job at a time, but may train a second rank of
// its SYNC job: RankHandover) and enough shards are alive (shards
// are shared; a job's shards are the least loaded ones that have room). A
// started job gets its worker ranks, its shard indices and the placement of
// its parameter partitions over those shards (spec/shard_map.h).
//
// Memory: a job is placed only where it fits (spec/memory_needs.h has what
// it needs): each node's own budget (NodeInfo.memory_limit_bytes) and each
// host's, kHostMemoryShare of what its daemons may use
// (NodeInfo.host_memory_bytes), shared by every job placed on the nodes of
// that hostname. A job that does not fit now waits, saying why; CheckFits
// tells at submission whether it could fit at all.
//
// Pure functions of the jobs and the alive nodes, so they are tested without
// a coordinator; CoordinatorState applies the decisions. Thread-safe.
#ifndef DOWNPOUR_CONTROL_SCHEDULER_H_
#define DOWNPOUR_CONTROL_SCHEDULER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

// The share of a host's memory the jobs placed on its nodes may hold
// together: the rest is the processes' own (code, buffers, the OS's).
inline constexpr double kHostMemoryShare = 0.8;

struct ScheduleOptions {
  // Whether shards keep checkpoint copies of what they hold (the
  // coordinator has a checkpoint root).
  bool checkpoints = false;
  // Now, and how long a job that ran before (restarting, resumed) waits for
  // all its workers once PENDING: after that it starts with the free ones
  // (at least one), the missing ranks left without a worker (SYNC: its
  // workers take them over, and it starts only where their replicas fit;
  // ASYNC/SSP: their data is dealt to the others). 0: it waits for all.
  int64_t now_ms = 0;
  int64_t short_start_after_ms = 0;
};

// What to do with one pending job.
struct ScheduleDecision {
  enum class Action {
    kWait,   // Not enough free nodes or memory: `message` says what it waits for.
    kStart,  // Start it with `placement`.
    kFail,   // It cannot be placed (`message` says why).
  };
  std::string job_id;
  Action action = Action::kWait;
  std::string message;
  Placement placement;
};

// Decisions for every PENDING job of `jobs` (in submission order), given the
// alive nodes. A started job's placement names a worker for every rank, ""
// for a rank left without one (ScheduleOptions::short_start_after_ms). RUNNING jobs' workers are
// busy and their memory taken; a job started by an earlier decision counts as running for the later
// ones.
std::vector<ScheduleDecision> SchedulePending(const std::vector<const JobStatus*>& jobs,
                                              const std::vector<NodeInfo>& alive_nodes,
                                              const ScheduleOptions& options = {});

// Whether a job of `spec` could be placed on `nodes` with no other job
// running: ResourceExhausted, saying what it needs and which node or host
// cannot hold it, when the nodes are enough in number but not in memory; OK
// otherwise (with too few nodes it waits for more). REQUIRES: `spec`
// validated.
absl::Status CheckFits(const JobSpec& spec, const std::vector<NodeInfo>& nodes,
                       const ScheduleOptions& options = {});

// Why worker `node_id` cannot hold one more replica of running `job`'s model
// (a SYNC rank no free worker took over, trained beside the node's own:
// RankHandover::ShareWorkers), with `jobs` running on `alive_nodes`;
// nullopt when it can.
std::optional<std::string> WhyNoRoomForAnotherRank(const JobStatus& job, const std::string& node_id,
                                                   const std::vector<const JobStatus*>& jobs,
                                                   const std::vector<NodeInfo>& alive_nodes,
                                                   const ScheduleOptions& options = {});

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_SCHEDULER_H_
