// CoordinatorMetrics: the coordinator's view of the cluster as Prometheus
// series, brought up to date from its state on every tick:
//
//   downpour_nodes_alive{role}, downpour_jobs{state}          (as before)
//   downpour_job_state{job,state}     1 for the job's current state, else 0
//   downpour_job_step{job}            the slowest worker's step
//   downpour_job_loss{job}            mean of the workers' latest losses
//   downpour_job_examples_per_second{job}
//   downpour_job_test_accuracy{job}   the final or latest evaluation (absent
//                                     before the first)
//   downpour_job_test_auc{job}        the final or latest evaluation's AUC
//   downpour_job_test_log_loss{job}   and log loss (JobSpec.metrics); present
//                                     only while the job's status has them
//                                     (not before the first evaluation, nor
//                                     after a restart until the next one)
//   downpour_job_last_progress_timestamp_seconds{job}
//   downpour_job_checkpoint_failures{job}, downpour_job_final_checkpoint_missing{job}
//                                     when the step last changed
//
// A job's series stay, with their last values, for as long as the job is in
// the coordinator's store (a finished job's too), so dashboards and alerts
// see how it ended; they go when it leaves the store.
//
// Thread-compatible: one thread (the coordinator's ticker) calls Update. The
// registry is not owned and must outlive this.
#ifndef DOWNPOUR_COORDINATOR_COORDINATOR_METRICS_H_
#define DOWNPOUR_COORDINATOR_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace downpour {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(MetricsRegistry* metrics) : metrics_(metrics) {}

  // `nodes` and `jobs`: everything in the store now; `now` dates a step
  // seen to change.
  void Update(const std::vector<NodeInfo>& nodes, const std::vector<JobStatus>& jobs,
              absl::Time now);

 private:
  struct Seen {
    int64_t step = 0;
    double progress_seconds = 0;  // Since the epoch.
  };
  void UpdateJob(const JobStatus& job, absl::Time now);

  MetricsRegistry* const metrics_;
  std::map<std::string, Seen> jobs_;  // Those with series.
};

}  // namespace downpour

#endif  // DOWNPOUR_COORDINATOR_COORDINATOR_METRICS_H_
