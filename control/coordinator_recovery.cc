// CoordinatorState's recovery: what happens to running jobs when a node
// leaves. A dead, restarted or drained worker's rank is handed on
// (RankHandover); a lost shard's ASYNC/SSP job moves its partitions to a
// spare, any other job restarts from its newest checkpoint; a draining
// shard's jobs take a checkpoint and move off it.
#include <algorithm>
#include <deque>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "control/coordinator_state.h"

namespace downpour {
namespace control {

absl::Status CoordinatorState::FailJobsOfNode(const std::string& node_id, const std::string& why) {
  absl::Status first;
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    if (job.state() != RUNNING) continue;
    const auto& workers = job.placement().worker_nodes();
    if (std::count(workers.begin(), workers.end(), node_id) > 0) {
      // Every rank the node trains (two where it took a lost one over);
      // each loss commits a new record.
      const int ranks = workers.size();
      for (int rank = 0; rank < ranks; ++rank) {
        if (jobs_.Find(id)->placement().worker_nodes(rank) != node_id) continue;
        first.Update(LoseWorker(*jobs_.Find(id), rank, why));
      }
      continue;
    }
    const auto& shards = job.placement().shard_nodes();
    auto shard = std::find(shards.begin(), shards.end(), node_id);
    if (shard == shards.end()) continue;
    absl::StatusOr<bool> replaced =
        ReplaceShard(job, static_cast<int>(shard - shards.begin()), why);
    if (!replaced.ok()) {
      first.Update(replaced.status());
    } else if (!*replaced) {
      first.Update(FailOrRestart(job, why, /*diverged=*/false));
    }
  }
  return first;
}

absl::Status CoordinatorState::LoseWorker(const JobStatus& job, int rank, const std::string& why) {
  JobStatus updated = job;
  if (!handover_.Lose(&updated, rank, why)) return absl::OkStatus();
  return jobs_.Commit(std::move(updated), /*durable=*/true);
}

absl::StatusOr<bool> CoordinatorState::ReplaceShard(const JobStatus& job, int index,
                                                    const std::string& why) {
  if (job.spec().consistency().mode() == ConsistencySpec::SYNC || !Saves(job)) return false;
  // A shard that may take work, with a checkpoint root, free of this job.
  const auto& shards = job.placement().shard_nodes();
  std::string spare;
  for (const NodeInfo& node : nodes_.Available()) {
    if (node.role() == SHARD && node.checkpoints() &&
        std::find(shards.begin(), shards.end(), node.id()) == shards.end()) {
      spare = node.id();
      break;
    }
  }
  if (spare.empty()) return false;
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> restore = checkpoints_.NewestCheckpoint(job, &refused);
  if (!restore.ok()) return false;
  JobStatus updated = job;
  for (const std::string& reason : refused) {
    history_.AddEvent(&updated, absl::StrCat("refused ", reason));
  }
  updated.mutable_placement()->set_shard_nodes(index, spare);
  // The spare hosts shard `index` from the checkpoint; the other shards keep
  // their partitions as they are; every worker continues its rank at its
  // last reported step, through the new placement.
  *updated.mutable_restore() = *restore;
  for (WorkerProgress& worker : *updated.mutable_workers()) {
    if (!worker.lost() && !worker.finished()) worker.set_joined(true);
  }
  history_.AddEvent(
      &updated,
      absl::StrCat(why, ": shard ", index, "'s partitions restored from the checkpoint at step ",
                   restore->step(), " on shard node ", spare, "; the other shards keep theirs (",
                   ConsistencySpec::Mode_Name(job.spec().consistency().mode()), ")"));
  RETURN_IF_ERROR(jobs_.Commit(std::move(updated), /*durable=*/true));
  checkpoints_.Forget(job.id());
  return true;
}

void CoordinatorState::HandOverLostRanks() {
  const std::vector<std::string> ids = jobs_.Ids();
  const bool any_lost = std::any_of(ids.begin(), ids.end(), [&](const std::string& id) {
    return RankHandover::HasUnclaimed(*jobs_.Find(id));
  });
  if (any_lost) {
    // Free workers: available and not busy with a running job's rank.
    std::set<std::string> busy;
    for (const std::string& id : ids) {
      const JobStatus& job = *jobs_.Find(id);
      if (job.state() != RUNNING) continue;
      busy.insert(job.placement().worker_nodes().begin(), job.placement().worker_nodes().end());
    }
    std::deque<std::string> free;
    for (const NodeInfo& node : nodes_.Available()) {
      if (node.role() == WORKER && !busy.count(node.id())) free.push_back(node.id());
    }
    for (const std::string& id : ids) {
      if (free.empty()) break;
      const JobStatus& job = *jobs_.Find(id);
      if (!RankHandover::HasUnclaimed(job)) continue;
      JobStatus updated = job;
      const auto newest = [&] {
        std::vector<std::string> refused;
        return checkpoints_.NewestCheckpoint(job, &refused);
      };
      if (!handover_.AssignTakers(&updated, &free, newest)) continue;
      const absl::Status written = jobs_.Commit(std::move(updated), /*durable=*/true);
      NoteWrite(absl::StrCat("the hand-over of job ", id, "'s lost ranks"), written);
      if (!written.ok()) break;
    }
  }
  std::vector<const JobStatus*> running;
  for (const std::string& id : ids) running.push_back(jobs_.Find(id));
  const std::vector<NodeInfo> available = nodes_.Available();
  for (const std::string& id : ids) {
    const JobStatus& job = *jobs_.Find(id);
    if (!RankHandover::HasUnclaimed(job)) continue;
    JobStatus updated = job;
    // SYNC: one of the job's workers trains the rank beside its own.
    const auto why_no_room = [&](const std::string& node) {
      return WhyNoRoomForAnotherRank(job, node, running, available, Placing());
    };
    const auto newest = [&] {
      std::vector<std::string> refused;
      return checkpoints_.NewestCheckpoint(job, &refused);
    };
    const bool shared = handover_.ShareWorkers(&updated, why_no_room, newest);
    // ASYNC/SSP: rank 0 lost after the others finished: a finished rank
    // evaluates; the rank's data and steps go to the live ranks.
    const bool reopened = handover_.ReopenToEvaluate(&updated);
    if (!handover_.Absorb(&updated) && !reopened && !shared) continue;
    NoteWrite(absl::StrCat("the hand-over of job ", id, "'s lost ranks"),
              jobs_.Commit(std::move(updated), /*durable=*/true));
  }
}

void CoordinatorState::DrainShard(const std::string& node_id) {
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    const auto& shards = job.placement().shard_nodes();
    if (job.state() != RUNNING ||
        std::find(shards.begin(), shards.end(), node_id) == shards.end()) {
      continue;
    }
    absl::Status written;
    if (!Saves(job)) {
      written = FailOrRestart(
          job, absl::StrCat("shard node ", node_id, " drained; the job has no checkpoints"),
          /*diverged=*/false, /*moved=*/true);
    } else {
      JobStatus updated = job;
      const int64_t step = job.step();
      if (updated.checkpoint_requested_ms() == 0) {
        updated.set_checkpoint_requested_ms(absl::ToUnixMillis(options_.now()));
      }
      history_.AddEvent(&updated, absl::StrCat("shard node ", node_id,
                                               " is draining: the job moves off it after a "
                                               "checkpoint"));
      written = jobs_.Commit(std::move(updated), /*durable=*/true);
      if (written.ok()) checkpoints_.BeginDrain(id, node_id, step);
    }
    NoteWrite(absl::StrCat("the drain of job ", id), written);
  }
}

