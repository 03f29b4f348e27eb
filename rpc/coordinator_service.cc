#include "rpc/coordinator_service.h"

#include <algorithm>

#include "rpc/grpc_status.h"

namespace downpour {
namespace {

// An export is streamed in pieces of this size.
constexpr size_t kExportChunkBytes = 1 << 20;

// Long polls never outlive this, whatever the client asks.
constexpr int64_t kMaxWatchMillis = 60'000;

template <typename T, typename Out>
grpc::Status Reply(absl::StatusOr<T> result, Out* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = std::move(result).value();
  return grpc::Status::OK;
}

}  // namespace

CoordinatorService::CoordinatorService(control::Coordinator* coordinator, MetricsRegistry* metrics)
    : coordinator_(coordinator),
      submitted_(metrics->GetCounter("downpour_jobs_submitted_total", "Jobs accepted.")),
      rejected_(metrics->GetCounter("downpour_jobs_rejected_total",
                                    "Job submissions rejected (bad spec or id).")),
      heartbeats_(metrics->GetCounter("downpour_heartbeats_total", "Heartbeats received.")) {}

grpc::Status CoordinatorService::RegisterNode(grpc::ServerContext*,
                                              const RegisterNodeRequest* request,
                                              RegisterNodeResponse* response) {
  return Reply(coordinator_->RegisterNode(request->node()), response);
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*, const HeartbeatRequest* request,
                                           HeartbeatResponse* response) {
  heartbeats_->Increment();
  return Reply(coordinator_->Heartbeat(*request), response);
}

grpc::Status CoordinatorService::ListNodes(grpc::ServerContext*, const ListNodesRequest*,
                                           ListNodesResponse* response) {
  absl::StatusOr<std::vector<NodeInfo>> nodes = coordinator_->ListNodes();
  if (!nodes.ok()) return ToGrpcStatus(nodes.status());
  for (NodeInfo& node : *nodes) *response->add_nodes() = std::move(node);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext*, const SubmitJobRequest* request,
                                           SubmitJobResponse* response) {
  auto job = coordinator_->SubmitJob(*request);
  (job.ok() ? submitted_ : rejected_)->Increment();
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(job).value();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const ListJobsRequest*,
                                          ListJobsResponse* response) {
  absl::StatusOr<std::vector<JobStatus>> jobs = coordinator_->ListJobs();
  if (!jobs.ok()) return ToGrpcStatus(jobs.status());
  for (JobStatus& job : *jobs) {
    // A big model's partition list is long; GetJob has it.
    job.mutable_placement()->clear_partitions();
    *response->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext*, const GetJobRequest* request,
                                        JobStatus* response) {
  return Reply(coordinator_->GetJob(request->job_id()), response);
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* context,
                                          const WatchJobRequest* request, JobStatus* response) {
  const int64_t wait_ms = std::clamp<int64_t>(request->timeout_ms(), 0, kMaxWatchMillis);
  // Answer a little before the caller's own deadline so it gets the state.
  const absl::Duration caller_left =
      absl::FromChrono(context->deadline()) - absl::Now() - absl::Milliseconds(500);
  const absl::Duration timeout =
      std::max(absl::ZeroDuration(), std::min(absl::Milliseconds(wait_ms), caller_left));
  return Reply(coordinator_->WatchJob(request->job_id(), request->known_version(), timeout),
               response);
}

grpc::Status CoordinatorService::StopJob(grpc::ServerContext*, const StopJobRequest* request,
                                         StopJobResponse* response) {
  auto job = coordinator_->StopJob(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(job).value();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportProgress(grpc::ServerContext*,
                                                const ReportProgressRequest* request,
                                                ReportProgressResponse* response) {
  return Reply(coordinator_->ReportProgress(*request), response);
}

grpc::Status CoordinatorService::CheckpointJob(grpc::ServerContext*,
                                               const CheckpointJobRequest* request,
                                               JobStatus* response) {
  return Reply(coordinator_->CheckpointJob(request->job_id()), response);
}

grpc::Status CoordinatorService::ResumeJob(grpc::ServerContext*, const ResumeJobRequest* request,
                                           JobStatus* response) {
  return Reply(coordinator_->ResumeJob(request->job_id()), response);
}

grpc::Status CoordinatorService::ExportJob(grpc::ServerContext*, const ExportJobRequest* request,
                                           grpc::ServerWriter<ExportChunk>* writer) {
  absl::StatusOr<std::string> file =
      coordinator_->ExportJob(request->job_id(), request->step(), request->native_layout());
  if (!file.ok()) return ToGrpcStatus(file.status());
  ExportChunk chunk;
  for (size_t at = 0; at < file->size(); at += kExportChunkBytes) {
    chunk.set_data(file->substr(at, kExportChunkBytes));
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DescribeJob(grpc::ServerContext*,
                                             const DescribeJobRequest* request,
                                             JobDescription* response) {
  return Reply(coordinator_->DescribeJob(request->job_id()), response);
}

grpc::Status CoordinatorService::DeleteJob(grpc::ServerContext*, const DeleteJobRequest* request,
                                           DeleteJobResponse*) {
  return ToGrpcStatus(coordinator_->DeleteJob(request->job_id()));
}

grpc::Status CoordinatorService::CordonNode(grpc::ServerContext*, const CordonNodeRequest* request,
                                            NodeInfo* response) {
  return Reply(coordinator_->CordonNode(request->node_id(), request->cordoned()), response);
}

grpc::Status CoordinatorService::JobLogs(grpc::ServerContext* context,
                                         const JobLogsRequest* request, JobLogsResponse* response) {
  // Answer a little before the caller's own deadline, like WatchJob.
  JobLogsRequest bounded = *request;
  const absl::Duration caller_left =
      absl::FromChrono(context->deadline()) - absl::Now() - absl::Milliseconds(500);
  bounded.set_timeout_ms(std::clamp<int64_t>(
      std::min<int64_t>(request->timeout_ms(), absl::ToInt64Milliseconds(caller_left)), 0,
      kMaxWatchMillis));
  return Reply(coordinator_->JobLogs(bounded), response);
}

}  // namespace downpour
