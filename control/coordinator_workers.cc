// CoordinatorState's handling of a job's workers and of nodes that leave a
// running job: the coordinator shares the record files out to the ranks; a
// job goes on without a worker that died, restarted or drained, and its
// rank — its share of the data, where it had got to — goes to the next free
// worker, or, when none takes it within handover_wait, its data is dealt
// out to the live ranks; an
// ASYNC/SSP job that loses a shard has only that shard's partitions
// restored, on a spare; a job on a draining shard takes a checkpoint and
// moves off it.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "control/checkpoints.h"
#include "control/coordinator_state.h"
#include "spec/data_assignment.h"
#include "spec/limits.h"

namespace downpour {
namespace control {

absl::Status CoordinatorState::LoseWorker(const JobStatus& job, int rank, const std::string& why) {
  const WorkerProgress& worker = job.workers(rank);
  if (worker.lost() || worker.finished()) return absl::OkStatus();
  JobStatus updated = job;
  WorkerProgress* lost = updated.mutable_workers(rank);
  lost->set_lost(true);
  lost->set_lost_ms(absl::ToUnixMillis(options_.now()));
  lost->set_examples_per_sec(0);
  updated.mutable_placement()->set_worker_nodes(rank, "");
  AddEvent(&updated, absl::StrCat("worker rank ", rank, " lost at step ", worker.step(), ": ", why,
                                  "; the job goes on without it until a worker takes it over"));
  updated.set_message(WaitingFor(updated));
  return Commit(std::move(updated), /*durable=*/true);
}

namespace {

// Lost and neither taken over nor absorbed yet.
bool Unclaimed(const WorkerProgress& worker) { return worker.lost() && !worker.absorbed(); }

}  // namespace

int CoordinatorState::CheckpointRank(const JobStatus& job) {
  for (const WorkerProgress& worker : job.workers()) {
    if (!worker.lost() && (!worker.finished() || worker.rank() == 0)) return worker.rank();
  }
  return -1;
}

std::string CoordinatorState::WaitingFor(const JobStatus& job) {
  std::vector<int> lost;
  for (const WorkerProgress& worker : job.workers()) {
    if (Unclaimed(worker)) lost.push_back(worker.rank());
  }
  if (lost.empty()) return "";
  return absl::StrCat("worker rank", lost.size() > 1 ? "s " : " ", absl::StrJoin(lost, ", "),
                      " lost; waiting for a free worker to take ", lost.size() > 1 ? "them" : "it",
                      " over", lost[0] == 0 ? " (rank 0 evaluates the job at its end)" : "");
}

std::string CoordinatorState::Untrained(const JobStatus& job) {
  std::vector<std::string> lost;
  for (const WorkerProgress& worker : job.workers()) {
    if (Unclaimed(worker)) {
      lost.push_back(absl::StrCat("rank ", worker.rank(), " from step ", worker.step()));
    }
  }
  if (lost.empty()) return "";
  return absl::StrCat("without the data of worker ", absl::StrJoin(lost, ", "),
                      " (lost; no worker was free to take it over)");
}

void CoordinatorState::AssignLostRanks() {
  auto has_lost = [](const JobStatus& job) {
    return job.state() == RUNNING &&
           std::any_of(job.workers().begin(), job.workers().end(), Unclaimed);
  };
  if (std::none_of(jobs_.begin(), jobs_.end(),
                   [&](const auto& entry) { return has_lost(entry.second); })) {
    return;
  }
  // Workers busy with a running job's rank.
  std::set<std::string> busy;
  for (const auto& [id, job] : jobs_) {
    if (job.state() != RUNNING) continue;
    for (const std::string& node : job.placement().worker_nodes()) busy.insert(node);
  }
  std::vector<std::string> free;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == WORKER && Alive(node) && node.heard && !node.draining &&
        !node.info.cordoned() && !busy.count(id)) {
      free.push_back(id);
    }
  }
  for (const std::string& id : job_order_) {
    if (free.empty()) return;
    const JobStatus& job = jobs_[id];
    // Once rank 0 has evaluated the job, its end does not wait for more.
    if (!has_lost(job) || job.test_accuracy() >= 0) continue;
    JobStatus updated = job;
    for (WorkerProgress& worker : *updated.mutable_workers()) {
      if (!Unclaimed(worker) || free.empty()) continue;
      const std::string node = free.front();
      free.erase(free.begin());
      worker.set_lost(false);
      worker.set_lost_ms(0);
      worker.set_joined(true);
      worker.set_node_id(node);
      updated.mutable_placement()->set_worker_nodes(worker.rank(), node);
      AddEvent(&updated, absl::StrCat("worker rank ", worker.rank(), " taken over by worker node ",
                                      node, " from step ", worker.step()));
    }
    // The joiners load the workers' state (batch-norm statistics) of the
    // checkpoint the job records: the newest one, better than a fresh
    // model's for a rank 0 that evaluates soon.
    std::vector<std::string> refused;
    absl::StatusOr<CheckpointRestore> newest = NewestCheckpoint(job, &refused);
    if (newest.ok()) *updated.mutable_restore() = *std::move(newest);
    updated.set_message(WaitingFor(updated));
    absl::Status written = Commit(std::move(updated), /*durable=*/true);
    const std::string what = absl::StrCat("the hand-over of job ", id, "'s lost ranks");
    if (!written.ok()) {
      LogWriteFailure(what, written);
      return;
    }
    write_failures_.erase(what);
  }
}

