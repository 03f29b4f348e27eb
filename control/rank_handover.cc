#include "control/rank_handover.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spec/data_assignment.h"
#include "spec/limits.h"

namespace downpour {
namespace control {

RankHandover::RankHandover(Options options, JobHistory* history)
    : options_(std::move(options)), history_(history) {}

bool RankHandover::Unclaimed(const WorkerProgress& worker) {
  return worker.lost() && !worker.absorbed();
}

bool RankHandover::HasUnclaimed(const JobStatus& job) {
  return job.state() == RUNNING &&
         std::any_of(job.workers().begin(), job.workers().end(), Unclaimed);
}

int64_t RankHandover::StepOf(const JobStatus& job, const WorkerProgress& worker) {
  return std::max(worker.step(), job.resumed_from_step());
}

int RankHandover::EvaluatingRank(const JobStatus& job) {
  if (job.workers().empty()) return -1;
  if (!job.workers(0).lost()) return 0;
  for (const WorkerProgress& worker : job.workers()) {
    if (!worker.lost() && !worker.finished()) return worker.rank();
  }
  for (const WorkerProgress& worker : job.workers()) {
    if (!worker.lost()) return worker.rank();
  }
  return -1;
}

std::string RankHandover::WaitingFor(const JobStatus& job) const {
  std::vector<int> lost;
  for (const WorkerProgress& worker : job.workers()) {
    if (Unclaimed(worker)) lost.push_back(worker.rank());
  }
  if (lost.empty()) return "";
  const bool sync = job.spec().consistency().mode() == ConsistencySpec::SYNC;
  return absl::StrCat(
      "worker rank", lost.size() > 1 ? "s " : " ", absl::StrJoin(lost, ", "),
      " lost; waiting for a free worker to take ", lost.size() > 1 ? "them" : "it", " over (for ",
      absl::FormatDuration(options_.handover_wait), ", then ",
      sync ? "a worker of the job trains it beside its own rank"
           : absl::StrCat("the live ranks take ", lost.size() > 1 ? "their" : "its", " data"),
      ")");
}

std::string RankHandover::Untrained(const JobStatus& job) {
  std::vector<std::string> lost;
  for (const WorkerProgress& worker : job.workers()) {
    if (Unclaimed(worker)) {
      lost.push_back(absl::StrCat("rank ", worker.rank(), " from step ", StepOf(job, worker)));
    }
  }
  if (lost.empty()) return "";
  return absl::StrCat("without the data of worker ", absl::StrJoin(lost, ", "),
                      " (lost; no worker was free to take it over)");
}

bool RankHandover::AbsentAtShards(const JobStatus& job, const WorkerProgress& worker) const {
  if (worker.finished()) return true;
  // SYNC: never while lost, so that no step completes without the rank's
  // batch: its taker (a free worker, or one of the job's) trains it. A SYNC
  // rank absorbed is of a record from before ShareWorkers (its data went to
  // a live rank): the steps go on without it.
  return worker.lost() &&
         (job.spec().consistency().mode() != ConsistencySpec::SYNC || worker.absorbed());
}

bool RankHandover::Lose(JobStatus* job, int rank, const std::string& why) const {
  WorkerProgress* lost = job->mutable_workers(rank);
  if (lost->lost() || lost->finished()) return false;
  lost->set_lost(true);
  lost->set_lost_ms(absl::ToUnixMillis(options_.now()));
  lost->set_examples_per_sec(0);
  job->mutable_placement()->set_worker_nodes(rank, "");
  history_->AddEvent(
      job, absl::StrCat("worker rank ", rank, " lost at step ", StepOf(*job, *lost), ": ", why,
                        job->spec().consistency().mode() == ConsistencySpec::SYNC
                            ? "; its steps wait until a worker takes it over"
                            : "; the job goes on without it until a worker takes it "
                              "over"));
  job->set_message(WaitingFor(*job));
  return true;
}

bool RankHandover::AssignTakers(
    JobStatus* job, std::deque<std::string>* free,
    const std::function<absl::StatusOr<CheckpointRestore>()>& newest) const {
  // Once rank 0 has evaluated the job, its end does not wait for more.
  if (!HasUnclaimed(*job) || job->test_accuracy() >= 0 || free->empty()) return false;
  for (WorkerProgress& worker : *job->mutable_workers()) {
    if (!Unclaimed(worker) || free->empty()) continue;
    const std::string node = free->front();
    free->pop_front();
    TakeOver(job, &worker, node);
    history_->AddEvent(
        job, absl::StrCat("worker rank ", worker.rank(), " taken over by worker node ", node,
                          " from step ", StepOf(*job, worker)));
  }
  RecordRestore(job, newest);
  job->set_message(WaitingFor(*job));
  return true;
}

void RankHandover::TakeOver(JobStatus* job, WorkerProgress* worker, const std::string& node) {
  worker->set_lost(false);
  worker->set_lost_ms(0);
  worker->set_joined(true);
  worker->set_node_id(node);
  job->mutable_placement()->set_worker_nodes(worker->rank(), node);
}

void RankHandover::RecordRestore(JobStatus* job,
                                 const std::function<absl::StatusOr<CheckpointRestore>()>& newest) {
  // The takers load the workers' state (batch-norm statistics) of the
  // checkpoint the job records: the newest one, better than a fresh
  // model's for a rank 0 that evaluates soon.
  absl::StatusOr<CheckpointRestore> restore = newest();
  if (restore.ok()) *job->mutable_restore() = *std::move(restore);
}

namespace {

// The node training `worker`'s rank, "" while it is lost.
const std::string& NodeOf(const JobStatus& job, const WorkerProgress& worker) {
  return job.placement().worker_nodes(worker.rank());
}

}  // namespace

bool RankHandover::ShareWorkers(
    JobStatus* job,
    const std::function<std::optional<std::string>(const std::string&)>& why_no_room,
    const std::function<absl::StatusOr<CheckpointRestore>()>& newest) const {
  if (job->state() != RUNNING || job->spec().consistency().mode() != ConsistencySpec::SYNC ||
      job->test_accuracy() >= 0) {
    return false;
  }
  const int64_t now_ms = absl::ToUnixMillis(options_.now());
  const int64_t wait_ms = absl::ToInt64Milliseconds(options_.handover_wait);
  bool taken = false;
  std::string no_room;
  // A node takes at most one rank a call: `why_no_room` counts what the
  // job's record held before it (the next call sees the first one placed).
  std::set<std::string> given;
  for (WorkerProgress& lost : *job->mutable_workers()) {
    if (!Unclaimed(lost) || lost.lost_ms() + wait_ms > now_ms) continue;
    // The job's workers, those training the fewest of its ranks first
    // (then the lowest rank's), each asked once.
    std::map<std::string, int> ranks_held;
    std::vector<std::string> nodes;
    for (const WorkerProgress& worker : job->workers()) {
      if (worker.lost() || NodeOf(*job, worker).empty()) continue;
      if (ranks_held[NodeOf(*job, worker)]++ == 0) nodes.push_back(NodeOf(*job, worker));
    }
    std::stable_sort(nodes.begin(), nodes.end(), [&](const std::string& a, const std::string& b) {
      return ranks_held[a] < ranks_held[b];
    });
    std::string taker;
    for (const std::string& node : nodes) {
      if (given.count(node)) continue;
      if (ranks_held[node] >= kMaxRanksPerWorker) {
        if (no_room.empty()) {
          no_room = absl::StrCat("worker ", node, " trains ", ranks_held[node],
                                 " ranks, the most one worker trains");
        }
        continue;
      }
      std::optional<std::string> why = why_no_room(node);
      if (!why.has_value()) {
        taker = node;
        break;
      }
      if (no_room.empty()) no_room = *why;
    }
    if (taker.empty()) continue;
    given.insert(taker);
    std::vector<int> own;
    for (const WorkerProgress& worker : job->workers()) {
      if (!worker.lost() && NodeOf(*job, worker) == taker) own.push_back(worker.rank());
    }
    TakeOver(job, &lost, taker);
    taken = true;
    history_->AddEvent(
        job, absl::StrCat("worker rank ", lost.rank(), " not taken over within ",
                          absl::FormatDuration(options_.handover_wait),
                          " (no worker free): worker node ", taker, ", which trains rank",
                          own.size() > 1 ? "s " : " ", absl::StrJoin(own, ", "),
                          ", takes it over from step ", StepOf(*job, lost), " beside its own"));
  }
  std::string message = WaitingFor(*job);
  if (!message.empty() && !no_room.empty()) {
    absl::StrAppend(&message, "; no worker of the job has room for another rank: ", no_room);
  }
  if (!taken && message == job->message()) return false;
  if (taken) RecordRestore(job, newest);
  job->set_message(message);
  return true;
}

bool RankHandover::Absorb(JobStatus* job) const {
  if (job->state() != RUNNING || job->data_files().empty() ||
      job->spec().consistency().mode() == ConsistencySpec::SYNC) {
    return false;
  }
  const int64_t now_ms = absl::ToUnixMillis(options_.now());
  const int64_t wait_ms = absl::ToInt64Milliseconds(options_.handover_wait);
  bool absorbed = false;
  for (WorkerProgress& lost : *job->mutable_workers()) {
    if (!Unclaimed(lost) || lost.lost_ms() + wait_ms > now_ms) continue;
    // The live ranks still training, least loaded first.
    std::vector<WorkerProgress*> receivers;
    for (WorkerProgress& worker : *job->mutable_workers()) {
      if (!worker.lost() && !worker.finished()) receivers.push_back(&worker);
    }
    // With none, the data stays untrained (the job's end says so).
    if (receivers.empty()) break;
    std::stable_sort(receivers.begin(), receivers.end(),
                     [&](const WorkerProgress* a, const WorkerProgress* b) {
                       return a->data_size() < b->data_size();
                     });
    const std::vector<DataPart> parts(lost.data().begin(), lost.data().end());
    const std::vector<std::vector<DataPart>> dealt = DealParts(parts, receivers.size());
    // The rank's remaining steps go with its data, so the job makes as many
    // updates as it would have.
    const int64_t remaining = std::max<int64_t>(0, lost.steps() - lost.step());
    const int64_t count = static_cast<int64_t>(receivers.size());
    std::vector<std::string> to;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t extra = remaining / count + (i < remaining % count ? 1 : 0);
      if (dealt[i].empty() && extra == 0) continue;
      WorkerProgress& receiver = *receivers[i];
      for (const DataPart& part : dealt[i]) *receiver.add_data() = part;
      receiver.set_data_step(receiver.step());
      receiver.set_steps(receiver.steps() + extra);
      to.push_back(absl::StrCat(receiver.rank(), " (", dealt[i].size(), " parts",
                                extra > 0 ? absl::StrCat(", +", extra, " steps") : "", ")"));
    }
    lost.set_absorbed(true);
    lost.clear_data();
    absorbed = true;
    history_->AddEvent(
        job, absl::StrCat("worker rank ", lost.rank(), " not taken over within ",
                          absl::FormatDuration(options_.handover_wait), ": its data (",
                          parts.size(), " file part", parts.size() == 1 ? "" : "s",
                          remaining > 0 ? absl::StrCat(", ", remaining, " steps to go") : "",
                          ") handed to rank", to.size() == 1 ? " " : "s ", absl::StrJoin(to, ", "),
                          " from their current step"));
  }
  if (absorbed) job->set_message(WaitingFor(*job));
  return absorbed;
}

bool RankHandover::ReopenToEvaluate(JobStatus* job) const {
  if (job->state() != RUNNING || job->test_accuracy() >= 0 || job->workers().empty()) {
    return false;
  }
  // Rank 0 may yet be taken over within the wait.
  const WorkerProgress& first = job->workers(0);
  if (!Unclaimed(first) || first.lost_ms() + absl::ToInt64Milliseconds(options_.handover_wait) >
                               absl::ToUnixMillis(options_.now())) {
    return false;
  }
  const int rank = EvaluatingRank(*job);
  if (rank < 0) return false;
  WorkerProgress* evaluator = job->mutable_workers(rank);
  if (!evaluator->finished()) return false;
  evaluator->set_finished(false);
  evaluator->set_joined(true);
  history_->AddEvent(job, absl::StrCat("worker rank ", rank,
                                       " evaluates the job (rank 0 was lost after the others "
                                       "finished): it runs again from step ",
                                       evaluator->step(), " to do it"));
  return true;
}

void RankHandover::ShareDataFiles(JobStatus* job) {
  if (job->data_files().empty()) return;
  const std::vector<std::vector<DataPart>> shares =
      ShareData(std::vector<std::string>(job->data_files().begin(), job->data_files().end()),
                job->workers_size());
  for (WorkerProgress& worker : *job->mutable_workers()) {
    worker.mutable_data()->Assign(shares[worker.rank()].begin(), shares[worker.rank()].end());
    worker.set_data_step(0);
  }
}

absl::StatusOr<bool> RankHandover::TakeListing(JobStatus* job,
                                               const ReportProgressRequest& request) const {
  if (!job->data_files().empty()) return false;
  // With fewer files than ranks every rank's share names every file: the
  // shares are num_workers times the listing, in the job's record and each
  // worker's Task.
  size_t listed = 0;
  for (const std::string& file : request.data_files()) listed += file.size();
  const bool whole = request.data_files_size() >= job->workers_size();
  const size_t shares = whole ? listed : listed * job->workers_size();
  if (shares > kMaxDataShareBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training data's shares would name ", shares, " bytes of files (",
        request.data_files_size(), " files matching ", job->spec().dataset().train_files(),
        " among ", job->workers_size(), " ranks); the limit is ", kMaxDataShareBytes >> 20,
        " MiB: use at least as many files as workers, or shorter paths"));
  }
  job->mutable_data_files()->CopyFrom(request.data_files());
  ShareDataFiles(job);
  history_->AddEvent(
      job,
      absl::StrCat("training data: ", job->data_files_size(), " record file",
                   job->data_files_size() == 1 ? "" : "s", " matching ",
                   job->spec().dataset().train_files(), " (listed by worker ", request.node_id(),
                   "), ", whole ? "whole files round-robin" : "each file's records round-robin",
                   " shared among ", job->workers_size(), " ranks"));
  return true;
}

}  // namespace control
}  // namespace downpour
