// Helpers for absl::Status / absl::StatusOr, the error type of every fallible
// function in Downpour (nothing throws).
#ifndef DOWNPOUR_COMMON_STATUS_H_
#define DOWNPOUR_COMMON_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// Prefixes the message of a non-OK status with `context` ("reading x: ...").
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_STATUS_H_
