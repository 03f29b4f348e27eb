#include "control/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spec/job_validation.h"
#include "spec/limits.h"
#include "spec/memory_needs.h"
#include "spec/shard_map.h"

namespace downpour {
namespace control {
namespace {

// What a job holds on each of its workers and shards.
struct JobNeeds {
  int64_t worker = 0;
  std::vector<int64_t> shards;  // By shard index.
  std::vector<PartitionPlacement> partitions;
};

absl::StatusOr<JobNeeds> NeedsOf(const JobSpec& spec, const ScheduleOptions& options,
                                 const Placement* placed = nullptr) {
  JobNeeds needs;
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, ValidateJobSpec(spec));
  if (placed != nullptr) {
    needs.partitions.assign(placed->partitions().begin(), placed->partitions().end());
  } else {
    ASSIGN_OR_RETURN(needs.partitions,
                     PlacePartitions(params, spec.num_shards(), spec.partition_bytes()));
  }
  ASSIGN_OR_RETURN(needs.shards, ShardMemoryNeeds(spec, needs.partitions, options.checkpoints));
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec.model()));
  needs.worker =
      WorkerMemoryNeed(shape, spec.dataset().batch_size(), spec.gradient_wire_dtype() == INT8);
  return needs;
}

// Memory taken on each node and host by the jobs placed so far.
class MemoryLedger {
 public:
  explicit MemoryLedger(const std::vector<NodeInfo>& nodes) {
    for (const NodeInfo& node : nodes) {
      nodes_[node.id()] = &node;
      if (node.host_memory_bytes() <= 0) continue;
      // The smallest of what the host's daemons may use (their cgroups).
      const int64_t budget = static_cast<int64_t>(kHostMemoryShare * node.host_memory_bytes());
      auto [it, fresh] = host_budget_.emplace(node.hostname(), budget);
      if (!fresh) it->second = std::min(it->second, budget);
    }
  }

  void Take(const std::string& node_id, int64_t bytes) {
    node_used_[node_id] += bytes;
    auto node = nodes_.find(node_id);
    if (node != nodes_.end()) host_used_[node->second->hostname()] += bytes;
  }

  // Why `node` cannot take `bytes` more; nullopt when it can.
  std::optional<std::string> WhyNot(const NodeInfo& node, int64_t bytes) const {
    const int64_t used = Get(node_used_, node.id());
    if (node.memory_limit_bytes() > 0 && used + bytes > node.memory_limit_bytes()) {
      return absl::StrCat(
          node.role() == SHARD ? "shard " : "worker ", node.id(), " may hold ",
          ByteSize(node.memory_limit_bytes()),
          node.role() == SHARD ? " (its --memory_limit)" : " (its --device_memory_limit)",
          used > 0 ? absl::StrCat(", ", ByteSize(used), " of it taken") : "");
    }
    auto budget = host_budget_.find(node.hostname());
    if (budget == host_budget_.end()) return std::nullopt;
    const int64_t host_used = Get(host_used_, node.hostname());
    if (host_used + bytes <= budget->second) return std::nullopt;
    return absl::StrCat("the daemons on host ", node.hostname(), " may hold ",
                        ByteSize(budget->second), " together (",
                        static_cast<int>(kHostMemoryShare * 100), "% of its memory), ",
                        ByteSize(host_used), " of it taken");
  }

 private:
  static int64_t Get(const std::map<std::string, int64_t>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? 0 : it->second;
  }

  std::map<std::string, const NodeInfo*> nodes_;
  std::map<std::string, int64_t> host_budget_;
  std::map<std::string, int64_t> node_used_;
  std::map<std::string, int64_t> host_used_;
};

// A job's nodes, chosen in the candidates' order where they have room.
struct Choice {
  std::vector<std::string> shards, workers;
  // Why the first node or host passed over could not take its part.
  std::string short_of;
  // Every shard and at least the workers asked for were found.
  bool complete = false;
};

Choice Choose(const JobSpec& spec, const JobNeeds& needs,
              const std::vector<const NodeInfo*>& shards,
              const std::vector<const NodeInfo*>& workers, MemoryLedger* ledger, int min_workers) {
  Choice choice;
  auto pick = [&](const std::vector<const NodeInfo*>& candidates, int64_t need,
                  std::vector<std::string>* chosen) {
    for (const NodeInfo* node : candidates) {
      if (std::count(chosen->begin(), chosen->end(), node->id())) continue;
      if (std::optional<std::string> why = ledger->WhyNot(*node, need)) {
        if (choice.short_of.empty()) choice.short_of = *why;
        continue;
      }
      ledger->Take(node->id(), need);
      chosen->push_back(node->id());
      return true;
    }
    return false;
  };
  for (int i = 0; i < spec.num_shards(); ++i) {
    if (!pick(shards, needs.shards[i], &choice.shards)) return choice;
  }
  for (int rank = 0; rank < spec.num_workers(); ++rank) {
    if (!pick(workers, needs.worker, &choice.workers)) break;
  }
  choice.complete = static_cast<int>(choice.shards.size()) == spec.num_shards() &&
                    static_cast<int>(choice.workers.size()) >= min_workers;
  return choice;
}

