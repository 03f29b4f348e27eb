// Durable storage of the coordinator's jobs, nodes and each job's history
// (log lines and progress points).
//
// JobStore is the interface; OpenSqliteJobStore keeps everything in one
// SQLite database under the coordinator's --state_dir so jobs, their state
// and their history survive a restart. Implementations are thread-safe.
#ifndef DOWNPOUR_CONTROL_JOB_STORE_H_
#define DOWNPOUR_CONTROL_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {
namespace control {

// A job's progress point, as the store keeps it.
struct JobProgressRecord {
  std::string job_id;
  ProgressPoint point;
};

// What JobHistory keeps of its jobs: log lines (each names its job and
// carries its sequence) and progress points, oldest first.
struct JobHistoryRecords {
  std::vector<JobLogLine> lines;
  std::vector<JobProgressRecord> points;
};

class JobStore {
 public:
  virtual ~JobStore() = default;
  // Inserts or replaces the job with this id.
  virtual absl::Status SaveJob(const JobStatus& job) = 0;
  virtual absl::StatusOr<std::vector<JobStatus>> LoadJobs() = 0;
  // Inserts or replaces the node with this id.
  virtual absl::Status SaveNode(const NodeInfo& node) = 0;
  virtual absl::StatusOr<std::vector<NodeInfo>> LoadNodes() = 0;
  // Appends `added` in one transaction, then keeps only the newest
  // `keep_lines` log lines and `keep_points` progress points of each job
  // that gained any.
  virtual absl::Status AppendHistory(const JobHistoryRecords& added, int keep_lines,
                                     int keep_points) = 0;
  // Every job's history, each job's records oldest first.
  virtual absl::StatusOr<JobHistoryRecords> LoadHistory() = 0;
  // Remove the job (with its history) or node with this id (no error when
  // there is none).
  virtual absl::Status DeleteJob(const std::string& job_id) = 0;
  virtual absl::Status DeleteNode(const std::string& node_id) = 0;
};

// Opens (creating if needed) `state_dir`/coordinator.db.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& state_dir);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_JOB_STORE_H_