void CoordinatorState::TickDrains() {
  const auto find = [this](const std::string& id) { return jobs_.Find(id); };
  for (const CheckpointOrchestrator::DrainDue& due : checkpoints_.DueDrains(find)) {
    absl::Status moved =
        FailOrRestart(*jobs_.Find(due.job_id),
                      absl::StrCat("shard node ", due.node_id, " drained",
                                   due.saved ? "" : " (no checkpoint came in time)"),
                      /*diverged=*/false, /*moved=*/true);
    NoteWrite(absl::StrCat("the move of job ", due.job_id), moved);
    if (moved.ok()) checkpoints_.EndDrain(due.job_id);
  }
}

void CoordinatorState::JudgeAbsentees() {
  for (const std::string& id : jobs_.Ids()) {
    const JobStatus& job = *jobs_.Find(id);
    if (job.state() != RUNNING) continue;
    std::vector<std::string> unheard;
    std::optional<absl::Time> back;  // When the last of the others returned.
    for (const auto* nodes : {&job.placement().shard_nodes(), &job.placement().worker_nodes()}) {
      for (const std::string& node : *nodes) {
        if (node.empty()) continue;  // A lost rank's.
        std::optional<absl::Time> heard = nodes_.HeardSince(node);
        if (!heard.has_value()) {
          unheard.push_back(node);
        } else if (!back.has_value() || *heard > *back) {
          back = heard;
        }
      }
    }
    if (!back.has_value()) continue;
    for (const std::string& node : unheard) nodes_.JudgeFrom(node, *back);
  }
}

void CoordinatorState::DetectDeadNodes() {
  for (const auto& [id, why] : nodes_.Silent()) {
    // Its jobs end first; the node counts as dead once that is recorded.
    absl::Status failed = FailJobsOfNode(id, why);
    if (failed.ok()) {
      failed = nodes_.MarkDead(id);
      if (failed.ok()) Log(absl::StrCat("lost ", why));
    }
    NoteWrite(absl::StrCat("the death of node ", id), failed);
  }
}

}  // namespace control
}  // namespace downpour