void CoordinatorState::AbsorbLostRanks() {
  const int64_t now_ms = absl::ToUnixMillis(options_.now());
  const int64_t wait_ms = absl::ToInt64Milliseconds(options_.handover_wait);
  for (const std::string& id : job_order_) {
    const JobStatus& job = jobs_[id];
    if (job.state() != RUNNING || job.data_files().empty()) continue;
    JobStatus updated = job;
    bool absorbed = false;
    for (WorkerProgress& lost : *updated.mutable_workers()) {
      // Rank 0 evaluates the job at its end: it waits for a taker.
      if (!Unclaimed(lost) || lost.rank() == 0 || lost.lost_ms() + wait_ms > now_ms) continue;
      // The live ranks still training, least loaded first.
      const bool sync = job.spec().consistency().mode() == ConsistencySpec::SYNC;
      std::vector<WorkerProgress*> receivers;
      for (WorkerProgress& worker : *updated.mutable_workers()) {
        if (!worker.lost() && !worker.finished()) receivers.push_back(&worker);
      }
      // With none, the data stays untrained (the job's end says so).
      if (receivers.empty()) break;
      auto batches = [](const WorkerProgress* w) { return std::max(1, w->batches_per_step()); };
      std::stable_sort(receivers.begin(), receivers.end(),
                       [&](const WorkerProgress* a, const WorkerProgress* b) {
                         return std::make_pair(batches(a), a->data_size()) <
                                std::make_pair(batches(b), b->data_size());
                       });
      // SYNC: one rank takes the lost one's data and its batches a step, so
      // every step still averages as many examples as in a clean run.
      if (sync) {
        receivers.resize(1);
        receivers[0]->set_batches_per_step(batches(receivers[0]) + batches(&lost));
      }
      const std::vector<DataPart> parts(lost.data().begin(), lost.data().end());
      const std::vector<std::vector<DataPart>> dealt = DealParts(parts, receivers.size());
      // ASYNC/SSP: the rank's remaining steps go with its data, so the job
      // makes as many updates as it would have (a SYNC step is every
      // worker's: it has none of its own).
      const int64_t steps = job.spec().steps();
      const int64_t remaining =
          sync ? 0 : std::max<int64_t>(0, (lost.steps() > 0 ? lost.steps() : steps) - lost.step());
      std::vector<std::string> to;
      for (size_t i = 0; i < receivers.size(); ++i) {
        const int64_t extra =
            remaining / static_cast<int64_t>(receivers.size()) +
            (static_cast<int64_t>(i) < remaining % static_cast<int64_t>(receivers.size()) ? 1 : 0);
        if (dealt[i].empty() && extra == 0) continue;
        WorkerProgress& receiver = *receivers[i];
        for (const DataPart& part : dealt[i]) *receiver.add_data() = part;
        receiver.set_data_step(receiver.step());
        if (extra > 0)
          receiver.set_steps((receiver.steps() > 0 ? receiver.steps() : steps) + extra);
        to.push_back(absl::StrCat(
            receiver.rank(), " (", dealt[i].size(), " parts",
            extra > 0 ? absl::StrCat(", +", extra, " steps") : "",
            sync ? absl::StrCat(", ", receiver.batches_per_step(), " batches a step") : "", ")"));
      }
      lost.set_absorbed(true);
      lost.clear_data();
      absorbed = true;
      AddEvent(&updated,
               absl::StrCat("worker rank ", lost.rank(), " not taken over within ",
                            absl::FormatDuration(options_.handover_wait), ": its data (",
                            parts.size(), " file part", parts.size() == 1 ? "" : "s",
                            remaining > 0 ? absl::StrCat(", ", remaining, " steps to go") : "",
                            ") handed to rank", to.size() == 1 ? " " : "s ",
                            absl::StrJoin(to, ", "), " from their current step"));
    }
    if (!absorbed) continue;
    updated.set_message(WaitingFor(updated));
    absl::Status written = Commit(std::move(updated), /*durable=*/true);
    const std::string what = absl::StrCat("the hand-over of job ", id, "'s lost ranks' data");
    if (!written.ok()) {
      LogWriteFailure(what, written);
      continue;
    }
    write_failures_.erase(what);
  }
}

