// Durable storage of the coordinator's jobs and nodes.
//
// JobStore is the interface; OpenSqliteJobStore keeps everything in one
// SQLite database under the coordinator's --state_dir so jobs and their state
// survive a restart. Implementations are thread-safe.
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

class JobStore {
 public:
  virtual ~JobStore() = default;
  // Inserts or replaces the job with this id.
  virtual absl::Status SaveJob(const JobStatus& job) = 0;
  virtual absl::StatusOr<std::vector<JobStatus>> LoadJobs() = 0;
  // Inserts or replaces the node with this id.
  virtual absl::Status SaveNode(const NodeInfo& node) = 0;
  virtual absl::StatusOr<std::vector<NodeInfo>> LoadNodes() = 0;
  // Remove the job or node with this id (no error when there is none).
  virtual absl::Status DeleteJob(const std::string& job_id) = 0;
  virtual absl::Status DeleteNode(const std::string& node_id) = 0;
};

// Opens (creating if needed) `state_dir`/coordinator.db.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& state_dir);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_JOB_STORE_H_
