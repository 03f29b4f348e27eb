#include "control/fake_coordinator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spec/data_assignment.h"

namespace downpour {
namespace control {
namespace {

absl::Status Down() { return absl::UnavailableError("coordinator down"); }
absl::Status NoQueue() { return absl::UnimplementedError("the fake coordinator has no job queue"); }

}  // namespace

absl::StatusOr<RegisterNodeResponse> FakeCoordinator::RegisterNode(const NodeInfo& node) {
  absl::MutexLock lock(&mu_);
  if (!up_) return Down();
  registered_.push_back(node);
  incarnations_[node.id()] = node.incarnation();
  RegisterNodeResponse response;
  response.set_heartbeat_interval_ms(10);
  return response;
}

absl::StatusOr<HeartbeatResponse> FakeCoordinator::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  ++heartbeats_;
  if (!up_) return Down();
  HeartbeatResponse response;
  auto known = incarnations_.find(request.node_id());
  if (known == incarnations_.end() || known->second != request.incarnation()) {
    response.set_reregister(true);
    return response;
  }
  for (const Task& task : tasks_[request.node_id()]) {
    Task* sent = response.add_tasks();
    *sent = task;
    // As the coordinator does: a task names the rank's step target.
    if (sent->steps() == 0) sent->set_steps(sent->spec().steps());
    // As the coordinator does while rank 0 is there: it evaluates.
    if (sent->rank() == 0 && rank_zero_evaluates_) sent->set_evaluates(true);
  }
  return response;
}

absl::StatusOr<ReportProgressResponse> FakeCoordinator::ReportProgress(
    const ReportProgressRequest& request) {
  absl::MutexLock lock(&mu_);
  if (!up_) return Down();
  reports_.push_back(request);
  // A worker listing the record files gets its rank's first share.
  if (request.data_files_size() > 0) {
    for (const Task& task : tasks_[request.node_id()]) {
      if (task.job_id() != request.job_id()) continue;
      const std::vector<std::vector<DataPart>> shares = ShareData(
          std::vector<std::string>(request.data_files().begin(), request.data_files().end()),
          task.spec().num_workers());
      ReportProgressResponse response;
      const std::vector<DataPart>& share = shares.at(request.rank());
      response.mutable_data()->Assign(share.begin(), share.end());
      return response;
    }
    return absl::NotFoundError(absl::StrCat("no task of job ", request.job_id()));
  }
  return ReportProgressResponse();
}

absl::StatusOr<std::vector<NodeInfo>> FakeCoordinator::ListNodes() { return NoQueue(); }
absl::StatusOr<JobStatus> FakeCoordinator::SubmitJob(const SubmitJobRequest&) { return NoQueue(); }
absl::StatusOr<std::vector<JobStatus>> FakeCoordinator::ListJobs() { return NoQueue(); }
absl::StatusOr<JobStatus> FakeCoordinator::GetJob(const std::string&) { return NoQueue(); }
absl::StatusOr<JobStatus> FakeCoordinator::WatchJob(const std::string&, int64_t, absl::Duration) {
  return NoQueue();
}
absl::StatusOr<JobStatus> FakeCoordinator::StopJob(const std::string&) { return NoQueue(); }
absl::StatusOr<JobStatus> FakeCoordinator::CheckpointJob(const std::string&) { return NoQueue(); }
absl::StatusOr<JobStatus> FakeCoordinator::ResumeJob(const std::string&) { return NoQueue(); }
absl::StatusOr<std::string> FakeCoordinator::ExportJob(const std::string&, int64_t, bool) {
  return NoQueue();
}

absl::StatusOr<JobDescription> FakeCoordinator::DescribeJob(const std::string&) {
  return NoQueue();
}

absl::Status FakeCoordinator::DeleteJob(const std::string&, bool) { return NoQueue(); }

absl::StatusOr<NodeInfo> FakeCoordinator::CordonNode(const std::string&, bool) { return NoQueue(); }

absl::StatusOr<JobLogsResponse> FakeCoordinator::JobLogs(const JobLogsRequest&) {
  return NoQueue();
}

void FakeCoordinator::SetRankZeroEvaluates(bool evaluates) {
  absl::MutexLock lock(&mu_);
  rank_zero_evaluates_ = evaluates;
}

void FakeCoordinator::SetTasks(const std::string& node_id, std::vector<Task> tasks) {
  absl::MutexLock lock(&mu_);
  tasks_[node_id] = std::move(tasks);
}

void FakeCoordinator::SetUp(bool up) {
  absl::MutexLock lock(&mu_);
  up_ = up;
}

void FakeCoordinator::ForgetNodes() {
  absl::MutexLock lock(&mu_);
  incarnations_.clear();
}

int FakeCoordinator::registrations() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(registered_.size());
}

NodeInfo FakeCoordinator::last_registered() {
  absl::MutexLock lock(&mu_);
  return registered_.empty() ? NodeInfo() : registered_.back();
}

std::vector<ReportProgressRequest> FakeCoordinator::reports() {
  absl::MutexLock lock(&mu_);
  return reports_;
}

bool FakeCoordinator::HeartbeatsReached() const { return heartbeats_ >= awaited_heartbeats_; }

bool FakeCoordinator::AwaitHeartbeats(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  awaited_heartbeats_ = heartbeats_ + n;
  return mu_.AwaitWithTimeout(absl::Condition(this, &FakeCoordinator::HeartbeatsReached), timeout);
}

bool FakeCoordinator::AwaitReport(const std::function<bool(const ReportProgressRequest&)>& done,
                                  absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  size_t seen = 0;
  while (true) {
    for (; seen < reports_.size(); ++seen) {
      if (done(reports_[seen])) return true;
    }
    const size_t count = reports_.size();
    auto more = [this, count]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reports_.size() > count; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&more), give_up)) return false;
  }
}

}  // namespace control
}  // namespace downpour
