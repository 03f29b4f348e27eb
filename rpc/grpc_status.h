// The one place gRPC status and absl::Status are converted (the edge): the
// code, the message and the payloads (common/status.h's marks, such as a
// divergence), which travel in grpc::Status::error_details
// (proto/status_details.proto). A stream that answers errors in its own
// messages (PushPullStreamResponse) carries the grpc::Status these make.
// Functions only; thread-safe.
#ifndef DOWNPOUR_RPC_GRPC_STATUS_H_
#define DOWNPOUR_RPC_GRPC_STATUS_H_

#include <chrono>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

grpc::Status ToGrpcStatus(const absl::Status& status);
// Error details that do not parse (a peer that fills them otherwise) are
// dropped: the code and message still say what failed.
absl::Status FromGrpcStatus(const grpc::Status& status);

// Sets a deadline `timeout` from now on `context`.
void SetDeadline(grpc::ClientContext* context, std::chrono::milliseconds timeout);

}  // namespace downpour

#endif  // DOWNPOUR_RPC_GRPC_STATUS_H_
