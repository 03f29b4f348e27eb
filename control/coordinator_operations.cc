// CoordinatorState's operator tools: describe (with the progress history),
// delete, cordon (an operator's drain) and uncordon, the jobs' log lines,
// and retention of ended jobs and dead nodes.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "control/coordinator_state.h"
#include "control/request_limits.h"

namespace downpour {
namespace control {
namespace {

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

bool Names(const google::protobuf::RepeatedPtrField<std::string>& nodes, const std::string& id) {
  return std::find(nodes.begin(), nodes.end(), id) != nodes.end();
}

}  // namespace

absl::StatusOr<JobDescription> CoordinatorState::DescribeJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
  JobDescription description;
  *description.mutable_job() = *job;
  for (const ProgressPoint& point : progress_[job_id]) *description.add_progress() = point;
  return description;
}

absl::Status CoordinatorState::RemoveJob(const std::string& job_id) {
  RETURN_IF_ERROR(store_->DeleteJob(job_id));
  jobs_.erase(job_id);
  job_order_.erase(std::remove(job_order_.begin(), job_order_.end(), job_id), job_order_.end());
  last_persisted_.erase(job_id);
  pending_checkpoints_.erase(job_id);
  settled_checkpoint_.erase(job_id);
  drains_.erase(job_id);
  job_logs_.erase(job_id);
  progress_.erase(job_id);
  if (tensorboard_) tensorboard_->CloseJob(job_id);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status CoordinatorState::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckJobIdArgument(job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobStatus * job, FindJob(job_id));
  if (!IsTerminal(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is ", JobState_Name(job->state()),
                     "; stop it first (downpourctl stop ", job_id, ")"));
  }
  RETURN_IF_ERROR(RemoveJob(job_id));
  Log(absl::StrCat("job ", job_id, " deleted by operator"));
  return absl::OkStatus();
}

absl::StatusOr<NodeInfo> CoordinatorState::CordonNode(const std::string& node_id, bool cordoned) {
  RETURN_IF_ERROR(CheckNodeIdArgument(node_id));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("no node \"", node_id, "\""));
  }
  NodeEntry& node = it->second;
  if (node.info.cordoned() != cordoned) {
    NodeInfo info = node.info;
    info.set_cordoned(cordoned);
    RETURN_IF_ERROR(SaveNode(info));
    Log(absl::StrCat("node ", node_id,
                     cordoned ? " drained by operator: no new work, its jobs move off it"
                              : " uncordoned by operator: it takes work again"));
  }
  if (cordoned) {
    // Workers hand their rank on (as a lost worker's is); shards move their
    // jobs after a checkpoint (as a SIGTERM drain does).
    if (node.info.role() == SHARD) DrainShard(node_id);
    absl::Status first;
    for (const std::string& id : job_order_) {
      const JobStatus& job = jobs_[id];
      if (job.state() != RUNNING || !Names(job.placement().worker_nodes(), node_id)) continue;
      const auto& workers = job.placement().worker_nodes();
      const int rank = std::find(workers.begin(), workers.end(), node_id) - workers.begin();
      first.Update(
          LoseWorker(job, rank, absl::StrCat("worker node ", node_id, " drained by operator")));
    }
    RETURN_IF_ERROR(first);
  }
  SchedulePending();
  return Describe(node);
}

void CoordinatorState::AppendJobLog(JobLogLine line) {
  if (jobs_.count(line.job_id()) == 0) return;
  JobLog& log = job_logs_[line.job_id()];
  line.set_sequence(log.next_sequence++);
  log.lines.push_back(std::move(line));
  while (static_cast<int>(log.lines.size()) > std::max(1, options_.job_log_lines)) {
    log.lines.pop_front();
  }
  changed_.SignalAll();
}

