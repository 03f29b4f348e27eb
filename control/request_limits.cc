#include "control/request_limits.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spec/job_validation.h"
#include "spec/limits.h"

namespace downpour {
namespace control {

absl::Status CheckJobIdArgument(const std::string& job_id) {
  return CheckBytes("job_id", job_id, kMaxJobIdBytes);
}

absl::Status CheckNodeIdArgument(const std::string& node_id) {
  return CheckBytes("node_id", node_id, kMaxNodeIdBytes);
}

absl::Status CheckNodeInfo(const NodeInfo& node) {
  RETURN_IF_ERROR(CheckNodeId("node.id", node.id()));
  RETURN_IF_ERROR(CheckBytes("node.address", node.address(), kMaxAddressBytes));
  RETURN_IF_ERROR(CheckBytes("node.metrics_address", node.metrics_address(), kMaxAddressBytes));
  RETURN_IF_ERROR(CheckBytes("node.hostname", node.hostname(), kMaxHostnameBytes));
  RETURN_IF_ERROR(CheckCount("node.devices", node.devices_size(), kMaxDevices));
  for (int i = 0; i < node.devices_size(); ++i) {
    RETURN_IF_ERROR(
        CheckBytes(absl::StrCat("node.devices[", i, "]"), node.devices(i), kMaxDeviceBytes));
  }
  return CheckSize("node", node.ByteSizeLong(), kMaxNodeInfoBytes);
}

absl::Status CheckSubmitJobRequest(const SubmitJobRequest& request) {
  if (!request.job_id().empty()) RETURN_IF_ERROR(ValidateJobId(request.job_id()));
  if (request.has_init_from()) {
    const InitFrom& init = request.init_from();
    RETURN_IF_ERROR(CheckBytes("init_from.job_id", init.job_id(), kMaxJobIdBytes));
    RETURN_IF_ERROR(CheckBytes("init_from.weights_name", init.weights_name(), kMaxPathBytes));
  }
  RETURN_IF_ERROR(CheckBytes("model_file.name", request.model_file().name(), kMaxPathBytes));
  return absl::OkStatus();
}

absl::Status CheckHeartbeatRequest(const HeartbeatRequest& request) {
  RETURN_IF_ERROR(CheckBytes("node_id", request.node_id(), kMaxNodeIdBytes));
  RETURN_IF_ERROR(CheckCount("logs", request.logs_size(), kMaxLogLinesPerHeartbeat));
  RETURN_IF_ERROR(CheckCount("job_steps", request.job_steps_size(), kMaxJobsPerHeartbeat));
  for (const ShardJobSteps& steps : request.job_steps()) {
    RETURN_IF_ERROR(CheckBytes("job_steps.job_id", steps.job_id(), kMaxJobIdBytes));
    RETURN_IF_ERROR(CheckCount("job_steps.worker_steps", steps.worker_steps_size(), kMaxWorkers));
  }
  return CheckCount("checkpoints", request.checkpoints_size(), kMaxCheckpointPartsPerHeartbeat);
}

absl::Status CheckReportProgressRequest(const ReportProgressRequest& request) {
  RETURN_IF_ERROR(CheckBytes("job_id", request.job_id(), kMaxJobIdBytes));
  RETURN_IF_ERROR(CheckBytes("node_id", request.node_id(), kMaxNodeIdBytes));
  RETURN_IF_ERROR(CheckCount("data_files", request.data_files_size(), kMaxDataFiles));
  size_t listed = 0;
  for (int i = 0; i < request.data_files_size(); ++i) {
    RETURN_IF_ERROR(CheckDataPath(absl::StrCat("data_files[", i, "]"), request.data_files(i)));
    listed += request.data_files(i).size();
  }
  RETURN_IF_ERROR(CheckSize("data_files (the names together)", listed, kMaxDataFilesBytes));
  return CheckBytes("checkpoint.state", request.checkpoint().state(), kMaxWorkerStateBytes);
}

}  // namespace control
}  // namespace downpour