// A SYNC job started short of workers: its workers take the missing ranks
// over (RankHandover::ShareWorkers), each at most ceil(ranks / workers) in
// all. Their replicas are reserved in `ledger`; where one does not fit the
// choice is not complete (the job waits rather than run and stand still).
void ReserveMissingRanks(const JobSpec& spec, const JobNeeds& needs,
                         const std::vector<const NodeInfo*>& workers, MemoryLedger* ledger,
                         Choice* choice) {
  const int chosen = static_cast<int>(choice->workers.size());
  if (spec.consistency().mode() != ConsistencySpec::SYNC || chosen == 0 ||
      chosen >= spec.num_workers()) {
    return;
  }
  const int64_t extra = (spec.num_workers() + chosen - 1) / chosen - 1;
  if (extra + 1 > kMaxRanksPerWorker) {
    choice->complete = false;
    choice->short_of = absl::StrCat("started on ", chosen, " of ", spec.num_workers(),
                                    " workers, each would train up to ", extra + 1,
                                    " ranks; a worker trains at most ", kMaxRanksPerWorker);
    return;
  }
  for (const std::string& id : choice->workers) {
    auto node = std::find_if(workers.begin(), workers.end(),
                             [&](const NodeInfo* n) { return n->id() == id; });
    if (node == workers.end()) continue;
    if (std::optional<std::string> why = ledger->WhyNot(**node, extra * needs.worker)) {
      choice->complete = false;
      choice->short_of =
          absl::StrCat("started on ", chosen, " of ", spec.num_workers(),
                       " workers, each would train up to ", extra + 1, " ranks: ", *why);
      return;
    }
    ledger->Take(id, extra * needs.worker);
  }
}

std::string Needs(const JobSpec& spec, const JobNeeds& needs) {
  return absl::StrCat("about ", ByteSize(needs.worker), " on each of its ", spec.num_workers(),
                      " workers and up to ",
                      ByteSize(*std::max_element(needs.shards.begin(), needs.shards.end())),
                      " on each of its ", spec.num_shards(), " shards");
}

// Takes what the RUNNING `jobs` hold into `ledger`; with `busy_workers` and
// `shard_load`, also their workers and how many jobs each shard serves.
void TakeRunning(const std::vector<const JobStatus*>& jobs, const ScheduleOptions& options,
                 MemoryLedger* ledger, std::set<std::string>* busy_workers = nullptr,
                 std::map<std::string, int>* shard_load = nullptr) {
  for (const JobStatus* job : jobs) {
    if (job->state() != RUNNING) continue;
    for (const auto& w : job->placement().worker_nodes()) {
      if (busy_workers != nullptr) busy_workers->insert(w);
    }
    for (const auto& s : job->placement().shard_nodes()) {
      if (shard_load != nullptr) ++(*shard_load)[s];
    }
    absl::StatusOr<JobNeeds> held = NeedsOf(job->spec(), options, &job->placement());
    if (!held.ok()) continue;  // Validated when it started.
    for (const auto& w : job->placement().worker_nodes()) ledger->Take(w, held->worker);
    for (int i = 0; i < job->placement().shard_nodes_size(); ++i) {
      if (i < static_cast<int>(held->shards.size())) {
        ledger->Take(job->placement().shard_nodes(i), held->shards[i]);
      }
    }
  }
}

}  // namespace

