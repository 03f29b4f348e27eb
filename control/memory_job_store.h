// MemoryJobStore: a JobStore in memory for tests, whose data survives
// "restarts" of the coordinator (it lives in the test's Data) and whose
// writes fail on demand (a full disk, a lost volume). Test-only; not
// thread-safe beyond what the coordinator's own locks give it.
#ifndef DOWNPOUR_CONTROL_MEMORY_JOB_STORE_H_
#define DOWNPOUR_CONTROL_MEMORY_JOB_STORE_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "control/job_store.h"

namespace downpour {
namespace control {

class MemoryJobStore : public JobStore {
 public:
  struct Data {
    std::vector<JobStatus> jobs;
    std::vector<NodeInfo> nodes;
    JobHistoryRecords history;
    bool failing = false;
    std::string failing_job;  // Writes of this job fail.
  };
  explicit MemoryJobStore(Data* data) : data_(data) {}
  absl::Status SaveJob(const JobStatus& job) override {
    if (job.id() == data_->failing_job) return absl::InternalError("state database: disk full");
    return Put(&data_->jobs, job);
  }
  absl::Status SaveNode(const NodeInfo& node) override { return Put(&data_->nodes, node); }
  absl::StatusOr<std::vector<JobStatus>> LoadJobs() override { return data_->jobs; }
  absl::StatusOr<std::vector<NodeInfo>> LoadNodes() override { return data_->nodes; }
  absl::Status DeleteJob(const std::string& id) override {
    if (data_->failing) return Failure();
    auto& lines = data_->history.lines;
    lines.erase(std::remove_if(lines.begin(), lines.end(),
                               [&](const JobLogLine& line) { return line.job_id() == id; }),
                lines.end());
    auto& points = data_->history.points;
    points.erase(std::remove_if(points.begin(), points.end(),
                                [&](const JobProgressRecord& p) { return p.job_id == id; }),
                 points.end());
    return Remove(&data_->jobs, id);
  }
  absl::Status DeleteNode(const std::string& id) override { return Remove(&data_->nodes, id); }
  absl::Status AppendHistory(const JobHistoryRecords& added, int keep_lines,
                             int keep_points) override {
    if (data_->failing) return Failure();
    auto& lines = data_->history.lines;
    lines.insert(lines.end(), added.lines.begin(), added.lines.end());
    auto& points = data_->history.points;
    points.insert(points.end(), added.points.begin(), added.points.end());
    KeepNewest(&lines, keep_lines, [](const JobLogLine& line) { return line.job_id(); });
    KeepNewest(&points, keep_points, [](const JobProgressRecord& p) { return p.job_id; });
    return absl::OkStatus();
  }
  absl::StatusOr<JobHistoryRecords> LoadHistory() override { return data_->history; }

 private:
  static absl::Status Failure() { return absl::InternalError("state database: disk I/O error"); }

  // Keeps the newest `keep` records of each job (records are oldest first).
  template <typename T, typename JobOf>
  static void KeepNewest(std::vector<T>* records, int keep, JobOf job_of) {
    std::map<std::string, int> seen;
    std::vector<T> kept;
    for (auto it = records->rbegin(); it != records->rend(); ++it) {
      if (++seen[job_of(*it)] <= keep) kept.push_back(*it);
    }
    records->assign(kept.rbegin(), kept.rend());
  }

  template <typename T>
  absl::Status Remove(std::vector<T>* items, const std::string& id) {
    if (data_->failing) return Failure();
    items->erase(std::remove_if(items->begin(), items->end(),
                                [&](const T& item) { return item.id() == id; }),
                 items->end());
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Put(std::vector<T>* items, const T& item) {
    if (data_->failing) return Failure();
    for (T& existing : *items) {
      if (existing.id() == item.id()) {
        existing = item;
        return absl::OkStatus();
      }
    }
    items->push_back(item);
    return absl::OkStatus();
  }

  Data* data_;
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_MEMORY_JOB_STORE_H_
