// The coordinator's door: the sizes of spec/limits.h over every request a
// client or a node sends the control plane, checked by CoordinatorState
// before a request touches any state, so the gRPC path and in-process
// callers are held to the same limits. A job spec's own fields are
// ValidateJobSpec's (spec/job_validation.h).
//
// What is refused and what is cut: a request is refused (InvalidArgument,
// one sentence naming the field, its size and the limit) for anything a
// well-behaved sender never sends — an over-long id, more log lines or
// checkpoint parts than a node keeps, a data listing or a checkpoint state
// past its limit. Free text a healthy node may produce — a log line, a
// worker's or a shard's error — is cut to its limit where the coordinator
// takes it in (see CoordinatorState), never refused: a refused heartbeat
// would make the node look dead, a refused error report would hide why its
// job failed.
//
// Thread-safety: pure functions.
#ifndef DOWNPOUR_CONTROL_REQUEST_LIMITS_H_
#define DOWNPOUR_CONTROL_REQUEST_LIMITS_H_

#include <string>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"

namespace downpour {
namespace control {

// A job id naming an existing job (GetJob, StopJob, ...): at most
// kMaxJobIdBytes, so the "no job" answer does not echo a huge string back.
absl::Status CheckJobIdArgument(const std::string& job_id);
// A node id naming a known node (CordonNode).
absl::Status CheckNodeIdArgument(const std::string& node_id);

// RegisterNode: the id, addresses, host name, devices and the whole record
// (it is stored and listed as sent).
absl::Status CheckNodeInfo(const NodeInfo& node);
// SubmitJob's job id (ValidateJobId) and init_from; the spec is
// ValidateJobSpec's.
absl::Status CheckSubmitJobRequest(const SubmitJobRequest& request);
// Heartbeat: the node id and the number of log lines and checkpoint parts
// (their text is cut, not refused).
absl::Status CheckHeartbeatRequest(const HeartbeatRequest& request);
// ReportProgress: the ids, the data listing (count, each name — relative,
// inside the data directory — and the total) and rank 0's checkpoint state
// (the error text is cut, not refused).
absl::Status CheckReportProgressRequest(const ReportProgressRequest& request);

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_REQUEST_LIMITS_H_
