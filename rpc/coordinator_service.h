// CoordinatorService: the gRPC face of a control::Coordinator (the server
// adapter of the three layers; the logic lives in control/). Thread-safe;
// the coordinator is not owned and must outlive the service.
#ifndef DOWNPOUR_RPC_COORDINATOR_SERVICE_H_
#define DOWNPOUR_RPC_COORDINATOR_SERVICE_H_

#include "common/metrics.h"
#include "control/coordinator.h"
#include "proto/coordinator_service.grpc.pb.h"

namespace downpour {

class CoordinatorService : public downpour::Coordinator::Service {
 public:
  CoordinatorService(control::Coordinator* coordinator, MetricsRegistry* metrics);

  grpc::Status RegisterNode(grpc::ServerContext*, const RegisterNodeRequest*,
                            RegisterNodeResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest*,
                         HeartbeatResponse*) override;
  grpc::Status ListNodes(grpc::ServerContext*, const ListNodesRequest*,
                         ListNodesResponse*) override;
  grpc::Status SubmitJob(grpc::ServerContext*, const SubmitJobRequest*,
                         SubmitJobResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const ListJobsRequest*, ListJobsResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const GetJobRequest*, JobStatus*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const WatchJobRequest*, JobStatus*) override;
  grpc::Status StopJob(grpc::ServerContext*, const StopJobRequest*, StopJobResponse*) override;
  grpc::Status CheckpointJob(grpc::ServerContext*, const CheckpointJobRequest*,
                             JobStatus*) override;
  grpc::Status ResumeJob(grpc::ServerContext*, const ResumeJobRequest*, JobStatus*) override;
  grpc::Status ExportJob(grpc::ServerContext*, const ExportJobRequest*,
                         grpc::ServerWriter<ExportChunk>*) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const ReportProgressRequest*,
                              ReportProgressResponse*) override;
  grpc::Status DescribeJob(grpc::ServerContext*, const DescribeJobRequest*,
                           JobDescription*) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const DeleteJobRequest*,
                         DeleteJobResponse*) override;
  grpc::Status CordonNode(grpc::ServerContext*, const CordonNodeRequest*, NodeInfo*) override;
  grpc::Status JobLogs(grpc::ServerContext*, const JobLogsRequest*, JobLogsResponse*) override;

 private:
  control::Coordinator* const coordinator_;
  Counter* const submitted_;
  Counter* const rejected_;
  Counter* const heartbeats_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_COORDINATOR_SERVICE_H_