void CoordinatorState::ShareDataFiles(JobStatus* job) {
  if (job->data_files().empty()) return;
  const std::vector<std::vector<DataPart>> shares =
      ShareData(std::vector<std::string>(job->data_files().begin(), job->data_files().end()),
                job->workers_size());
  for (WorkerProgress& worker : *job->mutable_workers()) {
    worker.mutable_data()->Assign(shares[worker.rank()].begin(), shares[worker.rank()].end());
    worker.set_data_step(0);
  }
}

absl::StatusOr<ReportProgressResponse> CoordinatorState::AssignData(
    const JobStatus& job, int rank, const ReportProgressRequest& request) {
  if (job.data_files().empty()) {
    // With fewer files than ranks every rank's share names every file: the
    // shares are num_workers times the listing, in the job's record and
    // each worker's Task.
    size_t listed = 0;
    for (const std::string& file : request.data_files()) listed += file.size();
    const bool whole = request.data_files_size() >= job.workers_size();
    const size_t shares = whole ? listed : listed * job.workers_size();
    if (shares > kMaxDataShareBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the training data's shares would name ", shares, " bytes of files (",
          request.data_files_size(), " files matching ", job.spec().dataset().train_files(),
          " among ", job.workers_size(), " ranks); the limit is ", kMaxDataShareBytes >> 20,
          " MiB: use at least as many files as workers, or shorter paths"));
    }
    JobStatus updated = job;
    updated.mutable_data_files()->CopyFrom(request.data_files());
    ShareDataFiles(&updated);
    AddEvent(
        &updated,
        absl::StrCat("training data: ", updated.data_files_size(), " record file",
                     updated.data_files_size() == 1 ? "" : "s", " matching ",
                     job.spec().dataset().train_files(), " (listed by worker ", request.node_id(),
                     "), ", whole ? "whole files round-robin" : "each file's records round-robin",
                     " shared among ", updated.workers_size(), " ranks"));
    RETURN_IF_ERROR(Commit(std::move(updated), /*durable=*/true));
  }
  const WorkerProgress& worker = jobs_[job.id()].workers(rank);
  ReportProgressResponse response;
  *response.mutable_data() = worker.data();
  response.set_data_step(worker.data_step());
  return response;
}