absl::StatusOr<JobLogsResponse> CoordinatorState::JobLogs(const JobLogsRequest& request) {
  RETURN_IF_ERROR(CheckJobIdArgument(request.job_id()));
  absl::MutexLock lock(&mu_);
  const absl::Time deadline =
      options_.now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms()));
  while (true) {
    ASSIGN_OR_RETURN(JobStatus * job, FindJob(request.job_id()));
    const JobLog& log = job_logs_[request.job_id()];
    JobLogsResponse response;
    response.set_job_ended(IsTerminal(job->state()));
    response.set_truncated(!log.lines.empty() &&
                           log.lines.front().sequence() > request.after_sequence() + 1);
    for (const JobLogLine& line : log.lines) {
      if (line.sequence() > request.after_sequence()) *response.add_lines() = line;
    }
    const absl::Time now = options_.now();
    if (response.lines_size() > 0 || response.job_ended() || now >= deadline) return response;
    // Tick wakes waiters too, so an injected clock that jumps is noticed.
    changed_.WaitWithTimeout(&mu_, deadline - now);
  }
}

void CoordinatorState::RecordProgress(const JobStatus& job) {
  std::deque<ProgressPoint>& points = progress_[job.id()];
  const int64_t now = ToMillis(options_.now());
  if (!points.empty()) {
    const ProgressPoint& last = points.back();
    const int64_t big_move = std::max<int64_t>(1, job.spec().steps() / 10);
    if (last.step() == job.step() ||
        (now - last.time_ms() < 1000 && job.step() - last.step() < big_move)) {
      return;
    }
  }
  ProgressPoint point;
  point.set_time_ms(now);
  point.set_step(job.step());
  point.set_loss(job.loss());
  point.set_examples_per_sec(job.examples_per_sec());
  points.push_back(point);
  while (static_cast<int>(points.size()) > std::max(1, options_.progress_points)) {
    points.pop_front();
  }
}

void CoordinatorState::TickRetention() {
  const absl::Time now = options_.now();
  // Ended jobs, newest end first: those past the count or the age go.
  std::vector<const JobStatus*> ended;
  for (const std::string& id : job_order_) {
    if (IsTerminal(jobs_[id].state())) ended.push_back(&jobs_[id]);
  }
  std::stable_sort(ended.begin(), ended.end(), [](const JobStatus* a, const JobStatus* b) {
    return a->end_time_ms() > b->end_time_ms();
  });
  std::vector<std::string> expired;
  for (size_t i = 0; i < ended.size(); ++i) {
    const bool too_many =
        options_.job_retention_count > 0 && static_cast<int>(i) >= options_.job_retention_count;
    const bool too_old =
        options_.job_retention_age > absl::ZeroDuration() &&
        now - absl::FromUnixMillis(ended[i]->end_time_ms()) > options_.job_retention_age;
    if (too_many || too_old) expired.push_back(ended[i]->id());
  }
  for (const std::string& id : expired) {
    const std::string what = absl::StrCat("the removal of job ", id);
    absl::Status removed = RemoveJob(id);
    if (!removed.ok()) {
      LogWriteFailure(what, removed);
      continue;
    }
    write_failures_.erase(what);
    Log(absl::StrCat(
        "job ", id,
        " removed: past the job retention (--job_retention_count=", options_.job_retention_count,
        ", --job_retention_age=", absl::FormatDuration(options_.job_retention_age), ")"));
  }

  if (options_.dead_node_retention <= absl::ZeroDuration()) return;
  std::vector<std::string> gone;
  for (const auto& [id, node] : nodes_) {
    if (Alive(node) || now - node.last_heartbeat <= options_.dead_node_retention) continue;
    // A running job still naming it (a lost rank's old holder) keeps it.
    const bool named = std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& entry) {
      const Placement& p = entry.second.placement();
      return entry.second.state() == RUNNING &&
             (Names(p.worker_nodes(), id) || Names(p.shard_nodes(), id));
    });
    if (!named) gone.push_back(id);
  }
  for (const std::string& id : gone) {
    const std::string what = absl::StrCat("the removal of node ", id);
    absl::Status removed = store_->DeleteNode(id);
    if (!removed.ok()) {
      LogWriteFailure(what, removed);
      continue;
    }
    write_failures_.erase(what);
    Log(absl::StrCat(
        "node ", id, " removed: dead since ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S", nodes_[id].last_heartbeat, absl::LocalTimeZone()),
        ", longer than --dead_node_retention=",
        absl::FormatDuration(options_.dead_node_retention)));
    nodes_.erase(id);
  }
}

}  // namespace control
}  // namespace downpour
