#include "control/scheduler.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"

namespace downpour {
namespace control {

std::vector<ScheduleDecision> SchedulePending(const std::vector<const JobStatus*>& jobs,
                                              const std::vector<NodeInfo>& alive_nodes) {
  std::set<std::string> busy_workers;
  std::map<std::string, int> shard_load;
  for (const JobStatus* job : jobs) {
    if (job->state() != RUNNING) continue;
    for (const auto& w : job->placement().worker_nodes()) busy_workers.insert(w);
    for (const auto& s : job->placement().shard_nodes()) ++shard_load[s];
  }
  std::vector<ScheduleDecision> decisions;
  for (const JobStatus* job : jobs) {
    if (job->state() != PENDING) continue;
    ScheduleDecision decision;
    decision.job_id = job->id();
    std::vector<std::string> workers, shards;
    int alive_workers = 0;
    for (const NodeInfo& node : alive_nodes) {
      if (node.role() == WORKER) {
        ++alive_workers;
        if (!busy_workers.count(node.id())) workers.push_back(node.id());
      } else {
        shards.push_back(node.id());
      }
    }
    const JobSpec& spec = job->spec();
    if (static_cast<int>(workers.size()) < spec.num_workers() ||
        static_cast<int>(shards.size()) < spec.num_shards()) {
      decision.message = absl::StrCat("waiting for ", spec.num_workers(), " free workers (",
                                      workers.size(), " free of ", alive_workers, " alive) and ",
                                      spec.num_shards(), " shards (", shards.size(), " alive)");
      decisions.push_back(std::move(decision));
      continue;
    }
    // Validated at submission; a job stored by an older coordinator is
    // checked again here, as its partitions are derived.
    auto params = ValidateJobSpec(spec);
    auto placed = params.ok() ? PlacePartitions(*params, spec.num_shards(), spec.partition_bytes())
                              : params.status();
    if (!placed.ok()) {
      decision.action = ScheduleDecision::Action::kFail;
      decision.message = std::string(placed.status().message());
      decisions.push_back(std::move(decision));
      continue;
    }
    std::stable_sort(shards.begin(), shards.end(),
                     [&](const auto& a, const auto& b) { return shard_load[a] < shard_load[b]; });
    Placement& placement = decision.placement;
    for (int i = 0; i < spec.num_shards(); ++i) {
      placement.add_shard_nodes(shards[i]);
      ++shard_load[shards[i]];
    }
    for (int rank = 0; rank < spec.num_workers(); ++rank) {
      placement.add_worker_nodes(workers[rank]);
      busy_workers.insert(workers[rank]);
    }
    for (auto& p : *placed) *placement.add_partitions() = std::move(p);
    decision.action = ScheduleDecision::Action::kStart;
    decisions.push_back(std::move(decision));
  }
  return decisions;
}

}  // namespace control
}  // namespace downpour
