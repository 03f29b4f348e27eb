// Helpers for absl::Status / absl::StatusOr, the error type of every fallible
// function in Downpour (nothing throws), and the marks an error carries as a
// payload (absl::Status::SetPayload) for whoever acts on it. A mark is part
// of the status: it survives Annotate and the gRPC edge (rpc/grpc_status.h),
// and no one has to search the message for words.
//
// Functions only; thread-safe.
#ifndef DOWNPOUR_COMMON_STATUS_H_
#define DOWNPOUR_COMMON_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define DP_STATUS_CONCAT_INNER_(a, b) a##b
#define DP_STATUS_CONCAT_(a, b) DP_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status dp_status_ = (expr);      \
    if (!dp_status_.ok()) return dp_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Fn());` assigns the value of an absl::StatusOr or
// returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  DP_ASSIGN_OR_RETURN_IMPL_(DP_STATUS_CONCAT_(dp_statusor_, __LINE__), lhs, expr)
#define DP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

namespace downpour {

// Prefixes the message of a non-OK status with `context` ("reading x: ..."),
// keeping its code and payloads.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Divergence: training met a non-finite loss (the worker) or gradient (a
// shard), and the job's parameters cannot be trusted from that step on.
// The coordinator treats it apart from other failures (the job fails, or
// rolls back to its newest checkpoint: RestartPolicy.rollback_on_divergence),
// so the error that says so carries this mark, one type URL for the
// project; its message says where and why in words.
inline constexpr absl::string_view kDivergedTypeUrl = "type.downpour/diverged";

// `status` marked as a divergence (an OK status stays OK, unmarked).
absl::Status MarkDiverged(absl::Status status);
// Whether `status` carries the divergence mark.
bool IsDiverged(const absl::Status& status);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_STATUS_H_
