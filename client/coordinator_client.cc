#include "client/coordinator_client.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "rpc/grpc_status.h"

namespace downpour {
namespace {

// Keeps reconnection attempts frequent, so a coordinator that comes back is
// found within a couple of seconds rather than after gRPC's default backoff
// (which grows to two minutes).
constexpr int kMaxReconnectBackoffMs = 2000;
// WatchJob's deadline is its server-side timeout plus this much.
constexpr absl::Duration kWatchGrace = absl::Seconds(5);

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + ToChrono(d);
}

// Records the parser's errors as "FILE:LINE:COL: message" (1-based).
class JobSpecErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit JobSpecErrorCollector(std::string path) : path_(std::move(path)) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first_error_.empty()) {
      first_error_ = absl::StrCat(path_, ":", line + 1, ":", column + 1, ": ", message);
    }
  }

  const std::string& first_error() const { return first_error_; }

 private:
  const std::string path_;
  std::string first_error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    const std::string& address, absl::Duration connect_timeout) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "the coordinator address is empty; pass --coordinator=HOST:PORT");
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  // A long job history makes `list` answers large.
  args.SetMaxReceiveMessageSize(256 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto client =
      std::make_unique<CoordinatorClient>(address, channel, Coordinator::NewStub(channel));
  RETURN_IF_ERROR(client->WaitUntilConnected(connect_timeout));
  return client;
}

CoordinatorClient::CoordinatorClient(std::string address, std::shared_ptr<grpc::Channel> channel,
                                     std::unique_ptr<Coordinator::StubInterface> stub)
    : address_(std::move(address)), channel_(std::move(channel)), stub_(std::move(stub)) {}

absl::Status CoordinatorClient::WaitUntilConnected(absl::Duration timeout) {
  if (channel_ == nullptr) return absl::OkStatus();
  if (!channel_->WaitForConnected(DeadlineIn(timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot reach coordinator at ", address_, " within ",
                                               absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorClient::CallError(const grpc::Status& status, const char* method,
                                          absl::Duration timeout) const {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(absl::StrCat("coordinator at ", address_, " is unavailable (",
                                                 method, ": ", status.error_message(), ")"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat("coordinator at ", address_,
                                                      " did not answer ", method, " within ",
                                                      absl::FormatDuration(timeout)));
    default:
      return FromGrpcStatus(status);
  }
}

absl::StatusOr<std::vector<NodeInfo>> CoordinatorClient::ListNodes() {
  grpc::ClientContext context;
  SetDeadline(&context, ToChrono(rpc_timeout_));
  ListNodesResponse response;
  grpc::Status status = stub_->ListNodes(&context, ListNodesRequest(), &response);
  if (!status.ok()) return CallError(status, "ListNodes", rpc_timeout_);
  return std::vector<NodeInfo>(response.nodes().begin(), response.nodes().end());
}

absl::StatusOr<JobStatus> CoordinatorClient::SubmitJob(const JobSpec& spec,
                                                       const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context, ToChrono(rpc_timeout_));
  SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_job_id(job_id);
  SubmitJobResponse response;
  grpc::Status status = stub_->SubmitJob(&context, request, &response);
  if (!status.ok()) return CallError(status, "SubmitJob", rpc_timeout_);
  return std::move(*response.mutable_job());
}

absl::StatusOr<std::vector<JobStatus>> CoordinatorClient::ListJobs() {
  grpc::ClientContext context;
  SetDeadline(&context, ToChrono(rpc_timeout_));
  ListJobsResponse response;
  grpc::Status status = stub_->ListJobs(&context, ListJobsRequest(), &response);
  if (!status.ok()) return CallError(status, "ListJobs", rpc_timeout_);
  return std::vector<JobStatus>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<JobStatus> CoordinatorClient::GetJob(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context, ToChrono(rpc_timeout_));
  GetJobRequest request;
  request.set_job_id(job_id);
  JobStatus response;
  grpc::Status status = stub_->GetJob(&context, request, &response);
  if (!status.ok()) return CallError(status, "GetJob", rpc_timeout_);
  return response;
}

absl::StatusOr<JobStatus> CoordinatorClient::WatchJob(const std::string& job_id,
                                                      int64_t known_version,
                                                      absl::Duration timeout) {
  grpc::ClientContext context;
  const absl::Duration deadline = timeout + kWatchGrace;
  SetDeadline(&context, ToChrono(deadline));
  WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_known_version(known_version);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  JobStatus response;
  grpc::Status status = stub_->WatchJob(&context, request, &response);
  if (!status.ok()) return CallError(status, "WatchJob", deadline);
  return response;
}

absl::StatusOr<JobStatus> CoordinatorClient::StopJob(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context, ToChrono(rpc_timeout_));
  StopJobRequest request;
  request.set_job_id(job_id);
  StopJobResponse response;
  grpc::Status status = stub_->StopJob(&context, request, &response);
  if (!status.ok()) return CallError(status, "StopJob", rpc_timeout_);
  return std::move(*response.mutable_job());
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec path ", path, " is a directory, not a file"));
  }
  std::ifstream in(path);
  if (!in) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("job spec file ", path, " does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read job spec file ", path, ": ", std::strerror(error)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read job spec file ", path));
  }
  JobSpec spec;
  JobSpecErrorCollector errors(path);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &spec)) {
    if (errors.first_error().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid job spec"));
    }
    return absl::InvalidArgumentError(errors.first_error());
  }
  return spec;
}

}  // namespace downpour