absl::StatusOr<bool> CoordinatorState::ReplaceShard(const JobStatus& job, int index,
                                                    const std::string& why) {
  if (job.spec().consistency().mode() == ConsistencySpec::SYNC || !Saves(job)) return false;
  // A shard alive and free of this job, with a checkpoint root.
  const auto& shards = job.placement().shard_nodes();
  std::string spare;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == SHARD && node.info.checkpoints() && Alive(node) && node.heard &&
        !node.draining && !node.info.cordoned() &&
        std::find(shards.begin(), shards.end(), id) == shards.end()) {
      spare = id;
      break;
    }
  }
  if (spare.empty()) return false;
  std::vector<std::string> refused;
  absl::StatusOr<CheckpointRestore> restore = NewestCheckpoint(job, &refused);
  if (!restore.ok()) return false;
  JobStatus updated = job;
  for (const std::string& reason : refused) AddEvent(&updated, absl::StrCat("refused ", reason));
  updated.mutable_placement()->set_shard_nodes(index, spare);
  // The spare hosts shard `index` from the checkpoint; the other shards keep
  // their partitions as they are; every worker continues its rank at its
  // last reported step, through the new placement.
  *updated.mutable_restore() = *restore;
  for (WorkerProgress& worker : *updated.mutable_workers()) {
    if (!worker.lost() && !worker.finished()) worker.set_joined(true);
  }
  AddEvent(
      &updated,
      absl::StrCat(why, ": shard ", index, "'s partitions restored from the checkpoint at step ",
                   restore->step(), " on shard node ", spare, "; the other shards keep theirs (",
                   ConsistencySpec::Mode_Name(job.spec().consistency().mode()), ")"));
  RETURN_IF_ERROR(Commit(std::move(updated), /*durable=*/true));
  pending_checkpoints_.erase(job.id());
  return true;
}

void CoordinatorState::DrainShard(const std::string& node_id) {
  for (const std::string& id : job_order_) {
    const JobStatus& job = jobs_[id];
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
      if (updated.checkpoint_requested_ms() == 0) {
        updated.set_checkpoint_requested_ms(absl::ToUnixMillis(options_.now()));
      }
      AddEvent(&updated, absl::StrCat("shard node ", node_id,
                                      " is draining: the job moves off it after a checkpoint"));
      written = Commit(std::move(updated), /*durable=*/true);
      if (written.ok()) drains_[id] = Drain{node_id, options_.now()};
    }
    if (!written.ok()) LogWriteFailure(absl::StrCat("the drain of job ", id), written);
  }
}

void CoordinatorState::TickDrains() {
  for (auto it = drains_.begin(); it != drains_.end();) {
    const JobStatus& job = jobs_[it->first];
    if (job.state() != RUNNING) {
      it = drains_.erase(it);
      continue;
    }
    const bool saved = !job.checkpoints().empty() && job.checkpoints().rbegin()->time_ms() >=
                                                         absl::ToUnixMillis(it->second.began);
    // With no rank to take checkpoints, none will come.
    const bool none_coming = CheckpointRank(job) < 0;
    const bool overdue =
        none_coming || options_.now() - it->second.began > options_.checkpoint_timeout;
    if (!saved && !overdue) {
      ++it;
      continue;
    }
    absl::Status moved = FailOrRestart(job,
                                       absl::StrCat("shard node ", it->second.node_id, " drained",
                                                    saved ? "" : " (no checkpoint came in time)"),
                                       /*diverged=*/false, /*moved=*/true);
    if (!moved.ok()) {
      LogWriteFailure(absl::StrCat("the move of job ", it->first), moved);
      ++it;
      continue;
    }
    it = drains_.erase(it);
  }
}

}  // namespace control
}  // namespace downpour
