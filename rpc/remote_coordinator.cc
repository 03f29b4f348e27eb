#include "rpc/remote_coordinator.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "rpc/grpc_status.h"

namespace downpour {
namespace {

// Keeps reconnection attempts frequent, so a coordinator that comes back is
// found within a couple of seconds rather than after gRPC's default backoff
// (which grows to two minutes).
constexpr int kMaxReconnectBackoffMs = 2000;
// WatchJob's deadline is its server-side timeout plus this much.
constexpr absl::Duration kWatchGrace = absl::Seconds(5);

using Stub = downpour::Coordinator::StubInterface;

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteCoordinator>> RemoteCoordinator::Create(
    const std::string& address, const ClientCredentials& credentials) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "the coordinator address is empty; pass --coordinator=HOST:PORT");
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  // A long job history makes ListJobs answers large.
  args.SetMaxReceiveMessageSize(256 << 20);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      address,
      credentials.channel != nullptr ? credentials.channel : grpc::InsecureChannelCredentials(),
      args);
  auto client = std::make_unique<RemoteCoordinator>(address, channel,
                                                    downpour::Coordinator::NewStub(channel));
  client->bearer_token_ = credentials.bearer_token;
  client->tls_ = credentials.channel != nullptr;
  return client;
}

absl::StatusOr<std::unique_ptr<RemoteCoordinator>> RemoteCoordinator::Connect(
    const std::string& address, absl::Duration connect_timeout,
    const ClientCredentials& credentials) {
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteCoordinator> client, Create(address, credentials));
  RETURN_IF_ERROR(client->WaitUntilConnected(connect_timeout));
  return client;
}

RemoteCoordinator::RemoteCoordinator(std::string address, std::shared_ptr<grpc::Channel> channel,
                                     std::unique_ptr<Stub> stub)
    : address_(std::move(address)), channel_(std::move(channel)), stub_(std::move(stub)) {}

absl::Status RemoteCoordinator::WaitUntilConnected(absl::Duration timeout) {
  if (channel_ == nullptr) return absl::OkStatus();
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                  absl::ToChronoMilliseconds(timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach coordinator at ", address_, " within ", absl::FormatDuration(timeout),
        tls_ ? " (down, unreachable, or its certificate is not from our --tls_ca's CA or does "
               "not name that host)"
             : " (down, unreachable, or it serves TLS: give --tls_ca)"));
  }
  return absl::OkStatus();
}

absl::Status RemoteCoordinator::CallError(const char* name, const grpc::Status& status,
                                          absl::Duration timeout) const {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(absl::StrCat("coordinator at ", address_, " is unavailable (",
                                                 name, ": ", status.error_message(), ")"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat("coordinator at ", address_,
                                                      " did not answer ", name, " within ",
                                                      absl::FormatDuration(timeout)));
    default:
      return FromGrpcStatus(status);
  }
}

void RemoteCoordinator::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  SetDeadline(context, absl::ToChronoMilliseconds(timeout));
  if (!bearer_token_.empty()) {
    context->AddMetadata(kAuthorizationHeader, absl::StrCat("Bearer ", bearer_token_));
  }
}

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> RemoteCoordinator::Call(const char* name, Method method,
                                                 const Request& request, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  Response response;
  const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
  if (status.ok()) return response;
  return CallError(name, status, timeout);
}

absl::StatusOr<RegisterNodeResponse> RemoteCoordinator::RegisterNode(const NodeInfo& node) {
  RegisterNodeRequest request;
  *request.mutable_node() = node;
  return Call<RegisterNodeRequest, RegisterNodeResponse>("RegisterNode", &Stub::RegisterNode,
                                                         request, rpc_timeout_);
}

absl::StatusOr<HeartbeatResponse> RemoteCoordinator::Heartbeat(const HeartbeatRequest& request) {
  return Call<HeartbeatRequest, HeartbeatResponse>("Heartbeat", &Stub::Heartbeat, request,
                                                   rpc_timeout_);
}

absl::StatusOr<std::vector<NodeInfo>> RemoteCoordinator::ListNodes() {
  ASSIGN_OR_RETURN(ListNodesResponse response,
                   (Call<ListNodesRequest, ListNodesResponse>("ListNodes", &Stub::ListNodes,
                                                              ListNodesRequest(), rpc_timeout_)));
  return std::vector<NodeInfo>(response.nodes().begin(), response.nodes().end());
}

absl::StatusOr<JobStatus> RemoteCoordinator::SubmitJob(const SubmitJobRequest& request) {
  // Initial weights (and an ONNX model's) may take a while to send, check
  // and write.
  const absl::Duration timeout =
      request.has_init_from() || request.has_model_file() ? long_call_timeout_ : rpc_timeout_;
  ASSIGN_OR_RETURN(
      SubmitJobResponse response,
      (Call<SubmitJobRequest, SubmitJobResponse>("SubmitJob", &Stub::SubmitJob, request, timeout)));
  return std::move(*response.mutable_job());
}

