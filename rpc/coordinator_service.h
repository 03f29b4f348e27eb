// CoordinatorService: the gRPC face of a control::Coordinator (the server
// adapter of the three layers; the logic lives in control/). Thread-safe;
// the coordinator is not owned and must outlive the service.
#ifndef DOWNPOUR_RPC_COORDINATOR_SERVICE_H_
#define DOWNPOUR_RPC_COORDINATOR_SERVICE_H_

#include <map>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "control/coordinator.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "rpc/auth.h"

namespace downpour {

class CoordinatorService : public downpour::Coordinator::Service {
 public:
  // Every call is first authorized by `auth` (not owned; null: an open
  // coordinator) against MethodRoles().
  CoordinatorService(control::Coordinator* coordinator, MetricsRegistry* metrics,
                     const Authenticator* auth = nullptr);

  // The roles that may call each method of the service, by method name. A
  // method missing here may be called by no one (deny by default).
  static const std::map<std::string, std::vector<CallerRole>>& MethodRoles();

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
  // Whether the caller of `context` may call `method`; a node may only
  // speak for itself (`node_id`, when the request names one).
  grpc::Status Authorize(const grpc::ServerContext& context, const char* method,
                         const std::string* node_id = nullptr) const;

  control::Coordinator* const coordinator_;
  const Authenticator open_auth_;
  const Authenticator* const auth_;
  Counter* const submitted_;
  Counter* const rejected_;
  Counter* const heartbeats_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_COORDINATOR_SERVICE_H_
