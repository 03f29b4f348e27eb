#include "rpc/coordinator_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
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

const std::map<std::string, std::vector<CallerRole>>& CoordinatorService::MethodRoles() {
  static const auto* const roles = new std::map<std::string, std::vector<CallerRole>>{
      // Nodes: their own registration, heartbeats and progress.
      {"RegisterNode", {NODE}},
      {"Heartbeat", {NODE}},
      {"ReportProgress", {NODE}},
      // Reading.
      {"ListNodes", {ADMIN, VIEWER}},
      {"ListJobs", {ADMIN, VIEWER}},
      {"GetJob", {ADMIN, VIEWER}},
      {"WatchJob", {ADMIN, VIEWER}},
      {"DescribeJob", {ADMIN, VIEWER}},
      {"JobLogs", {ADMIN, VIEWER}},
      // Every verb that changes something, or takes the model away.
      {"SubmitJob", {ADMIN}},
      {"StopJob", {ADMIN}},
      {"CheckpointJob", {ADMIN}},
      {"ResumeJob", {ADMIN}},
      {"ExportJob", {ADMIN}},
      {"DeleteJob", {ADMIN}},
      {"CordonNode", {ADMIN}},
  };
  return *roles;
}

CoordinatorService::CoordinatorService(control::Coordinator* coordinator, MetricsRegistry* metrics,
                                       const Authenticator* auth)
    : coordinator_(coordinator),
      auth_(auth != nullptr ? auth : &open_auth_),
      submitted_(metrics->GetCounter("downpour_jobs_submitted_total", "Jobs accepted.")),
      rejected_(metrics->GetCounter("downpour_jobs_rejected_total",
                                    "Job submissions rejected (bad spec or id).")),
      heartbeats_(metrics->GetCounter("downpour_heartbeats_total", "Heartbeats received.")) {}

grpc::Status CoordinatorService::Authorize(const grpc::ServerContext& context, const char* method,
                                           const std::string* node_id) const {
  static const std::vector<CallerRole> kNobody;
  const auto it = MethodRoles().find(method);
  Caller caller;
  grpc::Status status =
      auth_->Authorize(context, method, it != MethodRoles().end() ? it->second : kNobody, &caller);
  if (!status.ok()) return status;
  // A node certificate speaks for its own node only (on an open coordinator
  // too).
  if (caller.is_node() && node_id != nullptr && *node_id != caller.name) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("node ", caller.name, " may not call ", method, " as node ",
                                     *node_id, ": its certificate names ", caller.name));
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::RegisterNode(grpc::ServerContext* context,
                                              const RegisterNodeRequest* request,
                                              RegisterNodeResponse* response) {
  if (grpc::Status denied = Authorize(*context, "RegisterNode", &request->node().id());
      !denied.ok())
    return denied;
  return Reply(coordinator_->RegisterNode(request->node()), response);
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const HeartbeatRequest* request,
                                           HeartbeatResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Heartbeat", &request->node_id()); !denied.ok())
    return denied;
  heartbeats_->Increment();
  return Reply(coordinator_->Heartbeat(*request), response);
}