std::vector<ScheduleDecision> SchedulePending(const std::vector<const JobStatus*>& jobs,
                                              const std::vector<NodeInfo>& alive_nodes,
                                              const ScheduleOptions& options) {
  std::set<std::string> busy_workers;
  std::map<std::string, int> shard_load;
  MemoryLedger ledger(alive_nodes);
  TakeRunning(jobs, options, &ledger, &busy_workers, &shard_load);
  std::vector<ScheduleDecision> decisions;
  for (const JobStatus* job : jobs) {
    if (job->state() != PENDING) continue;
    ScheduleDecision decision;
    decision.job_id = job->id();
    std::vector<const NodeInfo*> workers, shards;
    int alive_workers = 0;
    for (const NodeInfo& node : alive_nodes) {
      if (node.role() == WORKER) {
        ++alive_workers;
        if (!busy_workers.count(node.id())) workers.push_back(&node);
      } else {
        shards.push_back(&node);
      }
    }
    const JobSpec& spec = job->spec();
    // A job that ran before does not wait forever for a worker that died:
    // after a while it goes on with those there are.
    const bool short_handed =
        job->attempt() >= 1 && options.short_start_after_ms > 0 &&
        options.now_ms >=
            std::max(job->pending_since_ms(), job->not_before_ms()) + options.short_start_after_ms;
    const int min_workers = short_handed ? 1 : spec.num_workers();
    if (static_cast<int>(workers.size()) < min_workers ||
        static_cast<int>(shards.size()) < spec.num_shards()) {
      decision.message = absl::StrCat("waiting for ", spec.num_workers(), " free workers (",
                                      workers.size(), " free of ", alive_workers, " alive) and ",
                                      spec.num_shards(), " shards (", shards.size(), " alive)");
      decisions.push_back(std::move(decision));
      continue;
    }
    // Validated at submission; a job stored by an older coordinator is
    // checked again here, as its partitions are derived.
    absl::StatusOr<JobNeeds> needs = NeedsOf(spec, options);
    if (!needs.ok()) {
      decision.action = ScheduleDecision::Action::kFail;
      decision.message = std::string(needs.status().message());
      decisions.push_back(std::move(decision));
      continue;
    }
    std::stable_sort(shards.begin(), shards.end(), [&](const NodeInfo* a, const NodeInfo* b) {
      return shard_load[a->id()] < shard_load[b->id()];
    });
    MemoryLedger trial = ledger;
    Choice choice = Choose(spec, *needs, shards, workers, &trial, min_workers);
    if (choice.complete) ReserveMissingRanks(spec, *needs, workers, &trial, &choice);
    if (!choice.complete) {
      decision.message =
          absl::StrCat("waiting for memory: it needs ", Needs(spec, *needs), "; ", choice.short_of);
      decisions.push_back(std::move(decision));
      continue;
    }
    ledger = std::move(trial);
    Placement& placement = decision.placement;
    for (const std::string& shard : choice.shards) {
      placement.add_shard_nodes(shard);
      ++shard_load[shard];
    }
    for (const std::string& worker : choice.workers) {
      placement.add_worker_nodes(worker);
      busy_workers.insert(worker);
    }
    while (placement.worker_nodes_size() < spec.num_workers()) placement.add_worker_nodes("");
    for (auto& p : needs->partitions) *placement.add_partitions() = std::move(p);
    decision.action = ScheduleDecision::Action::kStart;
    decisions.push_back(std::move(decision));
  }
  return decisions;
}

absl::Status CheckFits(const JobSpec& spec, const std::vector<NodeInfo>& nodes,
                       const ScheduleOptions& options) {
  std::vector<const NodeInfo*> workers, shards;
  for (const NodeInfo& node : nodes) (node.role() == WORKER ? workers : shards).push_back(&node);
  if (static_cast<int>(workers.size()) < spec.num_workers() ||
      static_cast<int>(shards.size()) < spec.num_shards()) {
    return absl::OkStatus();  // It waits for more nodes, which may be larger.
  }
  ASSIGN_OR_RETURN(JobNeeds needs, NeedsOf(spec, options));
  MemoryLedger ledger(nodes);
  const Choice choice = Choose(spec, needs, shards, workers, &ledger, spec.num_workers());
  if (choice.complete) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the job needs ", Needs(spec, needs),
      " (parameters, optimizer state and checkpoint copies on a shard; parameters, gradients "
      "and a batch's activations on a worker), more than the ",
      workers.size() + shards.size(),
      " registered nodes can hold with no other job running: ", choice.short_of,
      "; shrink the model or its batch, spread it over more shards (num_shards), or add nodes "
      "with more memory"));
}

std::optional<std::string> WhyNoRoomForAnotherRank(const JobStatus& job, const std::string& node_id,
                                                   const std::vector<const JobStatus*>& jobs,
                                                   const std::vector<NodeInfo>& alive_nodes,
                                                   const ScheduleOptions& options) {
  auto node = std::find_if(alive_nodes.begin(), alive_nodes.end(),
                           [&](const NodeInfo& n) { return n.id() == node_id; });
  if (node == alive_nodes.end()) {
    return absl::StrCat("worker ", node_id, " takes no new work (not alive, draining or cordoned)");
  }
  absl::StatusOr<JobNeeds> needs = NeedsOf(job.spec(), options, &job.placement());
  if (!needs.ok()) return std::string(needs.status().message());
  MemoryLedger ledger(alive_nodes);
  TakeRunning(jobs, options, &ledger);
  return ledger.WhyNot(*node, needs->worker);
}

}  // namespace control
}  // namespace downpour