absl::StatusOr<std::vector<JobStatus>> RemoteCoordinator::ListJobs() {
  ASSIGN_OR_RETURN(ListJobsResponse response,
                   (Call<ListJobsRequest, ListJobsResponse>("ListJobs", &Stub::ListJobs,
                                                            ListJobsRequest(), rpc_timeout_)));
  return std::vector<JobStatus>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<JobStatus> RemoteCoordinator::GetJob(const std::string& job_id) {
  GetJobRequest request;
  request.set_job_id(job_id);
  return Call<GetJobRequest, JobStatus>("GetJob", &Stub::GetJob, request, rpc_timeout_);
}

absl::StatusOr<JobStatus> RemoteCoordinator::WatchJob(const std::string& job_id,
                                                      int64_t known_version,
                                                      absl::Duration timeout) {
  WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_known_version(known_version);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return Call<WatchJobRequest, JobStatus>("WatchJob", &Stub::WatchJob, request,
                                          timeout + kWatchGrace);
}

absl::StatusOr<JobStatus> RemoteCoordinator::StopJob(const std::string& job_id) {
  StopJobRequest request;
  request.set_job_id(job_id);
  ASSIGN_OR_RETURN(
      StopJobResponse response,
      (Call<StopJobRequest, StopJobResponse>("StopJob", &Stub::StopJob, request, rpc_timeout_)));
  return std::move(*response.mutable_job());
}

absl::StatusOr<JobStatus> RemoteCoordinator::CheckpointJob(const std::string& job_id) {
  CheckpointJobRequest request;
  request.set_job_id(job_id);
  return Call<CheckpointJobRequest, JobStatus>("CheckpointJob", &Stub::CheckpointJob, request,
                                               rpc_timeout_);
}

absl::StatusOr<JobStatus> RemoteCoordinator::ResumeJob(const std::string& job_id) {
  ResumeJobRequest request;
  request.set_job_id(job_id);
  return Call<ResumeJobRequest, JobStatus>("ResumeJob", &Stub::ResumeJob, request,
                                           long_call_timeout_);
}

absl::StatusOr<std::string> RemoteCoordinator::ExportJob(const std::string& job_id, int64_t step,
                                                         bool native_layout) {
  ExportJobRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  request.set_native_layout(native_layout);
  grpc::ClientContext context;
  Prepare(&context, long_call_timeout_);
  std::unique_ptr<grpc::ClientReaderInterface<ExportChunk>> reader =
      stub_->ExportJob(&context, request);
  std::string file;
  ExportChunk chunk;
  while (reader->Read(&chunk)) file += chunk.data();
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return CallError("ExportJob", status, long_call_timeout_);
  return file;
}

absl::StatusOr<ReportProgressResponse> RemoteCoordinator::ReportProgress(
    const ReportProgressRequest& request) {
  return Call<ReportProgressRequest, ReportProgressResponse>(
      "ReportProgress", &Stub::ReportProgress, request, rpc_timeout_);
}

absl::StatusOr<JobDescription> RemoteCoordinator::DescribeJob(const std::string& job_id) {
  DescribeJobRequest request;
  request.set_job_id(job_id);
  return Call<DescribeJobRequest, JobDescription>("DescribeJob", &Stub::DescribeJob, request,
                                                  rpc_timeout_);
}

absl::Status RemoteCoordinator::DeleteJob(const std::string& job_id, bool checkpoints) {
  DeleteJobRequest request;
  request.set_job_id(job_id);
  request.set_checkpoints(checkpoints);
  return Call<DeleteJobRequest, DeleteJobResponse>("DeleteJob", &Stub::DeleteJob, request,
                                                   rpc_timeout_)
      .status();
}

absl::StatusOr<NodeInfo> RemoteCoordinator::CordonNode(const std::string& node_id, bool cordoned) {
  CordonNodeRequest request;
  request.set_node_id(node_id);
  request.set_cordoned(cordoned);
  return Call<CordonNodeRequest, NodeInfo>("CordonNode", &Stub::CordonNode, request, rpc_timeout_);
}

absl::StatusOr<JobLogsResponse> RemoteCoordinator::JobLogs(const JobLogsRequest& request) {
  // A long poll: its own wait plus the usual grace.
  return Call<JobLogsRequest, JobLogsResponse>(
      "JobLogs", &Stub::JobLogs, request,
      absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms())) + kWatchGrace);
}

}  // namespace downpour