grpc::Status CoordinatorService::ListNodes(grpc::ServerContext* context, const ListNodesRequest*,
                                           ListNodesResponse* response) {
  if (grpc::Status denied = Authorize(*context, "ListNodes"); !denied.ok()) return denied;
  absl::StatusOr<std::vector<NodeInfo>> nodes = coordinator_->ListNodes();
  if (!nodes.ok()) return ToGrpcStatus(nodes.status());
  for (NodeInfo& node : *nodes) *response->add_nodes() = std::move(node);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* context,
                                           const SubmitJobRequest* request,
                                           SubmitJobResponse* response) {
  if (grpc::Status denied = Authorize(*context, "SubmitJob"); !denied.ok()) return denied;
  auto job = coordinator_->SubmitJob(*request);
  (job.ok() ? submitted_ : rejected_)->Increment();
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(job).value();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context, const ListJobsRequest*,
                                          ListJobsResponse* response) {
  if (grpc::Status denied = Authorize(*context, "ListJobs"); !denied.ok()) return denied;
  absl::StatusOr<std::vector<JobStatus>> jobs = coordinator_->ListJobs();
  if (!jobs.ok()) return ToGrpcStatus(jobs.status());
  for (JobStatus& job : *jobs) *response->add_jobs() = std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context, const GetJobRequest* request,
                                        JobStatus* response) {
  if (grpc::Status denied = Authorize(*context, "GetJob"); !denied.ok()) return denied;
  return Reply(coordinator_->GetJob(request->job_id()), response);
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* context,
                                          const WatchJobRequest* request, JobStatus* response) {
  if (grpc::Status denied = Authorize(*context, "WatchJob"); !denied.ok()) return denied;
  const int64_t wait_ms = std::clamp<int64_t>(request->timeout_ms(), 0, kMaxWatchMillis);
  // Answer a little before the caller's own deadline so it gets the state.
  const absl::Duration caller_left =
      absl::FromChrono(context->deadline()) - absl::Now() - absl::Milliseconds(500);
  const absl::Duration timeout =
      std::max(absl::ZeroDuration(), std::min(absl::Milliseconds(wait_ms), caller_left));
  return Reply(coordinator_->WatchJob(request->job_id(), request->known_version(), timeout),
               response);
}

grpc::Status CoordinatorService::StopJob(grpc::ServerContext* context,
                                         const StopJobRequest* request, StopJobResponse* response) {
  if (grpc::Status denied = Authorize(*context, "StopJob"); !denied.ok()) return denied;
  auto job = coordinator_->StopJob(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(job).value();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportProgress(grpc::ServerContext* context,
                                                const ReportProgressRequest* request,
                                                ReportProgressResponse* response) {
  if (grpc::Status denied = Authorize(*context, "ReportProgress", &request->node_id());
      !denied.ok())
    return denied;
  return Reply(coordinator_->ReportProgress(*request), response);
}

grpc::Status CoordinatorService::CheckpointJob(grpc::ServerContext* context,
                                               const CheckpointJobRequest* request,
                                               JobStatus* response) {
  if (grpc::Status denied = Authorize(*context, "CheckpointJob"); !denied.ok()) return denied;
  return Reply(coordinator_->CheckpointJob(request->job_id()), response);
}

grpc::Status CoordinatorService::ResumeJob(grpc::ServerContext* context,
                                           const ResumeJobRequest* request, JobStatus* response) {
  if (grpc::Status denied = Authorize(*context, "ResumeJob"); !denied.ok()) return denied;
  return Reply(coordinator_->ResumeJob(request->job_id()), response);
}

grpc::Status CoordinatorService::ExportJob(grpc::ServerContext* context,
                                           const ExportJobRequest* request,
                                           grpc::ServerWriter<ExportChunk>* writer) {
  if (grpc::Status denied = Authorize(*context, "ExportJob"); !denied.ok()) return denied;
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

grpc::Status CoordinatorService::DescribeJob(grpc::ServerContext* context,
                                             const DescribeJobRequest* request,
                                             JobDescription* response) {
  if (grpc::Status denied = Authorize(*context, "DescribeJob"); !denied.ok()) return denied;
  return Reply(coordinator_->DescribeJob(request->job_id()), response);
}

grpc::Status CoordinatorService::DeleteJob(grpc::ServerContext* context,
                                           const DeleteJobRequest* request, DeleteJobResponse*) {
  if (grpc::Status denied = Authorize(*context, "DeleteJob"); !denied.ok()) return denied;
  return ToGrpcStatus(coordinator_->DeleteJob(request->job_id(), request->checkpoints()));
}

grpc::Status CoordinatorService::CordonNode(grpc::ServerContext* context,
                                            const CordonNodeRequest* request, NodeInfo* response) {
  if (grpc::Status denied = Authorize(*context, "CordonNode"); !denied.ok()) return denied;
  return Reply(coordinator_->CordonNode(request->node_id(), request->cordoned()), response);
}

grpc::Status CoordinatorService::JobLogs(grpc::ServerContext* context,
                                         const JobLogsRequest* request, JobLogsResponse* response) {
  if (grpc::Status denied = Authorize(*context, "JobLogs"); !denied.ok()) return denied;
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
